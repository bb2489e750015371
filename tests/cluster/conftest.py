"""A three-node Apache Kafka cluster, one per session, for the tests that need replication and node failures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.integration import apache_kafka, brokers
from onceflow.integration.brokers import Broker


@pytest.fixture(scope="session")
def _kafka_cluster_session() -> Iterator[Broker]:
    if not apache_kafka.available():
        pytest.skip("needs Java and Maven (or cached jars) for a local Apache Kafka cluster")
    with brokers.kafka_cluster() as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster(_kafka_cluster_session: Broker) -> Broker:
    """The session's cluster with all three nodes up and every partition fully replicated: whatever an earlier
    test killed has caught up, so a node this test kills leaves ``min.insync.replicas`` standing."""
    _kafka_cluster_session.wait_until_replicated()
    return _kafka_cluster_session
