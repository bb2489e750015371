"""pytest plugin (entry point ``onceflow``): Kafka-protocol broker fixtures for onceflow's and users' tests.

Fixtures: ``kafka_broker`` (a running :class:`onceflow.integration.brokers.Broker`, one per session) and
``kafka_bootstrap`` (its address). Markers: ``kafka`` (needs a broker), ``requires_docker`` (skipped with a
reason where no Docker engine answers). A run whose tests use the broker names it after collection (a run that
does not probes nothing); each test that uses one records it as the ``kafka_broker`` property (shown in JUnit
XML and the terminal summary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from onceflow.integration import brokers
from onceflow.integration.brokers import Broker

_used: list[Broker] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka: needs a Kafka-protocol broker (see integration/brokers.py)")
    config.addinivalue_line("markers", "requires_docker: needs a Docker engine (testcontainers)")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Name the broker in the header, only for a run that uses it (other runs probe nothing: no Java, no Docker)."""
    uses_broker = any("kafka_broker" in getattr(item, "fixturenames", ()) for item in session.items)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if uses_broker and reporter is not None:
        reporter.write_line(f"onceflow kafka broker: {brokers.provider()}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("requires_docker") and not brokers.docker_available():
        pytest.skip("needs a Docker engine for testcontainers; none answers on this machine")


@pytest.fixture(scope="session")
def _kafka_broker_session() -> Iterator[Broker]:
    with brokers.kafka_broker() as broker:
        _used.append(broker)
        yield broker


@pytest.fixture
def kafka_broker(_kafka_broker_session: Broker, record_property: Callable[[str, object], None]) -> Broker:
    """The session's broker; the test's report records which one it was."""
    record_property("kafka_broker", _kafka_broker_session.describe())
    return _kafka_broker_session


@pytest.fixture
def kafka_bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.bootstrap


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for broker in _used:
        terminalreporter.write_line(f"onceflow: kafka tests ran against {broker.describe()}")
