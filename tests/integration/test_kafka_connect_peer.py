"""Apache Kafka Connect runs in the harness as the peer of onceflow's Connect-style worker: a real worker on the
test broker, driven through its REST API. These tests pin the behaviour and JSON shapes onceflow's worker
mirrors (status codes, error bodies, status and plugin listings) and that a FileStreamSource moves a file's
lines into a topic."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest

from onceflow.integration import apache_kafka, kafka_connect
from onceflow.integration.brokers import Broker, free_port
from onceflow.integration.kafka_connect import FILE_SOURCE, ConnectWorker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def peer(kafka_broker: Broker) -> Iterator[ConnectWorker]:
    if kafka_broker.kind != "apache-kafka" or not kafka_connect.available():
        pytest.skip("Kafka Connect runs against the local Apache Kafka broker (Java and Maven, or cached jars)")
    with kafka_connect.connect_worker(kafka_broker.bootstrap, free_port) as worker:
        yield worker


def read_topic(bootstrap: str, topic: str, want: int, timeout_s: float = 60) -> list[str]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-{uuid.uuid4().hex[:6]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append((message.value() or b"").decode())
    consumer.close()
    return got


def test_a_file_source_on_kafka_connect_moves_every_line_and_reports_its_status(peer: ConnectWorker,
                                                                                kafka_broker: Broker,
                                                                                tmp_path: Path) -> None:
    status, root = peer.request("GET", "/")
    assert status == 200 and root["version"] == apache_kafka.kafka_version() and root["kafka_cluster_id"]
    status, plugins = peer.request("GET", "/connector-plugins")
    assert status == 200 and {"class": FILE_SOURCE, "type": "source", "version": root["version"]} in plugins

    lines = [f"line-{i}" for i in range(50)]
    (tmp_path / "in.txt").write_text("".join(f"{line}\n" for line in lines))
    config = {"connector.class": FILE_SOURCE, "tasks.max": "1", "file": str(tmp_path / "in.txt"),
              "topic": "peer-lines"}
    status, created = peer.request("POST", "/connectors", {"name": "lines", "config": config})
    assert status == 201
    assert created == {"name": "lines", "config": {**config, "name": "lines"}, "tasks": [], "type": "source"}
    assert peer.request("POST", "/connectors", {"name": "lines", "config": config})[0] == 409

    def running() -> bool:
        code, state = peer.request("GET", "/connectors/lines/status")
        return code == 200 and state["connector"]["state"] == "RUNNING" and [t["state"] for t in state["tasks"]] == [
            "RUNNING"]

    peer.wait_for(running, "the connector and its task running")
    status, state = peer.request("GET", "/connectors/lines/status")
    assert set(state) == {"name", "connector", "tasks", "type"}
    assert set(state["connector"]) == {"state", "worker_id", "version"}
    assert set(state["tasks"][0]) == {"id", "state", "worker_id", "version"}
    assert read_topic(kafka_broker.bootstrap, "peer-lines", len(lines)) == lines


def test_kafka_connect_refuses_bad_requests_with_its_error_body(peer: ConnectWorker) -> None:
    status, error = peer.request("GET", "/connectors/missing/status")
    assert status == 404 and error == {"error_code": 404, "message": "No status found for connector missing"}
    status, error = peer.request("POST", "/connectors", {"name": "no-class", "config": {"tasks.max": "1"}})
    assert status == 400 and error == {"error_code": 400, "message": "Connector config {name=no-class, tasks.max=1} "
                                                      "contains no connector type"}
    status, validated = peer.request("PUT", "/connector-plugins/FileStreamSource/config/validate",
                                     {"connector.class": FILE_SOURCE, "tasks.max": "x"})
    assert status == 200 and validated["name"] == FILE_SOURCE and validated["error_count"] >= 1
    tasks_max = next(c for c in validated["configs"] if c["value"]["name"] == "tasks.max")
    assert tasks_max["value"]["errors"] and set(tasks_max) == {"definition", "value"}
