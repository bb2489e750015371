"""Atomic appends: batches to several streams and a group's offsets land together, or nothing does."""

from __future__ import annotations

import pytest

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import Batch, OffsetCommit, Record, Store, read_range


@pytest.fixture
def two_streams(store: Store) -> Store:
    store.create_stream("debits", 2)
    store.create_stream("credits", 1)
    return store


def values(store: Store, stream: str, partition: int) -> list[bytes | None]:
    return [m.value() for m in read_range(store, stream, partition)]


def test_batches_and_offsets_land_together(two_streams: Store) -> None:
    writer = two_streams.open_writer()
    results = writer.append_atomic(
        [Batch("debits", 1, [Record(b"k", b"-5"), Record(b"k", b"-7")]), Batch("credits", 0, [Record(b"k", b"+12")])],
        [OffsetCommit("mover", {("debits", 0): 3})],
    )
    assert [(r.base_offset, r.record_count) for r in results] == [(0, 2), (0, 1)]
    assert values(two_streams, "debits", 1) == [b"-5", b"-7"]
    assert values(two_streams, "credits", 0) == [b"+12"]
    assert two_streams.committed_offsets("mover", [("debits", 0)]) == {("debits", 0): 3}


def test_a_conditional_offset_commit_refuses_everything_on_mismatch(two_streams: Store) -> None:
    writer = two_streams.open_writer()
    progress = ("debits", 0)  # the position of a consume-transform-produce loop in its input
    writer.append_atomic([Batch("credits", 0, [Record(None, b"first")])],
                         [OffsetCommit("merger", {progress: 1}, expected={progress: None})])
    with pytest.raises(KafkaException) as info:
        writer.append_atomic([Batch("credits", 0, [Record(None, b"stale")]), Batch("debits", 0, [Record(None, b"x")])],
                             [OffsetCommit("merger", {progress: 2}, expected={progress: None})])
    assert info.value.code == ErrorCode.CAS_MISMATCH
    assert "group 'merger' debits[0]: expected committed offset None, found 1" in str(info.value)
    assert values(two_streams, "credits", 0) == [b"first"]
    assert values(two_streams, "debits", 0) == []
    assert two_streams.committed_offsets("merger", [progress]) == {progress: 1}
    writer.append_atomic([Batch("credits", 0, [Record(None, b"second")])],
                         [OffsetCommit("merger", {progress: 2}, expected={progress: 1})])
    assert values(two_streams, "credits", 0) == [b"first", b"second"]


def test_two_rivals_with_one_expectation_have_one_winner(two_streams: Store) -> None:
    progress = ("debits", 0)  # the position of a consume-transform-produce loop in its input
    a, b = two_streams.open_writer(), two_streams.open_writer()
    outcomes = []
    for writer, value in ((a, b"a"), (b, b"b")):
        try:
            writer.append_atomic([Batch("credits", 0, [Record(None, value)])],
                                 [OffsetCommit("merger", {progress: 7}, expected={progress: None})])
            outcomes.append("won")
        except KafkaException as exc:
            outcomes.append(exc.code.name)
    assert outcomes == ["won", "CAS_MISMATCH"]
    assert values(two_streams, "credits", 0) == [b"a"]


@pytest.mark.parametrize("batches", [[], [Batch("credits", 0, [Record(None, b"1")])] * 2,
                                     [Batch("credits", 0, [])]], ids=["none", "twice", "empty"])
def test_bad_atomic_appends_are_refused_and_write_nothing(two_streams: Store, batches: list[Batch]) -> None:
    with pytest.raises(KafkaException) as info:
        two_streams.open_writer().append_atomic(batches)
    assert info.value.code == ErrorCode.INVALID_RECORD
    assert values(two_streams, "credits", 0) == []


def test_an_atomic_append_to_a_sealed_partition_writes_nothing(two_streams: Store) -> None:
    two_streams.scale_stream("debits", 3)
    with pytest.raises(KafkaException) as info:
        two_streams.open_writer().append_atomic([Batch("credits", 0, [Record(None, b"1")]),
                                                 Batch("debits", 0, [Record(None, b"2")])])
    assert info.value.code == ErrorCode.PARTITION_SEALED
    assert values(two_streams, "credits", 0) == []


def test_a_conditional_batch_lands_only_at_the_expected_end(two_streams: Store) -> None:
    writer = two_streams.open_writer()
    batch = [Batch("credits", 0, [Record(None, b"x")], expected_offset=0), Batch("debits", 0, [Record(None, b"y")])]
    if two_streams.url.startswith("kafka://"):
        with pytest.raises(KafkaException) as info:
            writer.append_atomic(batch)
        assert info.value.code == ErrorCode.INVALID_REQUEST  # Kafka cannot check an end offset in a transaction
        return
    writer.append_atomic(batch)
    with pytest.raises(KafkaException) as info:
        writer.append_atomic(batch)  # the end is 1 now
    assert info.value.code == ErrorCode.CAS_MISMATCH
    assert values(two_streams, "credits", 0) == [b"x"] and values(two_streams, "debits", 0) == [b"y"]


def test_an_atomic_append_carries_as_many_conditions_as_the_store_declares(store: Store) -> None:
    """Callers (a transaction group's one-step commit) choose how to write from the declaration, not by trying."""
    store.create_stream("__onceflow.a", 1)  # onceflow's own streams: on Kafka only their fenced owner writes them
    store.create_stream("__onceflow.b", 1)
    writer = store.open_writer()
    two = [Batch("__onceflow.a", 0, [Record(None, b"a")], expected_offset=0),
           Batch("__onceflow.b", 0, [Record(None, b"b")], expected_offset=0)]
    writer.append_atomic(two[:1])  # one condition: every store
    assert store.atomic_conditions >= 1
    if store.atomic_conditions >= 2:
        writer.append_atomic([two[0]._replace(expected_offset=1), two[1]])
        assert values(store, "__onceflow.b", 0) == [b"b"]
    else:
        with pytest.raises(KafkaException) as info:
            writer.append_atomic([two[0]._replace(expected_offset=1), two[1]])
        assert info.value.code == ErrorCode.INVALID_REQUEST and "one condition" in str(info.value)
        assert values(store, "__onceflow.b", 0) == []
    assert values(store, "__onceflow.a", 0) == ([b"a", b"a"] if store.atomic_conditions >= 2 else [b"a"])
