"""Distributed workers sharing a group.id: connectors and tasks are split among them through the store's consumer
group, configs and statuses live in streams so any worker answers, concurrent changes through different workers
are all kept, and the work of a worker that leaves or dies moves to the others with nothing lost or repeated."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from onceflow.connect.config_log import SLOTS, ClusterState
from onceflow.connect.connector_config import ConnectorConfig
from onceflow.connect.distributed import DistributedHerder, DistributedWorker
from onceflow.connector import ErrorCode, KafkaException, Producer
from onceflow.connector.store import open_store
from onceflow.connector.store.kafka import KafkaStore
from onceflow.integration.brokers import Broker
from onceflow.integration.kafka_connect import ConnectWorker as RestClient
from tests.conftest import announcement
from tests.connect.conftest import client, wait_until
from tests.connect.sample_plugins import PLUGINS, SPLIT
from tests.connect.test_crash import check_stream, count, start, wait_for
from tests.connect.test_standalone import values

SESSIONS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300",
            "consumer.session.timeout.ms": "2000", "consumer.heartbeat.interval.ms": "300"}
COPY = "onceflow.connect.stream.StreamSinkConnector"
# Apache Kafka refuses sessions shorter than its group.min.session.timeout.ms (6 s)
KAFKA_SESSIONS = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
                  "consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "500"}


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


def test_a_change_appended_while_the_herder_reads_the_configs_is_taken_at_its_next_read(
        cluster_props: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A REST thread's change reads the config stream on (into the config log's state) while another thread may be
    walking that state to follow the configs: a walk is over a copy. The interleaving is forced here: the change is
    appended from inside a walk (its parse of a connector). Before, the walk raised 'dictionary changed size during
    iteration' (in the herder's thread in a red CI; here the PUT answered 500)."""
    worker = DistributedWorker(cluster_props)
    try:
        config = {"connector.class": COPY, "topics": "in"}
        assert client(worker).request("PUT", "/connectors/a/config", config)[0] == 201
        herder = worker.herder
        assert isinstance(herder, DistributedHerder)
        parse = herder.parse
        appended: list[str] = []

        def parse_while_a_change_is_appended(name: str, props: Mapping[str, str]) -> ConnectorConfig:
            if name == "a" and not appended:  # "a" is parsed only in the walk: the PUT below parses "c"
                appended.append(name)
                herder.configs.append(lambda state: [("connector-b", {
                    "properties": {"name": "b", **config}, "slot": state.next_slot, "width": 2})])
            return parse(name, props)

        herder.parse = parse_while_a_change_is_appended  # type: ignore[method-assign]
        assert client(worker).request("PUT", "/connectors/c/config", config)[0] == 201
        assert appended
        assert client(worker).request("GET", "/connectors") == (200, ["a", "b", "c"])
        assert "unexpected error" not in caplog.text  # the walk may have been the herder thread's
    finally:
        worker.close()


def test_a_config_record_that_cannot_be_read_changes_nothing() -> None:
    """Skipped whole (ConfigLog logs it): a connector whose properties were kept without its slot made every
    later tick of the herder fail looking its slot up."""
    state = ClusterState()
    with pytest.raises(ValueError):
        state.apply("connector-a", {"properties": {"connector.class": COPY}, "slot": "not a number"})
    assert state == ClusterState()


def test_the_herder_goes_on_after_an_unexpected_error(cluster_props: dict[str, str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An error that is not the store's (a bug) is logged with its stack and the next tick tries again; it ended
    the herder's thread, leaving a worker that answered requests and ran nothing."""
    worker = DistributedWorker(cluster_props)
    try:
        herder = worker.herder
        assert isinstance(herder, DistributedHerder)
        refresh = herder.status_log.refresh
        failures = [RuntimeError("a bug")]

        def refresh_failing_once() -> bool:
            if failures:
                raise failures.pop()
            return refresh()

        herder.status_log.refresh = refresh_failing_once  # type: ignore[method-assign]
        wait_until(lambda: not failures, "the herder's tick to fail")
        client(worker).request("PUT", "/connectors/after/config", {"connector.class": COPY, "topics": "in"})
        wait_until(lambda: all_running(worker, "after", 1), "the connector created after the error running")
        assert "unexpected error" in caplog.text and "RuntimeError: a bug" in caplog.text
    finally:
        worker.close()


def distributed_cluster(tmp_path: Path, lines: int, store_url: str,
                        sessions: dict[str, str]) -> tuple[list[str], list[str]]:
    """The lines written to ``in.txt``, and the command that starts a distributed worker of group ``cluster`` on
    ``store_url`` (its properties written to ``worker.properties``)."""
    values = [f"line-{i:05d}" for i in range(lines)]
    (tmp_path / "in.txt").write_text("".join(f"{v}\n" for v in values))
    props = {"store.url": store_url, "listeners": "http://127.0.0.1:0", "group.id": "cluster",
             "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter", **sessions}
    (tmp_path / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return values, [sys.executable, "-m", "onceflow.connector.cli", "connect", "distributed",
                    str(tmp_path / "worker.properties")]


def serving_url(announcement: bytes) -> str:
    """The REST address in a worker's announcement ("... serving http://127.0.0.1:PORT, store ...")."""
    return announcement.decode().split("serving ")[1].split(",")[0]


@pytest.mark.crash
def test_a_killed_workers_tasks_move_and_nothing_is_lost_or_repeated(tmp_path: Path) -> None:
    lines = 400
    store_url = f"sqlite://{tmp_path / 'store.db'}"
    values, command = distributed_cluster(tmp_path, lines, store_url, SESSIONS)
    workers = [start(command) for _ in range(2)]
    try:
        urls = [serving_url(announcement(w.stderr, b" serving ")) for w in workers]
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



def start_logged(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A worker whose stderr goes to ``log`` (librdkafka's logs on kafka:// would fill a pipe nobody reads)."""
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=out)


def announced_url(worker: subprocess.Popen[bytes], log: Path) -> str:
    """The REST address the worker announces once it serves."""
    found: list[str] = []

    def announced() -> bool:
        found.extend(line for line in log.read_text(errors="replace").splitlines() if " serving " in line)
        return bool(found)

    wait_for(announced, "the worker serving", worker)
    return serving_url(found[0].encode())


def group_members(bootstrap: str, group: str) -> list[tuple[str, int]]:
    """(member id, partitions assigned) of each member of a Kafka consumer group, if the group is stable."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(30)
    if description.state != ConsumerGroupState.STABLE:
        return []
    return [(m.member_id, len(m.assignment.topic_partitions)) for m in description.members]


@pytest.mark.crash
@pytest.mark.kafka
def test_a_killed_leader_is_replaced_and_the_survivor_takes_new_connectors(tmp_path: Path,
                                                                         kafka_broker: Broker) -> None:
    """On kafka:// the workers' group runs Kafka's classic group protocol, whose leader (the member that joined
    first; it computes the assignment) is the first worker. Killed, the survivor is the group's only member and
    so its leader, owns every slot, takes a new connector at once, and no line is lost or repeated (onceflow has
    no leader of its own: every worker takes every request, as a CAS append to the config stream)."""
    lines = 400
    namespace = f"c{uuid.uuid4().hex[:10]}"
    store_url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    values, command = distributed_cluster(tmp_path, lines, store_url, KAFKA_SESSIONS)
    group = f"{namespace}.cluster"
    workers = [start_logged(command, tmp_path / "leader.log")]
    try:
        rest = [RestClient(announced_url(workers[0], tmp_path / "leader.log"), tmp_path)]
        wait_for(lambda: len(group_members(kafka_broker.bootstrap, group)) == 1, "the leader in its group", workers[0])
        workers.append(start_logged(command, tmp_path / "follower.log"))
        rest.append(RestClient(announced_url(workers[1], tmp_path / "follower.log"), tmp_path))
        wait_for(lambda: len(group_members(kafka_broker.bootstrap, group)) == 2, "the follower joined", workers[1])
        # A connector holding the first 32 slots, so that src and copy land on the other half (the leader's)
        (tmp_path / "empty.txt").write_text("")
        rest[1].request("POST", "/connectors", {"name": "pad", "config": {
            "connector.class": "FileStreamSource", "file": str(tmp_path / "empty.txt"), "topic": "nothing",
            "tasks.max": "31"}})
        rest[1].request("POST", "/connectors", {"name": "src", "config": {
            "connector.class": "FileStreamSource", "file": str(tmp_path / "in.txt"), "topic": "lines",
            "batch.size": "10", "value.converter": "org.apache.kafka.connect.storage.StringConverter"}})
        rest[1].request("POST", "/connectors", {"name": "copy", "config": {"connector.class": COPY,
                                                                            "topics": "lines", "tasks.max": "3"}})
        leader_port = ":" + rest[0].url.rsplit(":", 1)[1]
        wait_for(lambda: any(w.endswith(leader_port) for w in worker_ids(rest[1])), "work on the leader", workers[1])
        leader_id = next(w for w in worker_ids(rest[1]) if w.endswith(leader_port))
        wait_for(lambda: count(store_url, "lines-copy") > 0, "records flowing", workers[1])
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        survivor, survivor_rest = workers[1], rest[1]
        # The dead cannot rejoin: a group of one member is the survivor (it may have rejoined under a new id)
        wait_for(lambda: [n for _, n in group_members(kafka_broker.bootstrap, group)] == [SLOTS],
                 "the survivor the group's only member (its leader), owning every slot", survivor, timeout_s=90)
        wait_for(lambda: leader_id not in worker_ids(survivor_rest), "the leader's work moved", survivor)
        created = survivor_rest.request("POST", "/connectors", {"name": "again", "config": {
            "connector.class": COPY, "topics": "lines", "topic.format": "${topic}-again"}})
        assert created[0] == 201, created
        wait_for(lambda: all_running_at(survivor_rest, "again", 1), "the new connector running", survivor)
        wait_for(lambda: all(count(store_url, s) >= lines for s in ("lines", "lines-copy", "lines-again")),
                 "every line in the three streams", survivor, timeout_s=120)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(timeout=60) == 0
    for stream in ("lines", "lines-copy", "lines-again"):
        report = check_stream(store_url, stream, tmp_path / stream, values)
        assert report.valid, f"{stream}: {report.summary()}"


def worker_ids(rest: RestClient) -> set[str]:
    """The workers running a connector or task of src or copy."""
    found: set[str] = set()
    for name in ("src", "copy"):
        status, body = rest.request("GET", f"/connectors/{name}/status")
        if status == 200:
            found |= {body["connector"]["worker_id"], *(t["worker_id"] for t in body["tasks"])}
    return found


def all_running_at(rest: RestClient, name: str, tasks: int) -> bool:
    status, body = rest.request("GET", f"/connectors/{name}/status")
    return status == 200 and body["connector"]["state"] == "RUNNING" and len(body["tasks"]) == tasks and all(
        t["state"] == "RUNNING" for t in body["tasks"])


@pytest.mark.kafka
def test_the_config_offsets_and_status_topics_are_compacted_on_kafka(tmp_path: Path, kafka_broker: Broker) -> None:
    """As Kafka Connect makes them: under the cluster's default policy Kafka deletes records older than
    retention.ms (7 days), and with them connector configs and source offsets still in force."""
    store_url = f"kafka://{kafka_broker.bootstrap}/k{uuid.uuid4().hex[:10]}"
    worker = DistributedWorker({"store.url": store_url, "listeners": "http://127.0.0.1:0", "group.id": "cluster",
                                **KAFKA_SESSIONS})
    worker.close()
    store = open_store(store_url)
    assert isinstance(store, KafkaStore)
    topics = [store._topic_of(name, 0)[0] for name in ("connect-configs", "connect-offsets", "connect-status")]
    store.close()
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic) for topic in topics])
    policies = {resource.name: future.result(timeout=30)["cleanup.policy"].value
                for resource, future in described.items()}
    assert policies == dict.fromkeys(topics, "compact")



def test_a_task_whose_config_changes_is_fenced_wherever_it_runs_before_the_new_configs_are_published(
        cluster_props: dict[str, str]) -> None:
    """A reconfiguration moves source partition "b" from task 1 to task 0. Each worker stops its changed tasks when
    it reads the new configs, in no order: an instance of task 1 still running on another worker committed its
    poll of "b" after the new task 0 had resumed "b" from the same offset. Here that instance is a producer with
    task 1's transactional id, as the other worker's task 1 has (starting, it fenced this worker's task 1)."""
    connector = {"connector.class": SPLIT, "tasks.max": "2", "count": "10",
                 "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
    with DistributedWorker(cluster_props, PLUGINS) as worker:
        rest = client(worker)
        assert rest.request("POST", "/connectors", {"name": "split", "config": connector})[0] == 201
        wait_until(lambda: all_running(worker, "split", 2), "both tasks running")
        wait_until(lambda: len(values(cluster_props["store.url"], "split")) == 20, "a and b copied")
        elsewhere = Producer({"store.url": cluster_props["store.url"], "transactional.id": "cluster-split-1",
                              "transaction.group": worker.config["transaction.group"]})
        elsewhere.init_transactions()
        elsewhere.begin_transaction()
        elsewhere.produce("split", b"b from the old task 1")
        assert rest.request("PUT", "/connectors/split/config", {**connector, "tasks.max": "1"})[0] == 200
        wait_until(lambda: len(rest.request("GET", "/connectors/split/tasks")[1]) == 1, "the new task configs")
        with pytest.raises(KafkaException) as fenced:
            elsewhere.commit_transaction()
        assert fenced.value.code == ErrorCode.PRODUCER_FENCED, fenced.value
        elsewhere.close()
    assert sorted(values(cluster_props["store.url"], "split")) == sorted(f"{p}{n}" for p in "ab" for n in range(10))
