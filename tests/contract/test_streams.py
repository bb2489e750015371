"""Streams: create, list, describe, scale, delete; bad input refused and nothing changed."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import pytest

from onceflow.connector import Consumer, ErrorCode, KafkaException, TopicPartition
from onceflow.connector.config import StoreConfig
from onceflow.connector.store import PartitionState, Record, Store, open_store, read_range, read_stream
from tests.conftest import skip_on_tansu


def codes(fn, *args) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as info:
        fn(*args)
    return info.value.code


def test_create_list_describe_delete(store: Store) -> None:
    store.create_stream("orders", 3)
    store.create_stream("audit", 1)
    assert store.list_streams() == ["audit", "orders"]
    orders = store.describe_stream("orders")
    assert orders.partitions == (0, 1, 2) and not orders.current.sealed
    store.delete_stream("orders")
    assert store.list_streams() == ["audit"]
    assert codes(store.describe_stream, "orders") == ErrorCode.UNKNOWN_TOPIC_OR_PART


def test_bad_stream_requests_are_refused_and_change_nothing(store: Store) -> None:
    store.create_stream("orders", 2)
    assert codes(store.create_stream, "orders", 5) == ErrorCode.TOPIC_ALREADY_EXISTS
    assert codes(store.create_stream, "bad name!", 1) == ErrorCode.TOPIC_EXCEPTION
    assert codes(store.create_stream, "empty", 0) == ErrorCode.INVALID_PARTITIONS
    assert codes(store.scale_stream, "orders", 0) == ErrorCode.INVALID_PARTITIONS
    assert codes(store.scale_stream, "nope", 2) == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert codes(store.delete_stream, "nope") == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert store.list_streams() == ["orders"]
    assert store.describe_stream("orders").partitions == (0, 1)


def test_scale_seals_the_current_epoch_and_opens_a_new_one(store: Store) -> None:
    store.create_stream("orders", 2)
    writer = store.open_writer()
    writer.append("orders", 0, [Record(b"k", b"before")])
    scaled = store.scale_stream("orders", 3)
    assert [(e.epoch, e.partitions, e.sealed) for e in scaled.epochs] == [(0, (0, 1), True), (1, (2, 3, 4), False)]
    assert store.partition_state("orders", 0).sealed
    with pytest.raises(KafkaException) as info:
        writer.append("orders", 0, [Record(b"k", b"after")])
    assert info.value.code == ErrorCode.PARTITION_SEALED
    assert store.partition_state("orders", 0).end_offset == 1
    assert [m.value() for m in read_range(store, "orders", 0)] == [b"before"]
    assert writer.append("orders", 3, [Record(b"k", b"after")]).base_offset == 0


def test_a_recreated_stream_starts_empty(store: Store) -> None:
    store.create_stream("orders", 1)
    store.open_writer().append("orders", 0, [Record(None, b"old")])
    store.delete_stream("orders")
    store.create_stream("orders", 1)
    assert store.partition_state("orders", 0).end_offset == 0
    assert list(read_range(store, "orders", 0)) == []


def test_streams_and_epochs_made_by_another_client_are_readable_from_an_open_store(store: Store) -> None:
    with contextlib.closing(open_store(store.url)) as reader:  # opened before the stream exists
        store.create_stream("late", 1)
        store.open_writer().append("late", 0, [Record(None, b"a")])
        assert [m.value() for m in read_range(reader, "late", 0)] == [b"a"]
        store.scale_stream("late", 2)
        store.open_writer().append("late", 2, [Record(None, b"b")])
        assert [m.value() for m in read_range(reader, "late", 2)] == [b"b"]


@pytest.mark.parametrize("writer_id", [None, "fenced-writer"])
def test_appends_racing_a_scale_are_acknowledged_only_where_readers_see_them(store: Store,
                                                                             writer_id: str | None) -> None:
    """Found by the crash matrix on Kafka: appends in flight while another client scaled were acknowledged at
    offsets past the sealed end, hidden from every reader. An append either lands below the seal, or its
    writer is told PARTITION_SEALED."""
    store.create_stream("s", 2)
    writer = store.open_writer(writer_id)
    scaler = open_store(store.url)
    acknowledged: dict[int, set[int]] = {0: set(), 1: set()}
    stop = threading.Event()

    def append_until_sealed() -> None:
        for i in itertools.count():
            partition = i % 2
            try:
                acknowledged[partition].add(writer.append("s", partition, [Record(None, b"%d" % i)]).base_offset)
            except KafkaException as exc:
                assert exc.code == ErrorCode.PARTITION_SEALED
                if stop.is_set():
                    return
            if stop.is_set() and i > 20:
                return

    thread = threading.Thread(target=append_until_sealed)
    thread.start()
    deadline = time.monotonic() + 60
    while not all(acknowledged.values()) and time.monotonic() < deadline:
        time.sleep(0.01)  # scale once both partitions have acknowledged appends, while more are in flight
    scaler.scale_stream("s", 3)
    stop.set()
    thread.join()
    scaler.close()
    for partition in (0, 1):
        visible = {m.offset() for m in read_range(store, "s", partition)}
        assert acknowledged[partition] and acknowledged[partition] <= visible


SMALL_FETCHES = (("max.partition.fetch.bytes", 1), ("queued.min.messages", 1), ("fetch.queue.backoff.ms", 1))
"""librdkafka then asks for one record batch of a partition per fetch (a broker returns at least one), and
fetches no further ahead while one is waiting to be read."""


def test_a_partition_is_read_whole_although_one_read_returns_one_fetch(store: Store,
                                                                       request: pytest.FixtureRequest) -> None:
    """Store.read returns what one fetch brought, which on Kafka can stop short of the end however large
    max_records is; read_range and read_stream loop to the end. (A Spark test compared its copy with a stream
    read by one read per partition, and found records in the copy that the one read had not returned.)"""
    store.create_stream("big", 1)
    batches = [[b"%d/%d:" % (batch, i) + b"." * 4000 for i in range(25)] for batch in range(10)]
    expected = [value for batch in batches for value in batch]
    with contextlib.closing(store.open_writer()) as writer:
        for batch in batches:  # one append each: one record batch each, 100 kB
            writer.append("big", 0, [Record(None, value) for value in batch])
    on_kafka = store.url.startswith("kafka://")
    config = StoreConfig(url=store.url, kafka_settings=SMALL_FETCHES if on_kafka else ())
    with contextlib.closing(open_store(config)) as reader:
        if on_kafka:
            one_read = reader.read("big", 0, 0, 1_000_000)
            if len(one_read) == len(expected):
                skip_on_tansu(store.url, request, "Tansu at times returns a whole partition in one fetch, whatever "
                              "max.partition.fetch.bytes says: one read cannot fall short there")
            assert 0 < len(one_read) < len(expected), "the arrangement: one read returns part of the partition"
        assert [m.value() for m in read_range(reader, "big", 0)] == expected
        assert [m.value() for m in read_stream(reader, "big")] == expected
        assert [m.value() for m in read_range(reader, "big", 0, start=240)] == expected[240:]


def test_a_consumer_reads_a_widely_scaled_stream_where_each_look_takes_a_round_trip(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fourteen successors wait for their predecessors, each check a look at a partition's state that takes 10 ms
    (a remote cluster's round trip): the checks of one pass outlast its time budget, and a pass that spent it on
    them read nothing, so the predecessors were never read and nothing ever was."""
    store.create_stream("wide", 2)
    writer = store.open_writer()
    for partition in range(2):
        writer.append("wide", partition, [Record(None, b"old%d" % partition)])
    successors = list(store.scale_stream("wide", 14).current.partitions)
    for partition in successors:
        writer.append("wide", partition, [Record(None, b"new%d" % partition)])
    writer.close()
    partition_state = type(store).partition_state

    def far(self: Store, stream: str, partition: int) -> PartitionState:
        time.sleep(0.01)
        return partition_state(self, stream, partition)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store), "partition_state", far)
    consumer = Consumer({"store.url": store.url, "group.id": "wide-reader", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition("wide", p) for p in [0, 1, *successors]])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while len(values) < 16 and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(100, timeout=0.2) if m.error() is None]
        assert len(values) == 16
        description = store.describe_stream("wide")
        for partition in successors:  # each after its predecessors, read to their end
            for predecessor in description.predecessors(partition):
                assert values.index(b"old%d" % predecessor) < values.index(b"new%d" % partition)
    finally:
        consumer.close()
