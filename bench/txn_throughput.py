"""Transactions: committed-transaction throughput, the batched commit log, and commit latency, same run.

(a) records/s of transactions of 10, 100 and 1000 records (Producer with transactional.id: begin, produce,
    commit), with commit latency p50/p99; the anchor on Kafka is native confluent-kafka transactions on the same
    broker (a confluent_kafka.Producer with transactional.id, same sizes, rounds alternating with onceflow's so
    both see the same load), on SQLite the same records produced without a transaction (one flush per group).
    On Kafka also 10-record transactions that wait 2 ms for their input after begin_transaction, on both sides
    (as a consume-transform-produce loop does): a tight loop leaves no time for what onceflow does meanwhile;
(b) commit-log operations/s through the batched writer (PIP-160) with batching on against off, with 1, 64 and
    512 transactions' control records in flight at once;
(c) commit latency p50/p99 of 100-record transactions: unstaged (the embedded store commits them in one step),
    and staged with the commit log's batching on and off.

(d) with --only d: 10-record transactions/s of 8 and 64 Producers (threads) committing at once against one, in
    rounds that each measure one, then 8, then 64 (best round of each; the per-round ratios' min/median/max).

(e) with --only e: a consume-transform-produce loop's 10-record transactions whose offsets go with the member's
    group metadata (checked against zombie members: the embedded store's one step checks the member, on Kafka
    the transaction claims its partitions and looks the member up before its COMMIT) against the same loop
    sending them without a member (unchecked), in alternating rounds of ``--txns`` transactions (best of each).

    python bench/txn_throughput.py [--records 100000] [--kafka [--txns 100]] [--only a|d|e [--producers 8 64]]

On Kafka the broker is integration/brokers.py's: Apache Kafka (a local KRaft process) where Java and Maven are.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import confluent_kafka as ck
from _report import Rounds, best_of_rounds, print_medians, report, row, timed
from confluent_kafka.admin import AdminClient

from onceflow.connector import Consumer, ConsumerGroupMetadata, Producer
from onceflow.connector.config import TransactionConfig
from onceflow.connector.store import open_store
from onceflow.connector.store.kafka.clients import ensure_topic
from onceflow.integration.brokers import kafka_broker
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import BatchedLogWriter, Position

VALUE = b"v" * 100


def make_producer(url: str, size: int, transactional: bool) -> Producer:
    """A producer ready to write (opening the store and init_transactions are not what is measured). The plain
    one writes one batch per flush; the transactional one keeps a transaction in memory up to its defaults
    (10,000 records, 1 MB) and so commits it in one step where the store can."""
    conf: dict[str, Any] = {"store.url": url, "linger.ms": 1000}
    if transactional:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    else:
        conf["batch.num.messages"] = max(size, 1)
    producer = Producer(conf)
    if transactional:
        producer.init_transactions()
    return producer


def produce_groups(producer: Producer, topic: str, records: int, size: int, transactional: bool) -> int:
    """Produce ``records`` records in groups of ``size``: a transaction each, or a flush each."""
    for _ in range(0, records, size):
        if transactional:
            producer.begin_transaction()
        for _ in range(size):
            producer.produce(topic, VALUE, partition=0)
        if transactional:
            producer.commit_transaction()
        else:
            producer.flush()
    return records


def commit_log_ops(url: str, concurrent: int, batching: bool, seconds: float) -> tuple[int, float]:
    """Control records stored per second while ``concurrent`` of them are always in flight (each one a
    transaction waiting for its BEGIN/COMMIT/ABORT to be stored)."""
    store = open_store(url)
    stream = f"log-{uuid.uuid4().hex[:8]}"
    store.create_stream(stream, 1)
    writer = BatchedLogWriter(store.open_writer(), stream,
                              TransactionConfig(group=f"bench-{concurrent}", log_batching=batching))
    record = TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timeout_ms=60_000, timestamp_ms=1)
    in_flight: deque[Future[Position]] = deque()
    done = 0
    started = time.perf_counter()
    stop = started + seconds
    while time.perf_counter() < stop:
        while len(in_flight) < concurrent:
            in_flight.append(writer.submit(record))
        in_flight.popleft().result()
        done += 1
    for future in in_flight:
        future.result()
    elapsed = time.perf_counter() - started
    writer.close()
    return done + len(in_flight), elapsed


def commit_latencies(url: str, topic: str, commits: int, batching: bool, staged: bool) -> list[float]:
    producer = Producer({"store.url": url, "transactional.id": f"lat-{uuid.uuid4().hex[:8]}",
                         "transaction.log.batching": batching, "linger.ms": 1000})
    producer.init_transactions()
    latencies = []
    for _ in range(commits):
        producer.begin_transaction()
        for _ in range(100):
            producer.produce(topic, VALUE, partition=0)
        if staged:
            producer.flush()  # staged: BEGIN, staging, then COMMIT through the batched log and the merge
        started = time.perf_counter()
        producer.commit_transaction()
        latencies.append(time.perf_counter() - started)
    producer.close()
    return latencies


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


class Transactional(Protocol):
    """What confluent_kafka.Producer and onceflow's Producer share for transactions."""

    def begin_transaction(self) -> None: ...

    def produce(self, topic: str, value: bytes, *, partition: int) -> None: ...

    def commit_transaction(self) -> None: ...


def transactions(producer: Transactional, topic: str, count: int, size: int,
                 input_wait_s: float = 0.0) -> tuple[float, list[float]]:
    """``count`` transactions of ``size`` records, each waiting ``input_wait_s`` for its input after it began:
    (seconds in all, each commit_transaction's seconds)."""
    latencies = []
    started = time.perf_counter()
    for _ in range(count):
        producer.begin_transaction()
        if input_wait_s:
            time.sleep(input_wait_s)
        for _ in range(size):
            producer.produce(topic, VALUE, partition=0)
        committing = time.perf_counter()
        producer.commit_transaction()
        latencies.append(time.perf_counter() - committing)
    return time.perf_counter() - started, latencies


def versus_native(url: str, cases: tuple[tuple[int, float], ...], txns: int, rounds: int) -> list[dict[str, Any]]:
    """(a) on Kafka: onceflow transactions (size, input wait in s) against native confluent-kafka transactions on
    the same broker, in alternating rounds (the machine's load changes over a run; each side sees the same)."""
    bootstrap, _, namespace = url.removeprefix("kafka://").partition("/")
    store = open_store(url)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    rows = []
    for size, input_wait_s in cases:
        name = f"{size}-{int(input_wait_s * 1000)}ms"
        native_topic = f"{namespace}.native-{name}"
        ensure_topic(admin, native_topic, 1)
        store.create_stream(f"txn-{name}", 1)
        native = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"native-{uuid.uuid4().hex[:8]}"})
        native.init_transactions(30)
        ours = make_producer(url, size, True)
        sides: dict[str, tuple[Transactional, str]] = {"native": (native, native_topic),
                                                       "onceflow": (ours, f"txn-{name}")}
        seconds = {side: 0.0 for side in sides}
        latencies: dict[str, list[float]] = {side: [] for side in sides}
        for producer, topic in sides.values():
            transactions(producer, topic, 2, size)  # warm up: connections, metadata, the group's streams
        for _ in range(rounds):
            for side, (producer, topic) in sides.items():
                took, lat = transactions(producer, topic, max(1, txns // rounds), size, input_wait_s)
                seconds[side] += took
                latencies[side] += lat
        ours.close()
        native.flush(30)
        count = len(latencies["onceflow"]) * size
        waited = f", {input_wait_s * 1000:g} ms input wait" if input_wait_s else ""
        out = row(f"(a) transactions of {size} records{waited}", count, seconds["onceflow"],
                  "native confluent-kafka transactions", (count, seconds["native"]))
        for side, prefix in (("onceflow", ""), ("native", "baseline_")):
            out[f"{prefix}txn_per_s"] = len(latencies[side]) / seconds[side]
            out[f"{prefix}commit_p50_ms"] = percentile(latencies[side], 50) * 1000
            out[f"{prefix}commit_p99_ms"] = percentile(latencies[side], 99) * 1000
        rows.append(out)
    return rows


MIN_TXNS_PER_ROUND = 200  # 25 transactions of 1000 records made a 50 ms round: ratios swung 0.78-0.95 between runs


def versus_plain(url: str, records: int, rounds: int) -> list[dict[str, Any]]:
    """(a) on SQLite: transactions against the same records produced without a transaction, in alternating
    rounds (so both see the same load); each side's best round. A round holds ``records / rounds`` records, and at
    least :data:`MIN_TXNS_PER_ROUND` transactions (or flushes) of each size."""
    store = open_store(url)
    rows = []
    for size in (10, 100, 1000):
        for name in (f"plain-{size}", f"txn-{size}"):
            store.create_stream(name, 1)
        plain, transactional = make_producer(url, size, False), make_producer(url, size, True)
        per_round = max(records // rounds // size, MIN_TXNS_PER_ROUND) * size
        baseline, candidate = [], []
        for _ in range(rounds):
            baseline.append(timed(lambda: produce_groups(plain, f"plain-{size}", per_round, size, False)))  # noqa: B023
            candidate.append(timed(lambda: produce_groups(transactional, f"txn-{size}", per_round, size,  # noqa: B023
                                                          True)))
        plain.close()
        transactional.close()
        rows.append(row(f"(a) transactions of {size} records (best of {rounds} rounds)", *min(candidate, key=_took),
                        f"plain produce, flush per {size}", min(baseline, key=_took)))
    return rows


def _took(measured: tuple[int, float]) -> float:
    return measured[1]


def concurrent_producers(url: str, producers: int, seconds: float) -> tuple[int, float]:
    """(d) ``producers`` Producers (a thread and a transactional.id each, one transaction group) committing
    10-record transactions at once for ``seconds``: (transactions committed, seconds taken)."""
    made = [make_producer(url, 10, True) for _ in range(producers)]
    committed = [0] * producers

    def commit(index: int) -> None:
        made[index].begin_transaction()
        for _ in range(10):
            made[index].produce("concurrent", VALUE, partition=index % 4)
        made[index].commit_transaction()

    for index in range(producers):  # off the clock: fenced, and the group's first merge done (its owners taken:
        commit(index)              # on Apache Kafka a new transactional.id's first transaction takes seconds)
    stop = time.monotonic() + seconds

    def commit_until_stop(index: int) -> None:
        while time.monotonic() < stop:
            commit(index)
            committed[index] += 1

    threads = [threading.Thread(target=commit_until_stop, args=(i,)) for i in range(producers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - started
    for producer in made:
        producer.close()
    return sum(committed), took


def scaling(url: str, counts: tuple[int, ...], seconds: float, rounds: int) -> list[dict[str, Any]]:
    """(d) transactions/s of many producers committing at once against one producer's, best of ``rounds``; each
    round measures one producer, then each count (a single run of one producer swung 77-139 transactions/s
    between runs, and decided the ratio)."""
    open_store(url).create_stream("concurrent", 4)
    concurrent_producers(url, 1, seconds)  # a first run off the record: the group's topics, owners and clients
    measured: Rounds = [{"1": concurrent_producers(url, 1, seconds),
                         **{str(n): concurrent_producers(url, n, seconds) for n in counts}} for _ in range(rounds)]
    return best_of_rounds(measured, [(f"(d) 10-record transactions, {n} producers at once", str(n), "one producer",
                                      "1") for n in counts])


def member_checks(url: str, txns: int, rounds: int) -> list[dict[str, Any]]:
    """(e) 10-record consume-transform-produce transactions, offsets sent with the member's metadata against
    without a member, alternating rounds of ``txns`` transactions; each side's best round."""
    store = open_store(url)
    for name in ("loop-in", "loop-out"):
        store.create_stream(name, 1)
    filler = Producer({"store.url": url})
    for _ in range((2 * rounds + 1) * txns * 10):
        filler.produce("loop-in", VALUE, partition=0)
    filler.flush()
    filler.close()
    consumer = Consumer({"store.url": url, "group.id": "loop", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["loop-in"])
    producer = make_producer(url, 10, True)

    def loop(count: int, checked: bool) -> int:
        for _ in range(count):
            consumed: list[Any] = []
            while len(consumed) < 10:
                consumed += consumer.consume(10 - len(consumed), timeout=1)
            producer.begin_transaction()
            for message in consumed:
                producer.produce("loop-out", message.value(), partition=0)
            metadata = consumer.consumer_group_metadata() if checked else ConsumerGroupMetadata("loop")
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), metadata)
            producer.commit_transaction()
        return count * 10

    loop(txns, checked=True)  # off the clock: the group joined, its partition assigned, the claims' first look
    checked, unchecked = [], []
    for _ in range(rounds):
        unchecked.append(timed(lambda: loop(txns, checked=False)))
        checked.append(timed(lambda: loop(txns, checked=True)))
    producer.close()
    consumer.close()
    return [row(f"(e) consume-transform-produce, 10-record transactions, member-checked (best of {rounds} rounds)",
                *min(checked, key=_took), "the same without a member (unchecked)", min(unchecked, key=_took))]


def run(url: str, args: argparse.Namespace) -> None:
    kafka = url.startswith("kafka")
    if args.only == "e":
        rows = member_checks(url, args.txns, args.rounds)
        report("txn_member_checks" + ("_kafka" if kafka else ""), rows, {"txns": args.txns, "rounds": args.rounds,
               "store": url.split("://")[0], "broker": getattr(args, "broker", None)})
        return
    if args.only == "d":
        rows = scaling(url, tuple(args.producers), args.seconds, args.rounds)
        report("txn_scaling" + ("_kafka" if kafka else ""), rows, {"seconds": args.seconds, "rounds": args.rounds,
               "store": url.split("://")[0], "broker": getattr(args, "broker", None)})
        print_medians(rows, args.rounds)
        return
    if kafka:
        rows = versus_native(url, ((1000, 0.0), (10, 0.0), (10, 0.002)), args.txns, args.rounds)
    else:
        rows = versus_plain(url, args.records, args.rounds)
    if args.only != "a":
        for concurrent in (1, 64, 512):
            off = commit_log_ops(url, concurrent, False, args.seconds)
            on = commit_log_ops(url, concurrent, True, args.seconds)
            rows.append(row(f"(b) commit-log ops, {concurrent} concurrent", *on, "batching off", off))
        open_store(url).create_stream("latency", 1)
        for staged, batching in ((False, True), (True, True), (True, False)):
            lat = commit_latencies(url, "latency", args.commits, batching, staged)
            path = f"staged, log batching {'on' if batching else 'off'}" if staged else "unstaged (one step if it can)"
            rows.append({"measure": f"(c) commit latency, {path}",
                         "records": len(lat), "seconds": sum(lat), "records_per_s": len(lat) / sum(lat),
                         "commit_p50_ms": percentile(lat, 50) * 1000, "commit_p99_ms": percentile(lat, 99) * 1000})
    params = {"records": args.records, "value_bytes": len(VALUE), "store": url.split("://")[0]}
    if kafka:
        params.update(txns=args.txns, rounds=args.rounds, broker=args.broker)
    report("txn_throughput" + ("_kafka" if kafka else ""), rows, params)
    for r in rows:
        if "baseline_commit_p50_ms" in r:
            print(f"{r['measure']}: {r['txn_per_s']:,.1f} txn/s vs native {r['baseline_txn_per_s']:,.1f} "
                  f"(ratio {r['ratio']:.3f}); commit p50 {r['commit_p50_ms']:.1f} ms vs "
                  f"{r['baseline_commit_p50_ms']:.1f} ({r['commit_p50_ms'] / r['baseline_commit_p50_ms']:.1f}x), "
                  f"p99 {r['commit_p99_ms']:.1f} ms vs {r['baseline_commit_p99_ms']:.1f}")
        elif "commit_p50_ms" in r:
            print(f"{r['measure']}: p50 {r['commit_p50_ms']:.2f} ms, p99 {r['commit_p99_ms']:.2f} ms over "
                  f"{r['records']} commits")


@contextlib.contextmanager
def store_url(args: argparse.Namespace) -> Iterator[str]:
    if args.kafka:
        with kafka_broker() as broker:
            args.broker = broker.describe()
            print(f"broker: {args.broker}")
            yield f"kafka://{broker.bootstrap}/bench{uuid.uuid4().hex[:6]}"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite://{tmp}/bench.db"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=2.0, help="per commit-log measurement")
    parser.add_argument("--commits", type=int, default=300, help="for the latency measurement")
    parser.add_argument("--kafka", action="store_true", help="on the integration broker instead of SQLite")
    parser.add_argument("--txns", type=int, default=100, help="Kafka: transactions per size and side in (a)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating baseline/onceflow rounds in (a) and (d)")
    parser.add_argument("--only", choices=("a", "d", "e"), help="only (a): the transactions against their anchor; "
                        "only (d): many producers committing at once against one; only (e): member-checked offsets "
                        "against unchecked")
    parser.add_argument("--producers", type=int, nargs="+", default=[8, 64], help="(d): producers at once")
    args = parser.parse_args()
    with store_url(args) as url:
        run(url, args)
