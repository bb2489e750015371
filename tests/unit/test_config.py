"""Config: typed, unknown keys and wrong types refused with INVALID_CONFIG naming the key."""

from __future__ import annotations

import pytest

from onceflow.connector import Consumer, ErrorCode, KafkaException, Producer
from onceflow.connector.config import ConsumerConfig, ProducerConfig, build


def test_librdkafka_style_strings_are_accepted_for_numbers_and_booleans() -> None:
    config = build(ProducerConfig, {"linger.ms": "20", "enable.idempotence": "true"}, "producer")
    assert config.linger_ms == 20
    assert config.enable_idempotence is True


def test_offset_reset_aliases_normalise_as_librdkafka() -> None:
    assert build(ConsumerConfig, {"auto.offset.reset": "smallest"}, "consumer").auto_offset_reset == "earliest"
    assert build(ConsumerConfig, {"auto.offset.reset": "largest"}, "consumer").auto_offset_reset == "latest"


@pytest.mark.parametrize(
    ("client", "conf", "named"),
    [
        (Producer, {"lingr.ms": 5}, "lingr.ms"),
        (Producer, {"linger.ms": "soon"}, "linger.ms"),
        (Producer, {"linger.ms": -1}, "linger.ms"),
        (Producer, {"statistics.interval.ms": -1}, "statistics.interval.ms"),
        (Producer, {"logger": "root"}, "logger"),
        (Producer, {"acks": ["all"]}, "acks"),
        (Consumer, {"bootstrap.servers": "localhost:9092"}, "store.url=kafka://"),
        (Producer, {"store.url": "postgres://x"}, "store.url"),
        (Producer, {"store.sqlite.synchronous": "off"}, "store.sqlite.synchronous"),
        (Consumer, {"auto.offset.reset": "middle"}, "auto.offset.reset"),
        (Consumer, {"isolation.level": "dirty"}, "isolation.level"),
        (Consumer, {"session.timeout.ms": 100, "heartbeat.interval.ms": 200}, "heartbeat.interval.ms"),
        (Consumer, {"group.id": 7}, "group.id"),
    ],
)
def test_bad_config_is_refused_naming_the_key(client: type, conf: dict[str, object], named: str, tmp_path) -> None:
    full = {"store.url": f"sqlite://{tmp_path / 's.db'}", **conf}
    with pytest.raises(KafkaException) as info:
        client(full)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert named in str(info.value)
    assert not (tmp_path / "s.db").exists() or named != "lingr.ms"


def test_debug_reaches_librdkafka_on_kafka_only() -> None:
    """On kafka:// a confluent-kafka user's ``debug`` turns on librdkafka's own debug lines too (the connection
    problems it is set for are librdkafka's); the embedded store has no librdkafka."""
    on_kafka = build(ProducerConfig, {"store.url": "kafka://localhost:9092", "debug": "broker,topic"}, "producer")
    assert ("debug", "broker,topic") in on_kafka.store.kafka_settings and on_kafka.client.debug == "broker,topic"
    embedded = build(ProducerConfig, {"store.url": "sqlite://x.db", "debug": "all"}, "producer")
    assert embedded.store.kafka_settings == () and embedded.client.debug == "all"
