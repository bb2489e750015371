"""librdkafka settings pass through a client's config to the Kafka backend; librdkafka judges them."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from onceflow.connector import Consumer, KafkaException, Producer, TopicPartition
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
