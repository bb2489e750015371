"""What the embedded store keeps of writers that are gone: a store that runs for months opens a writer per
Producer, per Spark task, per CLI call; none may leave state behind once closed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from onceflow.connector import Producer
from onceflow.connector.store import Record, open_store, read_stream


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path) as db:
        count: int = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return count


def test_closed_writers_leave_no_producer_state_and_fenced_ones_keep_their_epoch(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = open_store(f"sqlite://{path}")
    store.create_stream("events", 3)
    for session in range(20):  # short-lived sessions, as Spark tasks are
        writer = store.open_writer()
        for partition in range(3):
            writer.append("events", partition, [Record(None, b"%d" % session)])
        writer.close()
        writer.close()  # closing again does nothing
    assert rows(path, "producer_state") == 0
    assert rows(path, "producers") == 0
    fenced = store.open_writer("orders-app")
    fenced.append("events", 0, [Record(None, b"fenced")])
    fenced.close()
    again = store.open_writer("orders-app")  # a writer.id's epoch outlives its sessions: zombies stay fenced
    assert again.epoch == fenced.epoch + 1
    assert len(list(read_stream(store, "events"))) == 61
    store.close()


def test_a_producer_closed_leaves_no_producer_state(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    open_store(f"sqlite://{path}").create_stream("t", 2)
    for _ in range(5):
        producer = Producer({"store.url": f"sqlite://{path}"})
        for i in range(10):
            producer.produce("t", b"%d" % i, partition=i % 2)
        producer.flush()
        producer.close()
    assert rows(path, "producer_state") == 0
