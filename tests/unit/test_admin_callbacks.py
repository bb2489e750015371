"""The AdminClient's librdkafka callbacks, on both backends: stats_cb from poll() with the requests it made,
``logger`` with a line per request under ``debug``, and error_cb left alone: a request's error is its future's."""

from __future__ import annotations

import json
import logging

import pytest

from onceflow.connector import AdminClient, NewTopic
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException


def test_stats_cb_is_served_by_poll_with_the_requests_made(store_url: str) -> None:
    statistics: list[dict[str, object]] = []
    admin = AdminClient({"store.url": store_url, "client.id": "ops", "statistics.interval.ms": 50,
                         "stats_cb": lambda s: statistics.append(json.loads(s))})
    try:
        admin.create_topics([NewTopic("orders", 2)])["orders"].result()
        admin.list_consumer_groups().result()
        assert statistics == []  # served from poll() only, as confluent-kafka serves it
        assert admin.poll(10) == 1
    finally:
        admin.close()
    latest = statistics[-1]
    assert str(latest["name"]).startswith("ops#producer-")  # librdkafka's admin client is a producer handle
    assert (latest["client_id"], latest["type"], latest["tx"], latest["rx"]) == ("ops", "producer", 2, 2)


def test_poll_without_stats_cb_returns_at_once(store_url: str) -> None:
    admin = AdminClient({"store.url": store_url})
    try:
        assert admin.poll(30) == 0
    finally:
        admin.close()


def test_debug_logs_each_request_and_its_outcome_to_logger(store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    errors: list[KafkaError] = []
    logger = logging.getLogger("tests.admin")
    admin = AdminClient({"store.url": store_url, "logger": logger, "debug": "admin", "error_cb": errors.append})
    try:
        with caplog.at_level(logging.DEBUG, logger="tests.admin"):
            admin.create_topics([NewTopic("orders", 1)])["orders"].result()
            with pytest.raises(KafkaException) as again:
                admin.create_topics([NewTopic("orders", 1)])["orders"].result()
    finally:
        admin.close()
    assert again.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    lines = [r.getMessage() for r in caplog.records if r.name == "tests.admin"]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "create_topics orders: done", f"create_topics orders: {again.value.error}"]
    assert errors == []  # the failure is the request's result, as librdkafka's admin results carry theirs


def test_without_debug_requests_log_nothing(store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    admin = AdminClient({"store.url": store_url, "logger": logging.getLogger("tests.admin")})
    try:
        with caplog.at_level(logging.DEBUG, logger="tests.admin"):
            admin.create_topics([NewTopic("orders", 1)])["orders"].result()
    finally:
        admin.close()
    assert [r for r in caplog.records if r.name == "tests.admin"] == []


def test_throttle_cb_goes_to_librdkafka_on_kafka_and_is_accepted_without_effect_on_the_embedded_store(
        store_url: str) -> None:
    """docs/clients.md: the embedded store has nothing to throttle; a confluent-kafka program that sets the key
    runs unchanged, and a value that is not callable is refused as librdkafka refuses it."""
    if store_url.startswith("sqlite://"):
        with pytest.raises(KafkaException) as refused:
            AdminClient({"store.url": store_url, "throttle_cb": "print"})
        assert refused.value.code == ErrorCode.INVALID_CONFIG and "'throttle_cb' expects a callable" in str(
            refused.value)
    admin = AdminClient({"store.url": store_url, "throttle_cb": print})
    try:
        admin.create_topics([NewTopic("orders", 1)])["orders"].result()
        assert "orders" in admin.list_topics().topics
    finally:
        admin.close()
