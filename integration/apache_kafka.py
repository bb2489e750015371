"""Apache Kafka's own broker as local processes: one KRaft node, or a cluster of three, from Maven Central jars.

The jars come from ``integration/kafka/pom.xml`` (``mvn dependency:copy-dependencies`` into a cache directory,
``ONCEFLOW_KAFKA_CACHE`` or ``~/.cache/onceflow``; Maven's local repository keeps the downloads between runs).
Each node is ``kafka.Kafka`` with ``process.roles=broker,controller`` on free loopback ports, its storage
formatted first, with the single-node settings of Kafka's quickstart (offsets and transaction state logs with
replication factor 1, ``group.initial.rebalance.delay.ms=0``). The three-node cluster replicates everything
three times with ``min.insync.replicas=2``, so one node can be SIGKILLed and restarted mid-run.

Costs, measured on a 2-core machine: resolving the jars ~25 s the first time (54 MB), then nothing; a
node answers ~4 s after it starts.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from onceflow.connector.errors import ErrorCode, fail

POM = Path(__file__).parent / "kafka" / "pom.xml"
CACHE_ENV = "ONCEFLOW_KAFKA_CACHE"
NODE_HEAP = "-Xmx768m"

_QUICKSTART = {
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
}
_REPLICATION = {
    1: {"offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1", "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1", "default.replication.factor": "1", "min.insync.replicas": "1"},
    3: {"offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2", "share.coordinator.state.topic.replication.factor": "3",
        "share.coordinator.state.topic.min.isr": "2", "default.replication.factor": "3", "min.insync.replicas": "2"},
}
LOG4J = """rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName={path}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
"""


def kafka_version() -> str:
    """The Kafka release the pom names (its one source)."""
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert found is not None, f"{POM} names no kafka.version"
    return found.group(1)


def available(pom: Path = POM) -> bool:
    """True if this machine can run the broker (or what ``pom`` names): Java, and cached jars or Maven."""
    return shutil.which("java") is not None and (_jars_ready(_cache_dir(pom)) or shutil.which("mvn") is not None)


def _cache_dir(pom: Path) -> Path:
    """One directory per pom and Kafka release: ``kafka-4.3.1`` for the broker, ``kafka_connect-4.3.1``..."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "onceflow")
    return root / f"{pom.parent.name}-{kafka_version()}"


def _jars_ready(cache: Path) -> bool:
    return (cache / ".complete").exists()


def jars(pom: Path = POM) -> Path:
    """The directory holding the jars ``pom`` names (default: the broker's), resolved from Maven Central on
    first use."""
    cache = _cache_dir(pom)
    if _jars_ready(cache):
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:  # test workers starting at once fetch once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _jars_ready(cache):
            _resolve(pom, cache)
    return cache


def _resolve(pom: Path, cache: Path) -> None:
    if shutil.which("mvn") is None:
        fail(ErrorCode.INVALID_CONFIG, f"no Kafka jars in {cache} and no mvn to fetch them (apt-get install maven)")
    done = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={cache}",
         f"-Dkafka.version={kafka_version()}"],  # every pom takes the broker's release
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        fail(ErrorCode._TRANSPORT, f"mvn could not resolve Apache Kafka {kafka_version()}: "
             f"{(done.stdout + done.stderr)[-2000:]}")
    (cache / ".complete").touch()


def producer_perf_test(bootstrap: str, topic: str, records: int, record_size: int) -> tuple[int, float]:
    """Kafka's own ``kafka-producer-perf-test`` (``ProducerPerformance`` in the kafka-tools jar), idempotent,
    ``acks=all``: (records, seconds) as it reports them, a second anchor for raw produce throughput."""
    done = subprocess.run(
        ["java", NODE_HEAP, "-cp", f"{jars()}/*", "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
         "--num-records", str(records), "--record-size", str(record_size), "--throughput", "-1",
         "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "enable.idempotence=true"],
        capture_output=True, text=True, check=False,
    )
    summary = re.search(r"(\d+) records sent, ([\d.]+) records/sec", done.stdout.strip().splitlines()[-1]
                        if done.stdout.strip() else "")
    if done.returncode != 0 or summary is None:
        fail(ErrorCode.UNKNOWN, f"kafka-producer-perf-test failed: {(done.stdout + done.stderr)[-2000:]}")
    sent, rate = int(summary.group(1)), float(summary.group(2))
    return sent, sent / rate


def die_with_parent() -> None:
    """In the node's process before exec: SIGKILL it when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a test run that is killed leaves no broker behind."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _cluster_id() -> str:
    """A random Kafka cluster id (16 bytes, base64url); it may start with '-', hence ``--cluster-id=ID``."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class Node:
    """One KRaft node (broker and controller) of a local cluster: its config, data directory and process."""

    def __init__(self, node_id: int, port: int, controller_port: int, workdir: Path) -> None:
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.dir = workdir / f"node-{node_id}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def configure(self, voters: str, settings: dict[str, str]) -> None:
        """Write server.properties and a log4j2 config that sends the broker's log (WARN+) to a file."""
        self.dir.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.address}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            **settings,
        }
        (self.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.dir / "log4j2.properties").write_text(LOG4J.format(path=self.dir / "broker.log"))

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", NODE_HEAP, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{jars()}/*",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", main, *args]

    def format(self, cluster_id: str) -> None:
        done = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c",
                                         str(self.dir / "server.properties")),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            fail(ErrorCode._FS, f"formatting node {self.node_id}'s storage failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the node's process (its data directory is kept, so a restarted node has its log back)."""
        with open(self.dir / "stdout.log", "ab") as out:
            self.process = subprocess.Popen(self._java("kafka.Kafka", str(self.dir / "server.properties")),
                                            stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def kill(self) -> None:
        """SIGKILL the node (a crash: no controlled shutdown)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL if it takes longer than ``timeout_s``."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None


_REMOVE_AFTER_EXIT = """
import os, shutil, sys, time
pid, path = int(sys.argv[1]), sys.argv[2]
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
time.sleep(2)  # the nodes die with their parent (SIGKILL): let them go first
shutil.rmtree(path, ignore_errors=True)
"""


_OUTLIVING: list[subprocess.Popen[bytes]] = []  # processes left running on purpose: never collected (and warned
# of as "still running") before this process exits


def _remove_after_exit(workdir: Path, nodes: list[Node]) -> None:
    """Remove ``workdir`` once this process has exited (its nodes die with it: PR_SET_PDEATHSIG)."""
    _OUTLIVING.extend(node.process for node in nodes if node.process is not None)
    _OUTLIVING.append(subprocess.Popen([sys.executable, "-c", _REMOVE_AFTER_EXIT, str(os.getpid()), str(workdir)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True))


@contextlib.contextmanager
def cluster(size: int, free_port: Callable[[], int], settings: dict[str, str] | None = None,
            until_exit: bool = False) -> Iterator[list[Node]]:
    """``size`` (1 or 3) formatted and started nodes; stopped and their data removed on exit.

    ``settings``: broker settings on top of the defaults (e.g. ``offsets.retention.minutes`` for a test).
    ``until_exit``: the nodes outlive the ``with`` block and die with this process, their data removed after
    it: a test session's clients still open at its end (cached, or leaked by a test) are destroyed while the
    broker answers, instead of logging a refused connection every few milliseconds until the process ends."""
    if size not in _REPLICATION:
        fail(ErrorCode.INVALID_CONFIG, f"a local Apache Kafka cluster has 1 or 3 nodes, not {size}")
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-kafka-"))
    nodes = [Node(i + 1, free_port(), free_port(), workdir) for i in range(size)]
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)
    cluster_id = _cluster_id()
    try:
        for node in nodes:
            node.configure(voters, {**_QUICKSTART, **_REPLICATION[size], **(settings or {})})
            node.format(cluster_id)
        for node in nodes:
            node.start()
        yield nodes
    except BaseException:
        until_exit = False
        raise
    finally:
        if until_exit:
            _remove_after_exit(workdir, nodes)
        else:
            for node in nodes:
                node.stop()
            shutil.rmtree(workdir, ignore_errors=True)
