"""Code written for confluent-kafka keeps working: its error constants and TopicPartition semantics are ours."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from onceflow.connector import (
    AdminClient,
    Consumer,
    ErrorCode,
    KafkaError,
    KafkaException,
    Message,
    NewTopic,
    Producer,
    TopicPartition,
)


def confluent_codes() -> dict[str, int]:
    return {name: value for name, value in vars(confluent_kafka.KafkaError).items()
            if name.lstrip("_").isupper() and isinstance(value, int)}


def test_every_confluent_error_constant_exists_with_its_number() -> None:
    codes = confluent_codes()
    assert len(codes) > 150
    for name, value in codes.items():
        assert getattr(KafkaError, name) == value, name
        assert ErrorCode[name] == value, name


def test_the_common_idioms_work_unchanged() -> None:
    eof = KafkaError(ErrorCode._PARTITION_EOF, "orders[0] at end")
    assert eof.code() == KafkaError._PARTITION_EOF
    assert KafkaError(KafkaError.TOPIC_ALREADY_EXISTS).code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    assert KafkaError.CAS_MISMATCH == ErrorCode.CAS_MISMATCH  # onceflow's own codes are constants too
    assert "CAS_MISMATCH" in dir(KafkaError)


def test_topic_partition_equality_order_and_hash_match_confluent_kafkas() -> None:
    pairs = [(("t", 0, 5), ("t", 0, 6)), (("t", 0, 7), ("t", 0, 5)), (("t", 0, 5), ("t", 1, 5)),
             (("a", 1, 9), ("b", 0, 1)), (("t", 0), ("t", 0, 3))]
    for left, right in pairs:
        ours = TopicPartition(*left), TopicPartition(*right)
        theirs = confluent_kafka.TopicPartition(*left), confluent_kafka.TopicPartition(*right)
        assert (ours[0] == ours[1]) == (theirs[0] == theirs[1]), (left, right)
        assert (ours[0] < ours[1]) == (theirs[0] < theirs[1]), (left, right)
        assert (hash(ours[0]) == hash(ours[1])) == (hash(theirs[0]) == hash(theirs[1])), (left, right)
    assert len({TopicPartition("t", 0, 1), TopicPartition("t", 0, 2)}) == 1


def test_message_latency_and_leader_epoch_are_none_where_unknown_as_confluent_kafkas() -> None:
    """confluent-kafka's consumed messages answer None for both; code that reads them must not break."""
    message = Message("t", 0, 5, b"k", b"v", timestamp=1_000)
    assert message.latency() is None
    assert message.leader_epoch() is None
    theirs = [name for name in ("latency", "leader_epoch") if hasattr(confluent_kafka.Message, name)]
    assert theirs == ["latency", "leader_epoch"]


# -- librdkafka settings a confluent-kafka program sets, on the embedded store -----------------------------------


@pytest.fixture
def topic_conf(sqlite_url: str) -> dict[str, object]:
    AdminClient({"store.url": sqlite_url}).create_topics([NewTopic("t", 1)])["t"].result()
    return {"store.url": sqlite_url}


def test_a_typical_confluent_kafka_config_runs_on_the_embedded_store(topic_conf: dict[str, object]) -> None:
    producer = Producer({**topic_conf, "client.id": "orders-app", "acks": "all", "compression.type": "lz4",
                         "enable.idempotence": False, "retries": 5, "queue.buffering.max.ms": 20,
                         "message.timeout.ms": 30_000, "debug": "msg"})
    assert (producer._config.linger_ms, producer._config.delivery_timeout_ms) == (20, 30_000)  # librdkafka aliases
    producer.produce("t", b"v")
    assert producer.flush() == 0
    consumer = Consumer({**topic_conf, "group.id": "g", "partition.assignment.strategy": "cooperative-sticky",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10, "error_cb": print})
    consumer.assign([TopicPartition("t", 0)])
    assert [m.value() for m in consumer.consume(1, timeout=10)] == [b"v"]
    consumer.close()


def test_bootstrap_servers_says_to_name_the_cluster_in_store_url(topic_conf: dict[str, object]) -> None:
    with pytest.raises(KafkaException) as info:
        Producer({**topic_conf, "bootstrap.servers": "localhost:9092"})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "store.url=kafka://" in str(info.value)


def test_error_cb_hears_of_a_fatal_error_from_poll(topic_conf: dict[str, object]) -> None:
    errors: list[KafkaError] = []
    old = Producer({**topic_conf, "writer.id": "w", "error_cb": errors.append})
    Producer({**topic_conf, "writer.id": "w"}).close()  # a newer session fences the first
    reports: list[KafkaError | None] = []
    old.produce("t", b"late", on_delivery=lambda err, msg: reports.append(err))
    old.flush()
    assert [e.code() for e in reports if e is not None] == [ErrorCode.PRODUCER_FENCED]
    assert [(e.code(), e.fatal()) for e in errors] == [(ErrorCode.PRODUCER_FENCED, True)]


def wait_for(found: list[dict[str, Any]], call: Callable[[], object], timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not found and time.monotonic() < deadline:
        call()
    assert found, "stats_cb was not called"
    return found[-1]


def test_stats_cb_gets_librdkafkas_statistics_json_with_real_figures(topic_conf: dict[str, object]) -> None:
    stats: list[dict[str, Any]] = []
    producer = Producer({**topic_conf, "client.id": "app", "stats_cb": lambda s: stats.append(json.loads(s)),
                         "statistics.interval.ms": 50})
    for i in range(5):
        producer.produce("t", b"%d" % i, partition=0)
    producer.flush()
    stats.clear()
    sent = wait_for(stats, lambda: producer.poll(0.01))
    assert (sent["type"], sent["client_id"], sent["name"].startswith("app#producer-")) == ("producer", "app", True)
    assert (sent["txmsgs"], sent["msg_cnt"], sent["topics"]["t"]["partitions"]["0"]["txmsgs"]) == (5, 0, 5)
    assert sent["ts"] > 0 and sent["time"] > 0
    consumer = Consumer({**topic_conf, "group.id": "g", "stats_cb": lambda s: stats.append(json.loads(s)),
                         "statistics.interval.ms": 50})
    consumer.assign([TopicPartition("t", 0, 0)])
    assert len(consumer.consume(5, timeout=10)) == 5
    consumer.commit(offsets=[TopicPartition("t", 0, 3)], asynchronous=False)
    stats.clear()
    got = wait_for(stats, lambda: consumer.poll(0.01))
    partition = got["topics"]["t"]["partitions"]["0"]
    assert (got["type"], got["rxmsgs"], partition["rxmsgs"]) == ("consumer", 5, 5)
    assert (partition["hi_offset"], partition["app_offset"], partition["committed_offset"]) == (5, 5, 3)
    assert partition["consumer_lag"] == 2
    consumer.close()


def test_logger_gets_the_clients_debug_lines_when_debug_is_set(topic_conf: dict[str, object]) -> None:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(f"app.{uuid.uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Collect())
    for debug in ("", "all"):
        producer = Producer({**topic_conf, "logger": logger, "debug": debug})
        producer.produce("t", b"v", partition=0)
        producer.close()
    assert len(lines) == 1 and "t[0]: 1 records appended" in lines[0], lines


def test_error_cb_hears_of_an_append_retried_while_the_store_was_busy(topic_conf: dict[str, object],
                                                                      sqlite_url: str) -> None:
    errors: list[KafkaError] = []
    producer = Producer({**topic_conf, "store.busy.timeout.ms": 50, "linger.ms": 0, "delivery.timeout.ms": 20_000,
                         "error_cb": errors.append})
    producer.produce("t", b"warm-up")
    producer.flush()  # the producer's connection is open: the next append only waits for the lock
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite://"), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's write in progress
    release = threading.Timer(0.5, holder.rollback)
    release.start()
    delivered: list[KafkaError | None] = []
    producer.produce("t", b"v", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush() == 0
    release.join()
    holder.close()
    assert delivered == [None]  # retried until the lock was free, and written once
    assert errors and all(e.retriable() and e.code() == ErrorCode._FS for e in errors)
