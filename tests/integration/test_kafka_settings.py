"""librdkafka settings pass through a client's config to the Kafka backend; librdkafka judges them."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from onceflow.connector import Consumer, ErrorCode, KafkaError, KafkaException, Producer, TopicPartition
from onceflow.connector.config import StoreConfig
from onceflow.connector.store import Record, open_store
from onceflow.integration.brokers import Broker

pytestmark = pytest.mark.kafka


def refused(conf: dict[str, object]) -> str:
    with pytest.raises(KafkaException) as info:
        Producer(conf)
    assert info.value.code.name == "INVALID_CONFIG"
    return str(info.value)


def test_librdkafka_settings_reach_the_kafka_clients(kafka_broker: Broker) -> None:
    url = f"kafka://{kafka_broker.bootstrap}/s{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("t", 1)
    producer = Producer({"store.url": url, "socket.keepalive.enable": True, "compression.type": "lz4"})
    producer.produce("t", b"v", partition=0)
    producer.close()  # flushes
    consumer = Consumer({"store.url": url, "group.id": "g", "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition("t", 0, 0)])
    assert [m.value() for m in consumer.consume(1, timeout=30)] == [b"v"]
    consumer.close()


def test_a_setting_librdkafka_does_not_know_is_refused_naming_it(kafka_broker: Broker) -> None:
    message = refused({"store.url": f"kafka://{kafka_broker.bootstrap}", "no.such.setting": 1})
    assert "no.such.setting" in message


def test_settings_onceflow_manages_cannot_be_overridden(kafka_broker: Broker) -> None:
    message = refused({"store.url": f"kafka://{kafka_broker.bootstrap}", "bootstrap.servers": "elsewhere:9092"})
    assert "'bootstrap.servers' is set by onceflow" in message


def test_librdkafka_settings_on_the_embedded_store_are_unknown_keys(tmp_path: object) -> None:
    message = refused({"store.url": f"sqlite://{tmp_path}/s.db", "socket.keepalive.enable": True})
    assert "unknown producer config key 'socket.keepalive.enable'" in message and "kafka://" in message


def test_the_same_writer_id_in_two_namespaces_fences_nobody(kafka_broker: Broker) -> None:
    """A namespace isolates everything, Kafka's transactional ids included: found by the crash matrix, whose
    cells reuse writer ids in namespaces of their own on one broker."""
    stores = [open_store(f"kafka://{kafka_broker.bootstrap}/ns{uuid.uuid4().hex[:8]}") for _ in range(2)]
    for store in stores:
        store.create_stream("s", 1)
    writers = [store.open_writer("app") for store in stores]
    assert writers[0].append("s", 0, [Record(None, b"still mine")]).base_offset == 0
    for writer, store in zip(writers, stores, strict=True):
        writer.close()
        store.close()


def produced(url: str, records: list[tuple[bytes | None, bytes]], extra: dict[str, object],
             transactional: bool) -> list[object]:
    """``records`` produced to the stream "t" (one partition) in one batch, one flush or one transaction: each
    record's delivery error (None: delivered)."""
    conf: dict[str, object] = {"store.url": url, "linger.ms": 60_000, "batch.num.messages": 1_000_000, **extra}
    if transactional:
        conf["transactional.id"] = f"t-{uuid.uuid4().hex[:6]}"
    producer = Producer(conf)
    reports: list[object] = []
    if transactional:
        producer.init_transactions()
        producer.begin_transaction()
    for key, value in records:
        producer.produce("t", value, key, partition=0, on_delivery=lambda err, msg: reports.append(err))
    if transactional:
        producer.commit_transaction()
    assert producer.flush(60) == 0
    producer.close()
    return reports


def read_all(url: str, want: int) -> list[bytes]:
    consumer = Consumer({"store.url": url, "group.id": "g"})
    consumer.assign([TopicPartition("t", 0, 0)])
    got: list[bytes] = []
    for _ in range(30):
        got += [m.value() for m in consumer.consume(want - len(got), timeout=2)]
        if len(got) >= want:
            break
    consumer.close()
    return got


@pytest.mark.parametrize("transactional", [False, True], ids=["flush", "transaction"])
def test_a_batch_larger_than_librdkafkas_queue_waits_for_room_and_is_delivered(
        kafka_broker: Broker, transactional: bool) -> None:
    """librdkafka's queue holds queue.buffering.max.kbytes at most (a setting passed through); a batch larger than
    that is handed over as delivery reports make room (a transaction's: its staged records, then its merge).
    Before, librdkafka's BufferError escaped from flush() midway through the batch, the records before it sent
    and never reported."""
    url = f"kafka://{kafka_broker.bootstrap}/q{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("t", 1)
    values = [b"%05d" % i + b"." * 1000 for i in range(6000)]  # 3 MB
    reports = produced(url, [(None, v) for v in values], {"queue.buffering.max.kbytes": 2048}, transactional)
    assert reports == [None] * len(values)
    assert read_all(url, len(values)) == values


def test_a_record_larger_than_librdkafkas_whole_queue_fails_alone(kafka_broker: Broker) -> None:
    url = f"kafka://{kafka_broker.bootstrap}/q{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("t", 1)
    reports = produced(url, [(None, b"x" * 100_000)], {"queue.buffering.max.kbytes": 64}, transactional=False)
    assert [getattr(error, "code", lambda: None)() for error in reports] == [ErrorCode._QUEUE_FULL]
    with contextlib.closing(open_store(url)) as store:
        assert store.partition_state("t", 0).end_offset == 0


def test_a_batch_stopped_midway_is_reported_once_as_outcome_unknown(kafka_broker: Broker) -> None:
    """A record that can never fit stops its batch after the records before it went out: they may land, so the
    batch is not failed as if nothing was written (an application would append it again). Each of its records is
    reported once, its outcome unknown; an append through the store says the same."""
    url = f"kafka://{kafka_broker.bootstrap}/q{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("t", 1)
    small, large = (None, b"small"), (None, b"x" * 100_000)
    reports = produced(url, [small, large, small], {"queue.buffering.max.kbytes": 64}, transactional=False)
    assert len(reports) == 3
    assert all(isinstance(error, KafkaError) and error.outcome_unknown() and not error.retriable()
               for error in reports)
    with contextlib.closing(open_store(StoreConfig(url=url, kafka_settings=(
            ("queue.buffering.max.kbytes", 64),)))) as store:
        with pytest.raises(KafkaException) as info:
            store.open_writer().append("t", 0, [Record(*small), Record(*large)])
        assert info.value.error.outcome_unknown() and not info.value.error.retriable()
        assert store.partition_state("t", 0).end_offset == 2  # the small records landed, both times


def test_a_record_within_message_max_bytes_is_taken_by_librdkafka_too(kafka_broker: Broker) -> None:
    """onceflow counts a record's key, value and headers against message.max.bytes; librdkafka counts its framing
    too. With both at 1,000,000, a record of 999,993 bytes passed onceflow's check and librdkafka's produce()
    refused it midway through its batch: the record before it was sent (and landed), while the batch was reported
    failed, twice."""
    url = f"kafka://{kafka_broker.bootstrap}/m{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("t", 1)
    values = [b"before", b"v" * 999_990, b"after"]
    assert produced(url, [(b"key", v) for v in values], {}, transactional=False) == [None] * 3
    assert read_all(url, 3) == values


def test_a_long_batch_that_keeps_going_out_is_not_cut_off_by_the_wait_bound(kafka_broker: Broker) -> None:
    """The wait for room is bounded by the writer's delivery timeout, counted from the last record that went out,
    not from the batch's first: librdkafka holding 10 records, 6000 take seconds to hand over (10 a linger),
    and a bound counted from the start failed the append after the delivery timeout (2 s) with _QUEUE_FULL."""
    url = f"kafka://{kafka_broker.bootstrap}/w{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(StoreConfig(url=url, kafka_settings=(
            ("queue.buffering.max.messages", 10),)))) as store:
        store.create_stream("t", 1)
        writer = store.open_writer(delivery_timeout_ms=2000)
        result = writer.append("t", 0, [Record(None, b"%d" % i) for i in range(6000)])
        writer.close()
        assert (result.base_offset, result.record_count) == (0, 6000)
        assert store.partition_state("t", 0).end_offset == 6000
