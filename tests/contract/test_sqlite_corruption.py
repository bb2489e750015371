"""The embedded store detects a damaged batch on disk and reports it as CORRUPT_MESSAGE."""

from __future__ import annotations

import sqlite3

import pytest

from onceflow.connector import ErrorCode, KafkaError, KafkaException, Producer
from onceflow.connector.store import Record, open_store


def test_a_damaged_stored_batch_is_reported_as_corrupt(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "store.db"
    store = open_store(f"sqlite://{path}")
    store.create_stream("t", 1)
    store.open_writer().append("t", 0, [Record(b"k", b"value-%d" % i) for i in range(10)])
    with sqlite3.connect(path) as db:  # flip one byte of the stored value bytes, as a bad disk would
        (blob,) = db.execute("SELECT data FROM batches").fetchone()
        damaged = bytearray(blob)
        damaged[-3] ^= 0xFF
        db.execute("UPDATE batches SET data = ?", (bytes(damaged),))
    with pytest.raises(KafkaException) as info:
        store.read("t", 0, 0, 100)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    assert "t[0] batch at offset 0: checksum mismatch" in str(info.value)


def test_a_full_disk_is_reported_as_such_and_the_store_stays_usable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite rolls a transaction back itself when the disk is full; the store's own ROLLBACK then fails, and
    must not hide the cause. A page limit on the store's connection stands in for the full disk."""
    store = open_store(f"sqlite://{tmp_path / 'store.db'}")
    store.create_stream("t", 1)
    writer = store.open_writer()
    writer.append("t", 0, [Record(b"k", b"small")])
    pages = store._db().execute("PRAGMA page_count").fetchone()[0]  # type: ignore[attr-defined]
    store._db().execute(f"PRAGMA max_page_count = {pages + 2}")  # type: ignore[attr-defined]
    with pytest.raises(KafkaException) as info:
        writer.append("t", 0, [Record(b"k", bytes(4000)) for _ in range(50)])
    assert "database or disk is full" in str(info.value)
    writer.append("t", 0, [Record(b"k", b"after")])  # nothing half-written: the next append lands after it
    assert [m.value() for m in store.read("t", 0, 0, 100)] == [b"small", b"after"]
    store.close()


def test_a_flush_sqlite_undid_part_way_reports_delivered_only_what_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One flush writes its partitions' batches in one transaction. A full disk on the second made SQLite undo
    the whole transaction, the first batch too; the third was written in a new one, and the first was reported
    delivered, at an offset the next record then took."""
    url = f"sqlite://{tmp_path / 'store.db'}"
    open_store(url).create_stream("t", 3)
    producer = Producer({"store.url": url, "linger.ms": 60_000, "delivery.timeout.ms": 1000})
    producer.produce("t", b"before", partition=0)
    producer.flush()
    db = producer._store._db()  # type: ignore[attr-defined]
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0] + 2}")
    reports: dict[int, KafkaError | None] = {}
    for partition, value in ((0, b"a"), (1, bytes(200_000)), (2, b"c")):
        producer.produce("t", value, partition=partition,
                         on_delivery=lambda err, msg: reports.__setitem__(msg.partition(), err))
    producer.flush()
    assert reports[1] is not None and reports[0] is None and reports[2] is None
    store = open_store(url)
    assert [m.value() for m in store.read("t", 0, 0, 10)] == [b"before", b"a"]
    assert [m.value() for m in store.read("t", 2, 0, 10)] == [b"c"]
    producer.close()
