"""Load run: transactions at a fixed rate for a fixed time, with memory, store size and commit latency sampled.

A transactional Producer commits RATE transactions a second (each staged, so every one goes through the
batched commit log and the merge); every ABANDON-th second a transaction is begun in the same group, written
to and abandoned, as a crashed client would. Each window reports the commit latency p50/p99, the process's
resident memory, the store's size on disk and the open transactions. It reports whether memory and latency
stay flat (last window against the first after warm-up, as ratios) and whether timeouts aborted every
abandoned transaction.

    python bench/load_run.py [--rate 50] [--seconds 60] [--kafka]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from _report import RESULTS, machine
from rich.console import Console
from rich.table import Table
from txn_throughput import store_url

from onceflow import txn
from onceflow.connector import Producer
from onceflow.connector.store import Record, open_store
from onceflow.txn import Outcome

GROUP = "load"
ABANDONED_TIMEOUT_MS = 1_000
WINDOW_S = 5.0
WARM_UP_WINDOWS = 1


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def store_mb(url: str) -> float:
    if not url.startswith("sqlite://"):
        return float("nan")
    path = url.removeprefix("sqlite://")
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)) / 2**20


def run(url: str, rate: float, seconds: float, abandon_every: int, records: int) -> dict[str, Any]:
    store = open_store(url)
    store.create_stream("load", 4)
    store.close()
    conf = {"store.url": url, "transaction.group": GROUP}
    producer = Producer({**conf, "transactional.id": "load-app"})
    producer.init_transactions()
    group = txn.open_group(conf)
    abandoned: list[tuple[str, float]] = []
    windows: list[dict[str, Any]] = []
    latencies: list[float] = []
    behind = 0
    started = time.monotonic()
    window_end = started + WINDOW_S
    for n in range(int(rate * seconds)):
        due = started + n / rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        elif now - due > 1 / rate:
            behind += 1
        begun = time.perf_counter()
        producer.begin_transaction()
        for i in range(records):
            producer.produce("load", b"v" * 100, key=b"%d" % ((n + i) % 64))
        producer.flush()
        producer.commit_transaction()
        latencies.append((time.perf_counter() - begun) * 1000)
        if n % abandon_every == 0:
            txn_id = group.begin(ABANDONED_TIMEOUT_MS)
            writer = group.writer(txn_id, "crashed-client", known_open=True)
            writer.produce("load", Record(b"k", b"never published"))
            writer.flush()
            abandoned.append((txn_id, time.monotonic()))
        if time.monotonic() >= window_end:
            windows.append(_window(len(windows), latencies, url, group))
            latencies, window_end = [], window_end + WINDOW_S
    time.sleep(2 * ABANDONED_TIMEOUT_MS / 1000)
    group.expire()
    old_enough = [t for t, at in abandoned if time.monotonic() - at > ABANDONED_TIMEOUT_MS / 1000]
    still_open = [t for t in old_enough if group.outcome(t) is Outcome.OPEN]
    producer.close()
    group.close()
    return {"windows": windows, "abandoned": len(abandoned), "abandoned_still_open": len(still_open),
            "fell_behind": behind}


def _window(index: int, latencies: list[float], url: str, group: txn.TransactionGroup) -> dict[str, Any]:
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [latencies[0]] * 99
    return {"t_s": round((index + 1) * WINDOW_S), "commits": len(latencies), "p50_ms": round(cuts[49], 2),
            "p99_ms": round(cuts[98], 2), "rss_mb": round(rss_mb(), 1), "store_mb": round(store_mb(url), 2),
            "open_txns": len(group.open_transactions())}


def show(result: dict[str, Any], params: dict[str, Any]) -> None:
    windows = result["windows"]
    table = Table(title=f"load run ({', '.join(f'{k}={v}' for k, v in params.items())})")
    for column in windows[0]:
        table.add_column(column, justify="right")
    for w in windows:
        table.add_row(*(str(v) for v in w.values()))
    console = Console()
    console.print(table)
    first, last = windows[min(WARM_UP_WINDOWS, len(windows) - 1)], windows[-1]
    result["rss_ratio"] = last["rss_mb"] / first["rss_mb"]
    result["p99_ratio"] = last["p99_ms"] / first["p99_ms"]
    result["store_ratio"] = last["store_mb"] / first["store_mb"] if first["store_mb"] else float("nan")
    console.print(f"memory last/first window {result['rss_ratio']:.2f}, store size {result['store_ratio']:.2f}, "
                  f"commit p99 {result['p99_ratio']:.2f}; {result['abandoned']} abandoned transactions, "
                  f"{result['abandoned_still_open']} of them still open after their timeout; "
                  f"{result['fell_behind']} commits started late")
    RESULTS.mkdir(exist_ok=True)
    path = Path(RESULTS / "load_run.json")
    path.write_text(json.dumps({"benchmark": "load_run", "params": params, "machine": machine(),
                                              "results": result}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0, help="transactions per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--records", type=int, default=10, help="records per transaction")
    parser.add_argument("--abandon-every", type=int, default=50, help="abandon one transaction per N commits")
    parser.add_argument("--kafka", action="store_true", help="on the integration broker instead of SQLite")
    args = parser.parse_args()
    with store_url(args) as url:
        outcome = run(url, args.rate, args.seconds, args.abandon_every, args.records)
    show(outcome, {"rate": args.rate, "seconds": args.seconds, "records": args.records,
                   "abandon_every": args.abandon_every, "backend": "kafka" if args.kafka else "sqlite"})
