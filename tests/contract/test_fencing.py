"""Fenced writers: a newer session of a writer.id fences every older one, which then lands nothing."""

from __future__ import annotations

import time

import pytest

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import OffsetCommit, Record, Store, open_store, read_range


def test_a_new_epoch_fences_the_old_writer(store: Store) -> None:
    store.create_stream("orders", 2)
    old = store.open_writer("orders-writer")
    old.append("orders", 0, [Record(None, b"old-1")])
    new = store.open_writer("orders-writer")
    assert new.epoch == old.epoch + 1
    for partition in (0, 1):  # also a partition the new writer never wrote to
        with pytest.raises(KafkaException) as info:
            old.append("orders", partition, [Record(None, b"zombie")])
        assert info.value.code == ErrorCode.PRODUCER_FENCED
        assert info.value.error.fatal()
    new.append("orders", 0, [Record(None, b"new-1")])
    assert [m.value() for m in read_range(store, "orders", 0)] == [b"old-1", b"new-1"]
    assert list(read_range(store, "orders", 1)) == []


def test_writers_with_other_ids_are_not_fenced(store: Store) -> None:
    store.create_stream("orders", 1)
    a = store.open_writer("a")
    store.open_writer("b")
    store.open_writer()
    assert a.append("orders", 0, [Record(None, b"a")]).base_offset == 0


def test_fencing_with_cas_the_check_happens_after_the_fence(store: Store) -> None:
    store.create_stream("orders", 1)
    old = store.open_writer("w")
    store.open_writer("w")
    with pytest.raises(KafkaException) as info:
        old.append("orders", 0, [Record(None, b"x")], expected_offset=0)
    assert info.value.code == ErrorCode.PRODUCER_FENCED
    assert store.partition_state("orders", 0).end_offset == 0


def test_a_fenced_writers_atomic_append_of_offsets_alone_commits_nothing(store: Store) -> None:
    store.create_stream("orders", 1)
    old = store.open_writer("w")
    store.open_writer("w")
    with pytest.raises(KafkaException) as info:
        old.append_atomic([], [OffsetCommit("copier", {("orders", 0): 7})])
    assert info.value.code == ErrorCode.PRODUCER_FENCED
    assert store.committed_offsets("copier", [("orders", 0)]) == {}


def test_a_fencing_check_given_a_time_sees_every_fence_made_before_it(store_url: str) -> None:
    """``check_not_fenced(since=t)`` may answer from a look this process made after ``t`` (on Kafka a round trip
    saved: a commit passes when its BEGIN was stored, and a look made while the application produced serves), never
    from an earlier one: a zombie must see a fence made before its BEGIN was stored."""
    mine, theirs = open_store(store_url), open_store(store_url)  # two processes
    try:
        old = mine.open_writer("w")
        old.check_not_fenced()  # a look before the fence
        theirs.open_writer("w")
        fenced_at = time.monotonic()
        with pytest.raises(KafkaException) as info:
            old.check_not_fenced(since=fenced_at)
        assert info.value.code == ErrorCode.PRODUCER_FENCED
    finally:
        mine.close()
        theirs.close()
