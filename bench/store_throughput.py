"""Embedded-store throughput: onceflow's batched appends and reads against plain SQLite, same run, same disk.

Baseline: one SQLite row per record (WAL, synchronous=FULL like the store's default), 1000 rows per
transaction. Candidates: the store contract (a batch of 1000 per append), the Producer/Consumer clients, and
CAS appends (one record per append, each conditioned on the end offset).

Every measure runs ``--rounds`` times, each round in fresh databases with baselines and candidates alternating,
so that both see the same load (the machine may be shared). The table shows the best round of each; the median
ratio over the rounds is printed under it and written with the results.

    python bench/store_throughput.py [--records 300000] [--cas 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

from _report import best_of_rounds, print_medians, report, timed

from onceflow.connector import Consumer, Producer, TopicPartition
from onceflow.connector.store import Record, open_store

BATCH = 1000
VALUE = 100


def raw_sqlite_write(path: Path, values: list[bytes], keys: list[bytes]) -> int:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, partition INTEGER, offset INTEGER, key BLOB, "
               "value BLOB)")
    for start in range(0, len(values), BATCH):
        db.execute("BEGIN IMMEDIATE")
        rows = [(start + i, keys[start + i], values[start + i]) for i in range(min(BATCH, len(values) - start))]
        db.executemany("INSERT INTO records (partition, offset, key, value) VALUES (0, ?, ?, ?)", rows)
        db.execute("COMMIT")
    db.close()
    return len(values)


def raw_sqlite_read(path: Path) -> int:
    db = sqlite3.connect(path)
    count = 0
    for start in range(0, 10**12, 10_000):
        rows = db.execute("SELECT offset, key, value FROM records WHERE partition = 0 AND offset >= ? "
                          "ORDER BY offset LIMIT 10000", (start,)).fetchall()
        if not rows:
            break
        count += len(rows)
    db.close()
    return count


def store_append(url: str, records: list[Record]) -> int:
    writer = open_store(url).open_writer()
    for start in range(0, len(records), BATCH):
        writer.append("bench", 0, records[start : start + BATCH])
    return len(records)


def store_read(url: str) -> int:
    store = open_store(url)
    offset = 0
    while batch := store.read("bench", 0, offset, 10_000):
        offset = batch[-1].offset() + 1  # type: ignore[operator]
    return offset


def producer_write(url: str, values: list[bytes], keys: list[bytes]) -> int:
    producer = Producer({"store.url": url, "batch.num.messages": BATCH, "linger.ms": 100})
    produce = producer.produce
    for key, value in zip(keys, values, strict=True):
        produce("client", value, key)
    producer.flush()
    return len(values)


def consumer_read(url: str, expected: int) -> int:
    consumer = Consumer({"store.url": url, "group.id": "bench-reader", "enable.auto.commit": False})
    partitions = consumer.list_topics("client").topics["client"].partitions
    consumer.assign([TopicPartition("client", p, 0) for p in partitions])
    count = 0
    while count < expected:
        count += len(consumer.consume(10_000, timeout=5))
    consumer.close()
    return count


def cas_appends(url: str, count: int) -> int:
    writer = open_store(url).open_writer()
    for offset in range(count):
        writer.append("cas", 0, [Record(None, b"x" * VALUE)], expected_offset=offset)
    return count


def plain_single_appends(url: str, count: int) -> int:
    writer = open_store(url).open_writer()
    for _ in range(count):
        writer.append("single", 0, [Record(None, b"x" * VALUE)])
    return count


Measures = dict[str, Callable[[], int]]


def one_round(tmp: Path, args: argparse.Namespace, values: list[bytes], keys: list[bytes],
              records: list[Record]) -> dict[str, tuple[int, float]]:
    """(records, seconds) of every measure, in fresh databases under ``tmp``, baselines and candidates in turn."""
    url = f"sqlite://{tmp / 'store.db'}"
    store = open_store(url)
    for name, partitions in (("bench", 1), ("client", 4), ("cas", 1), ("single", 1)):
        store.create_stream(name, partitions)
    measures: Measures = {
        "sqlite write": lambda: raw_sqlite_write(tmp / "raw.db", values, keys),
        "store append": lambda: store_append(url, records),
        "sqlite read": lambda: raw_sqlite_read(tmp / "raw.db"),
        "store read": lambda: store_read(url),
        "producer": lambda: producer_write(url, values, keys),
        "consumer": lambda: consumer_read(url, args.records),
        "plain single": lambda: plain_single_appends(url, args.cas),
        "cas": lambda: cas_appends(url, args.cas),
    }
    return {name: timed(measure) for name, measure in measures.items()}


ROWS = [  # (label, measure, baseline label, baseline measure)
    ("store append (batches of 1000)", "store append", "sqlite row per record", "sqlite write"),
    ("store read", "store read", "sqlite row per record", "sqlite read"),
    ("Producer.produce + flush", "producer", "sqlite row per record", "sqlite write"),
    ("Consumer.consume", "consumer", "sqlite row per record", "sqlite read"),
    ("CAS append, 1 record each", "cas", "plain append, 1 record each", "plain single"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--cas", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    values = [os.urandom(VALUE) for _ in range(args.records)]
    keys = [b"key-%d" % (i % 1000) for i in range(args.records)]
    records = [Record(k, v, None, 1_700_000_000_000) for k, v in zip(keys, values, strict=True)]
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp), args, values, keys, records))
    rows = best_of_rounds(rounds, ROWS)
    report("store_throughput", rows, {"records": args.records, "value_bytes": VALUE, "batch": BATCH,
                                      "cas_appends": args.cas, "rounds": args.rounds})
    print_medians(rows, args.rounds)

if __name__ == "__main__":
    main()
