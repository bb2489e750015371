"""Distributed workers sharing a group.id: connectors and tasks are split among them through the store's consumer
group, configs and statuses live in streams so any worker answers, concurrent changes through different workers
are all kept, and the work of a worker that leaves or dies moves to the others with nothing lost or repeated."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import pytest

from onceflow.connect.distributed import DistributedWorker
from onceflow.integration.kafka_connect import ConnectWorker as RestClient
from tests.connect.conftest import client, wait_until
from tests.connect.test_crash import check_stream, count, start, wait_for

SESSIONS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300",
            "consumer.session.timeout.ms": "2000", "consumer.heartbeat.interval.ms": "300"}
COPY = "onceflow.connect.stream.StreamSinkConnector"


@pytest.fixture
def cluster_props(worker_props: dict[str, str]) -> dict[str, str]:
    return {**worker_props, "group.id": "cluster", **SESSIONS}


def workers_of(rest_worker: DistributedWorker, name: str) -> set[str]:
    status = client(rest_worker).request("GET", f"/connectors/{name}/status")[1]
    return {status["connector"]["worker_id"], *(t["worker_id"] for t in status["tasks"])}


def all_running(rest_worker: DistributedWorker, name: str, tasks: int) -> bool:
    status, body = client(rest_worker).request("GET", f"/connectors/{name}/status")
    return status == 200 and body["connector"]["state"] == "RUNNING" and len(body["tasks"]) == tasks and all(
        t["state"] == "RUNNING" for t in body["tasks"])


def test_work_is_shared_and_moves_to_the_survivor(cluster_props: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    first, second = DistributedWorker(cluster_props), DistributedWorker(cluster_props)
    try:
        created = client(first).request("POST", "/connectors", {"name": "copy", "config": {
            "connector.class": COPY, "topics": "lines", "tasks.max": "3"}})
        assert created[0] == 201 and created[1]["tasks"] == []  # as Kafka Connect: tasks come later
        client(second).request("POST", "/connectors", {"name": "src", "config": {
            "connector.class": "FileStreamSource", "file": str(tmp_path / "in.txt"), "topic": "lines"}})
        wait_until(lambda: all_running(second, "copy", 3) and all_running(first, "src", 1)
                   and workers_of(first, "copy") == {first.worker_id, second.worker_id},
                   "everything running, the copy's connector and tasks on both workers")
        wait_until(lambda: count(cluster_props["store.url"], "lines-copy") == 100, "the lines copied")
        first.close()
        wait_until(lambda: workers_of(second, "copy") | workers_of(second, "src") == {second.worker_id}
                   and all_running(second, "copy", 3), "the first worker's share moved to the second")
        with open(tmp_path / "in.txt", "a") as more:
            more.write("".join(f"more {i}\n" for i in range(50)))
        wait_until(lambda: count(cluster_props["store.url"], "lines-copy") == 150, "the new lines copied")
    finally:
        first.close()
        second.close()


def test_concurrent_changes_through_different_workers_are_all_kept(cluster_props: dict[str, str],
                                                                   tmp_path: Path) -> None:
    workers = [DistributedWorker(cluster_props), DistributedWorker(cluster_props)]
    try:
        answers: list[tuple[int, object]] = []

        def create(worker: DistributedWorker, names: list[str]) -> None:
            for name in names:
                answers.append(client(worker).request("PUT", f"/connectors/{name}/config", {
                    "connector.class": COPY, "topics": "in", "topic.format": f"out-{name}"}))

        threads = [threading.Thread(target=create, args=(w, [f"c{i}-{n}" for n in range(8)]))
                   for i, w in enumerate(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(status for status, _ in answers) == [201] * 16
        expected = sorted(f"c{i}-{n}" for i in range(2) for n in range(8))
        for worker in workers:
            assert client(worker).request("GET", "/connectors") == (200, expected)
        same = [threading.Thread(target=lambda w=w, i=i: answers.append(client(w).request(
            "PUT", "/connectors/c0-0/config", {"connector.class": COPY, "topics": "in", "topic.format": f"won-{i}"})))
            for i, w in enumerate(workers)]
        for thread in same:
            thread.start()
        for thread in same:
            thread.join()
        assert sorted(status for status, _ in answers[16:]) == [200, 200]
        final = client(workers[1]).request("GET", "/connectors/c0-0/config")[1]
        assert final["topic.format"] in ("won-0", "won-1")
        assert client(workers[0]).request("POST", "/connectors", {"name": "c1-1", "config": {
            "connector.class": COPY, "topics": "in"}}) == (409, {"error_code": 409,
                                                               "message": "Connector c1-1 already exists"})
    finally:
        for worker in workers:
            worker.close()


def serving_url(announcement: bytes) -> str:
    """The REST address in a worker's first stderr line ("... serving http://127.0.0.1:PORT, store ...")."""
    return announcement.decode().split("serving ")[1].split(",")[0]


@pytest.mark.crash
def test_a_killed_workers_tasks_move_and_nothing_is_lost_or_repeated(tmp_path: Path) -> None:
    lines = 400
    values = [f"line-{i:05d}" for i in range(lines)]
    (tmp_path / "in.txt").write_text("".join(f"{v}\n" for v in values))
    store_url = f"sqlite://{tmp_path / 'store.db'}"
    props = {"store.url": store_url, "listeners": "http://127.0.0.1:0", "group.id": "cluster",
             "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter", **SESSIONS}
    (tmp_path / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    command = [sys.executable, "-m", "onceflow.connector.cli", "connect", "distributed",
               str(tmp_path / "worker.properties")]
    workers = [start(command) for _ in range(2)]
    try:
        urls = [serving_url(w.stderr.readline()) for w in workers]  # type: ignore[union-attr]
        rest = [RestClient(url, tmp_path) for url in urls]
        rest[0].request("POST", "/connectors", {"name": "src", "config": {
            "connector.class": "FileStreamSource", "file": str(tmp_path / "in.txt"), "topic": "lines",
            "batch.size": "10", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}})
        rest[1].request("POST", "/connectors", {"name": "copy", "config": {"connector.class": COPY,
                                                                            "topics": "lines"}})
        wait_for(lambda: count(store_url, "lines-copy") > 0, "records flowing", workers[0])
        source_worker = rest[0].request("GET", "/connectors/src/tasks/0/status")[1]["worker_id"]
        doomed = next(i for i, url in enumerate(urls) if url.endswith(source_worker.split(":")[1]))
        workers[doomed].send_signal(signal.SIGKILL)
        workers[doomed].wait()
        survivor = workers[1 - doomed]
        wait_for(lambda: count(store_url, "lines-copy") >= lines and count(store_url, "lines") >= lines,
                 "every line in both streams", survivor)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(timeout=60) == 0
            worker.stderr.close()  # type: ignore[union-attr]
    for stream in ("lines", "lines-copy"):
        report = check_stream(store_url, stream, tmp_path / stream, values)
        assert report.valid, f"{stream}: {report.summary()}"

