"""Connect worker throughput: file source -> stream -> file sink, and -> database sink, exactly-once against
at-least-once, same run.

A standalone worker (in this process, on a fresh embedded store) runs a FileStreamSource (``batch.size`` lines per
poll) and a sink: a FileStreamSink (the time until its file holds every line), or a DatabaseSink into SQLite (the
time until its table has every row; values are JSON structs). Baseline: ``exactly.once.source.support=disabled``
(records written as they come, offsets every ``offset.flush.interval.ms``); candidate: the default, each poll's
records and its source offset in one transaction. Both sinks are exactly-once in both runs (they have no other
mode: the file sink commits each batch's offsets in a transaction after fsyncing, the database sink keeps them in
the database's transaction).

    python bench/connect_throughput.py [--records 200000] [--batch 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _report import report, row, timed

from onceflow.connect.app import ConnectWorker

VALUE = 100
_POLL_S = 0.02


def file_sink(directory: Path, records: int, source: Path) -> tuple[dict[str, str], Callable[[], bool]]:
    """A FileStreamSink's config and a check that it wrote every line (the same bytes as the source)."""
    sink = directory / "out.txt"

    def done() -> bool:
        if not sink.exists() or os.path.getsize(sink) < source.stat().st_size:
            return False
        if sink.read_bytes() != source.read_bytes():
            raise SystemExit("the sink's file differs from the source's")
        return True
    return {"connector.class": "FileStreamSink", "file": str(sink)}, done


def database_sink(directory: Path, records: int, source: Path) -> tuple[dict[str, str], Callable[[], bool]]:
    """A DatabaseSink's config (SQLite) and a check that its table has every row, once."""
    database = directory / "target.db"

    def done() -> bool:
        with contextlib.closing(sqlite3.connect(database)) as db:
            try:
                count, distinct = db.execute('SELECT COUNT(*), COUNT(DISTINCT n) FROM "lines"').fetchone()
            except sqlite3.OperationalError:
                return False  # no table yet
        if count != distinct:
            raise SystemExit(f"the database sink wrote {count - distinct} rows twice")
        return bool(count >= records)
    return {"connector.class": "DatabaseSink", "connection.url": f"sqlite://{database}",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false"}, done


Sink = Callable[[Path, int, Path], tuple[dict[str, str], Callable[[], bool]]]


def pipeline(directory: Path, records: int, batch: int, exactly_once: bool, sink: Sink) -> int:
    """Run file -> stream -> sink once; returns the records moved."""
    source = directory / "in.txt"
    padding = "x" * (VALUE - 30)
    source.write_text("".join(f'{{"n": {i}, "pad": "{padding}"}}\n' for i in range(records)))
    props = {"store.url": f"sqlite://{directory / 'store.db'}", "listeners": "http://127.0.0.1:0",
             "exactly.once.source.support": "enabled" if exactly_once else "disabled"}
    sink_config, done = sink(directory, records, source)
    with ConnectWorker(props) as worker:
        worker.add_connector({"name": "src", "connector.class": "FileStreamSource", "file": str(source),
                              "topic": "lines", "batch.size": str(batch)})
        worker.add_connector({"name": "snk", "topics": "lines", **sink_config})
        while not done():
            time.sleep(_POLL_S)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2000, help="the source's batch.size (lines per poll)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating at-least-once/exactly-once rounds")
    args = parser.parse_args()
    rows = []
    for name, sink in (("file sink", file_sink), ("database sink", database_sink)):
        results: dict[bool, list[tuple[int, float]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for exactly_once in (False, True):  # alternating, so that both see the same load
                with tempfile.TemporaryDirectory(prefix="onceflow-bench-connect-") as scratch:
                    run = functools.partial(pipeline, Path(scratch), args.records, args.batch, exactly_once, sink)
                    results[exactly_once].append(timed(run))
        best = {mode: min(runs, key=lambda measured: measured[1]) for mode, runs in results.items()}
        baseline = f"{name}, at-least-once (best of {args.rounds})"
        rows += [row(baseline, *best[False]), row(f"{name}, exactly-once (best of {args.rounds})", *best[True],
                                                  baseline, best[False])]
    report("connect_throughput", rows, {"records": args.records, "batch": args.batch, "value_bytes": VALUE})


if __name__ == "__main__":
    main()
