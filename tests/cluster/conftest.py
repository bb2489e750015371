"""A three-node Apache Kafka cluster, one per session, for the tests that need replication and node failures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.integration import apache_kafka, brokers
from onceflow.integration.brokers import Broker


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[Broker]:
    if not apache_kafka.available():
        pytest.skip("needs Java and Maven (or cached jars) for a local Apache Kafka cluster")
    with brokers.kafka_cluster() as cluster:
        yield cluster
