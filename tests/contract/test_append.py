"""Appends and reads: dense offsets, CAS by offset and by sequence, and bad input that changes nothing."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import NO_SEQUENCE, Batch, Record, Store, open_store, read_range
from tests.conftest import ABORTS_VISIBLE_ON_TANSU, run_worker, skip_on_tansu


@pytest.fixture
def orders(store: Store) -> Store:
    store.create_stream("orders", 2)
    return store


def values(store: Store, partition: int = 0, offset: int = 0) -> list[bytes | None]:
    return [m.value() for m in read_range(store, "orders", partition, offset)]


def refused(fn, *args, **kwargs) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as info:
        fn(*args, **kwargs)
    return info.value.code


def test_batches_get_dense_offsets_and_read_back_exactly(orders: Store) -> None:
    writer = orders.open_writer()
    first = writer.append("orders", 0, [Record(b"a", b"1", [("h", b"x")], 5), Record(None, None)])
    second = writer.append("orders", 0, [Record(b"b", b"2")])
    assert (first.base_offset, first.last_offset, second.base_offset) == (0, 1, 2)
    messages = list(read_range(orders, "orders", 0))
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in messages] == [
        (0, b"a", b"1", [("h", b"x")]), (1, None, None, None), (2, b"b", b"2", None)]
    assert messages[0].timestamp()[1] == 5
    assert values(orders, 0, 1) == [None, b"2"]
    assert orders.partition_state("orders", 0).end_offset == 3
    assert orders.partition_state("orders", 1).end_offset == 0


def test_a_closed_writer_refuses_appends_and_answers_none_as_landed(orders: Store) -> None:
    """A thread still appending through a writer another thread closed (a server shutting down): refused, typed.
    On the embedded store such appends went on as producer 0, whose sequence numbers every closed writer shares,
    and the second closed writer's append was answered "duplicate" (landed) with nothing written."""
    closed = [orders.open_writer() for _ in range(2)]
    for writer in closed:
        writer.append("orders", 0, [Record(None, b"before close")])
        writer.close()
    for writer in closed:
        assert refused(writer.append, "orders", 0, [Record(None, b"after close")]) == ErrorCode._STATE
        assert refused(writer.append_atomic, [Batch("orders", 1, [Record(None, b"after close")])]) == ErrorCode._STATE
    assert values(orders) == [b"before close"] * 2 and values(orders, 1) == []


def test_cas_by_expected_offset_has_one_winner_and_the_loser_writes_nothing(orders: Store) -> None:
    a, b = orders.open_writer(), orders.open_writer()
    assert a.append("orders", 0, [Record(None, b"a")], expected_offset=0).base_offset == 0
    end = orders.partition_state("orders", 0).end_offset  # 1, or 2 on Kafka (a transaction's commit marker)
    with pytest.raises(KafkaException) as info:
        b.append("orders", 0, [Record(None, b"b")], expected_offset=0)
    assert info.value.code == ErrorCode.CAS_MISMATCH
    assert f"orders[0]: expected end offset 0, log end is {end}" in str(info.value)
    assert values(orders) == [b"a"]
    assert b.append("orders", 0, [Record(None, b"b")], expected_offset=end).base_offset == end


def test_a_cas_append_lands_exactly_at_its_expected_offset_while_plain_writers_append(
        orders: Store, request: pytest.FixtureRequest) -> None:
    """A plain append between a CAS writer's look at the end and its write makes the CAS fail, never land later
    (the CAS writer pauses there, so plain appends do come in between). On Kafka the write that landed later is
    aborted, which Tansu shows."""
    skip_on_tansu(orders.url, request, ABORTS_VISIBLE_ON_TANSU)
    pause = "kafka.cas.after_check" if orders.url.startswith("kafka") else "sqlite.append.after_checks"
    stop = threading.Event()

    def plain_appends() -> None:
        with contextlib.closing(open_store(orders.url)) as other:
            writer = other.open_writer()
            while not stop.is_set():
                writer.append("orders", 0, [Record(None, b"plain")])

    appender = threading.Thread(target=plain_appends)
    appender.start()
    try:
        racer = run_worker("cas_racer", orders.url, "orders", "cas", "20", failpoints=f"{pause}=sleep:100")
    finally:
        stop.set()
        appender.join()
    outcomes = [json.loads(line) for line in racer.stdout.splitlines()]
    won = {o["value"].encode(): o["offset"] for o in outcomes if o["error"] is None}
    assert all(o["error"] in (None, "CAS_MISMATCH") for o in outcomes) and len(outcomes) == 20
    assert all(won[o["value"].encode()] == o["expected"] for o in outcomes if o["error"] is None)
    assert {m.value(): m.offset() for m in read_range(orders, "orders", 0) if m.value() != b"plain"} == won


def test_a_conditional_append_says_the_end_the_next_one_expects(orders: Store) -> None:
    """A CAS writer chains its appends on ``end_after`` without asking the store for the end each time (on Kafka a
    transaction's marker follows the records, so it is not the last offset + 1)."""
    writer = orders.open_writer()
    end = 0
    for value in (b"a", b"b", b"c"):
        landed = writer.append("orders", 0, [Record(None, value)], expected_offset=end)
        assert landed.base_offset == end and landed.end_after == orders.partition_state("orders", 0).end_offset
        end = landed.end_after
    assert values(orders) == [b"a", b"b", b"c"]


def test_cas_by_expected_sequence(orders: Store) -> None:
    writer = orders.open_writer()
    writer.append("orders", 0, [Record(None, b"s0")], expected_sequence=NO_SEQUENCE)
    assert orders.partition_state("orders", 0).last_sequence == 0
    writer.append("orders", 0, [Record(None, b"s5")], sequence=5)
    assert refused(writer.append, "orders", 0, [Record(None, b"stale")], expected_sequence=0) == ErrorCode.CAS_MISMATCH
    writer.append("orders", 0, [Record(None, b"s6")], expected_sequence=5)
    assert orders.partition_state("orders", 0).last_sequence == 6
    assert values(orders) == [b"s0", b"s5", b"s6"]


def test_partition_state_follows_every_append_with_or_without_a_sequence(orders: Store,
                                                                        request: pytest.FixtureRequest) -> None:
    """Another process's partition_state after each append: its end, and the last sequence any record carries (on
    Kafka its look at the end and its scan for the sequence share one read of the tail)."""
    skip_on_tansu(orders.url, request, ABORTS_VISIBLE_ON_TANSU)
    writer = orders.open_writer()
    expected, ends = NO_SEQUENCE, set()
    with contextlib.closing(open_store(orders.url)) as other:
        for i, sequence in enumerate([None, 3, None, None, 7, 8, None, 12, None, None]):
            records = [Record(None, b"%d" % i)] * (1 + i % 3)
            landed = writer.append("orders", 0, records, sequence=sequence)
            expected = expected if sequence is None else sequence
            state = other.partition_state("orders", 0)
            assert (state.last_sequence, state.end_offset > landed.offset_of(len(records) - 1)) == (expected, True)
            ends.add(state.end_offset)
    assert len(ends) == 10


def test_application_sequence_must_increase(orders: Store) -> None:
    writer = orders.open_writer()
    writer.append("orders", 0, [Record(None, b"a")], sequence=10)
    code = refused(writer.append, "orders", 0, [Record(None, b"b")], sequence=10)
    assert code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert values(orders) == [b"a"]


def test_oversize_record_is_refused_and_nothing_is_written(orders: Store, store_url: str) -> None:
    from onceflow.connector.config import StoreConfig
    from onceflow.connector.store import open_store

    small = open_store(StoreConfig(url=store_url, message_max_bytes=100))
    writer = small.open_writer()
    code = refused(writer.append, "orders", 0, [Record(None, b"ok"), Record(None, b"x" * 101)])
    assert code == ErrorCode.MSG_SIZE_TOO_LARGE
    assert values(orders) == []
    assert writer.append("orders", 0, [Record(None, b"ok")]).base_offset == 0  # the sequence was not consumed


def test_unknown_partitions_and_out_of_range_reads(orders: Store) -> None:
    writer = orders.open_writer()
    writer.append("orders", 0, [Record(None, b"a")])
    assert refused(writer.append, "orders", 7, [Record(None, b"a")]) == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert refused(writer.append, "nope", 0, [Record(None, b"a")]) == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert refused(writer.append, "orders", 0, []) == ErrorCode.INVALID_RECORD
    assert refused(orders.read, "orders", 0, 2, 10) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert refused(orders.read, "orders", 9, 0, 10) == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert orders.read("orders", 0, 1, 10) == []
    assert values(orders) == [b"a"]


def test_prefetch_is_a_hint_that_leaves_each_reads_errors_to_that_read(orders: Store) -> None:
    """A Consumer tells the store every partition it is about to read; what a read of one would raise is raised
    by that read, and the others read as if nothing was said."""
    writer = orders.open_writer()
    writer.append("orders", 0, [Record(None, b"a"), Record(None, b"b")])
    writer.append("orders", 1, [Record(None, b"c")])
    orders.prefetch({("orders", 0): 1, ("orders", 1): 0, ("orders", 9): 0, ("nope", 0): 0})
    assert [m.value() for m in orders.read("orders", 0, 1, 10)] == [b"b"]
    assert [m.value() for m in orders.read("orders", 1, 0, 10)] == [b"c"]
    orders.prefetch({("orders", 0): 5, ("orders", 1): 1})  # past the end: its read refuses it
    assert refused(orders.read, "orders", 0, 5, 10) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert orders.read("orders", 1, 1, 10) == []
    assert refused(orders.read, "orders", 9, 0, 10) == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert values(orders) == [b"a", b"b"]


def test_truncate_before_drops_old_records_only(orders: Store, request: pytest.FixtureRequest) -> None:
    skip_on_tansu(orders.url, request, "Tansu does not support DeleteRecords (integration/PEER.md)")
    writer = orders.open_writer()
    for i in range(5):
        writer.append("orders", 0, [Record(None, b"%d" % i)])
    assert orders.truncate_before("orders", 0, 3) == 3
    assert orders.partition_state("orders", 0).start_offset == 3
    assert refused(orders.read, "orders", 0, 1, 10) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert values(orders, 0, 3) == [b"3", b"4"]
    assert refused(orders.truncate_before, "orders", 0, 9) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert orders.truncate_before("orders", 0, 1) == 3


def test_cas_append_to_a_sealed_epoch_is_refused_as_sealed(orders: Store) -> None:
    writer = orders.open_writer()
    writer.append("orders", 0, [Record(None, b"a")])
    orders.scale_stream("orders", 1)
    code = refused(writer.append, "orders", 0, [Record(None, b"b")], expected_offset=1)
    assert code == ErrorCode.PARTITION_SEALED
    assert values(orders) == [b"a"]
