"""Embedded-store throughput: onceflow's batched appends and reads against plain SQLite, same run, same disk.

Baseline: one SQLite row per record (WAL, synchronous=FULL like the store's default), 1000 rows per
transaction. Candidates: the store contract (a batch of 1000 per append), the Producer/Consumer clients, and
CAS appends (one record per append, each conditioned on the end offset).

    python bench/store_throughput.py [--records 300000] [--cas 3000]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from pathlib import Path

from _report import report, row, timed

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--cas", type=int, default=3_000)
    args = parser.parse_args()
    values = [os.urandom(VALUE) for _ in range(args.records)]
    keys = [b"key-%d" % (i % 1000) for i in range(args.records)]
    records = [Record(k, v, None, 1_700_000_000_000) for k, v in zip(keys, values, strict=True)]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite://{Path(tmp) / 'store.db'}"
        store = open_store(url)
        for name, partitions in (("bench", 1), ("client", 4), ("cas", 1), ("single", 1)):
            store.create_stream(name, partitions)
        raw_write = timed(lambda: raw_sqlite_write(Path(tmp) / "raw.db", values, keys))
        raw_read = timed(lambda: raw_sqlite_read(Path(tmp) / "raw.db"))
        plain_single = timed(lambda: plain_single_appends(url, args.cas))
        rows = [
            row("store append (batches of 1000)", *timed(lambda: store_append(url, records)),
                "sqlite row per record", raw_write),
            row("store read", *timed(lambda: store_read(url)), "sqlite row per record", raw_read),
            row("Producer.produce + flush", *timed(lambda: producer_write(url, values, keys)),
                "sqlite row per record", raw_write),
            row("Consumer.consume", *timed(lambda: consumer_read(url, args.records)), "sqlite row per record",
                raw_read),
            row("CAS append, 1 record each", *timed(lambda: cas_appends(url, args.cas)),
                "plain append, 1 record each", plain_single),
        ]
    report("store_throughput", rows, {"records": args.records, "value_bytes": VALUE, "batch": BATCH,
                                      "cas_appends": args.cas})


if __name__ == "__main__":
    main()
