"""The REST API answers Kafka Connect's requests with its status codes, JSON shapes and error bodies, alone (fast,
on the embedded store) and side by side with Apache Kafka Connect (the same requests to both, compared)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.connect.distributed import DistributedWorker
from onceflow.integration import kafka_connect
from onceflow.integration.brokers import Broker, free_port
from tests.connect import rest_scenario
from tests.connect.conftest import client


def test_every_step_gets_its_status_and_kafka_connects_messages(worker: ConnectWorker, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("a\nb\nc\n")
    steps = rest_scenario.scenario(tmp_path)
    answers = rest_scenario.run(client(worker), steps, timeout_s=20)
    assert [(s.method, s.path, a[0]) for s, a in zip(steps, answers, strict=True)] == [
        (s.method, s.path, s.status) for s in steps]
    by_request = {(s.method, s.path, str(s.body)): a for s, a in zip(steps, answers, strict=True)}
    assert by_request[("POST", "/connectors", str(steps[5].body))][1] == {
        "error_code": 400, "message": "Connector config {name=no-class, tasks.max=1} contains no connector type"}
    assert by_request[("GET", "/connectors/src/tasks/5/status", "None")][1] == {
        "error_code": 404, "message": "No status found for task src-5"}
    offsets = [a for s, a in zip(steps, answers, strict=True)
               if (s.method, s.path) == ("GET", "/connectors/src/offsets")]
    partition = {"filename": str(tmp_path / "in.txt")}
    assert [o[1] for o in offsets[:4]] == [{"offsets": [{"partition": partition, "offset": {"position": 6}}]},
                                          {"offsets": [{"partition": partition, "offset": {"position": 6}}]},
                                          {"offsets": [{"partition": partition, "offset": {"position": 2}}]},
                                          {"offsets": []}]


def test_a_token_guards_every_endpoint(worker_props: dict[str, str]) -> None:
    with ConnectWorker({**worker_props, "rest.auth.token": "s3cret"}) as worker:
        refused = {"error_code": 401, "message": "Missing or wrong 'Authorization: Bearer' token"}
        assert client(worker).request("GET", "/connectors") == (401, refused)
        request = urllib.request.Request(worker.url + "/connectors", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert (answer.status, json.loads(answer.read())) == (200, [])


@pytest.fixture
def peer(kafka_broker: Broker) -> Iterator[kafka_connect.ConnectWorker]:
    if kafka_broker.kind != "apache-kafka" or not kafka_connect.available():
        pytest.skip("Kafka Connect runs against the local Apache Kafka broker (Java and Maven, or cached jars)")
    with kafka_connect.connect_worker(kafka_broker.bootstrap, free_port) as running:
        yield running


@pytest.mark.kafka
@pytest.mark.slow
def test_the_same_requests_get_the_same_answers_from_kafka_connect(peer: kafka_connect.ConnectWorker,
                                                                    kafka_broker: Broker, tmp_path: Path) -> None:
    """onceflow's distributed worker on a kafka:// store of the same broker (its group on Kafka's group protocol),
    Kafka Connect's distributed worker beside it."""
    for system in ("kafka-connect", "onceflow"):
        (tmp_path / system).mkdir()
        (tmp_path / system / "in.txt").write_text("a\nb\nc\n")
    props = {"store.url": f"kafka://{kafka_broker.bootstrap}/c{free_port()}", "listeners": "http://127.0.0.1:0",
             "group.id": "peer", "heartbeat.interval.ms": "500"}
    steps = rest_scenario.scenario(tmp_path / "onceflow")
    with DistributedWorker(props) as worker, ThreadPoolExecutor(1) as peer_side:  # the two conversations at once
        theirs = peer_side.submit(rest_scenario.run, peer, rest_scenario.scenario(tmp_path / "kafka-connect"))
        mine = rest_scenario.run(client(worker), steps)
    directories = (tmp_path / "onceflow", tmp_path / "kafka-connect")
    assert rest_scenario.differences(steps, mine, theirs.result(), directories) == []
