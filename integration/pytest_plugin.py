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

_used: list[str] = []  # the brokers this process's tests ran against (with pytest-xdist: every worker's)


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
    with brokers.kafka_broker(until_exit=True) as broker:  # clients still open at the end meet a live broker
        _used.append(broker.describe())
        yield broker


@pytest.fixture
def kafka_broker(_kafka_broker_session: Broker, record_property: Callable[[str, object], None]) -> Broker:
    """The session's broker; the test's report records which one it was."""
    record_property("kafka_broker", _kafka_broker_session.describe())
    return _kafka_broker_session


@pytest.fixture
def kafka_bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.bootstrap


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands the brokers it used to the controller, which prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["onceflow_brokers"] = list(_used)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _used.extend(getattr(node, "workeroutput", {}).get("onceflow_brokers", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for broker in sorted(set(_used)):
        terminalreporter.write_line(f"onceflow: kafka tests ran against {broker}")
