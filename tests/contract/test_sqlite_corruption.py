"""The embedded store detects a damaged batch on disk and reports it as CORRUPT_MESSAGE."""

from __future__ import annotations

import sqlite3

import pytest

from onceflow.connector import ErrorCode, KafkaException
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
