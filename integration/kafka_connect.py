"""Apache Kafka Connect itself, as a peer for onceflow's Connect-style worker.

A real Connect worker (distributed mode: its configs, offsets and status in topics of the broker) from Maven
Central jars (``integration/kafka_connect/pom.xml``: ``connect-runtime`` and ``connect-file``, at the broker's
release), started against a test broker with its REST API on a free loopback port. Tests send the same
requests to it and to onceflow's worker and compare status codes and JSON shapes; benchmarks compare
throughput. Costs, measured on a 2-core machine: the jars (36 MB) once, then a worker answers ~10 s after it
starts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from onceflow.connector.errors import ErrorCode, fail
from onceflow.integration import apache_kafka

POM = Path(__file__).parent / "kafka_connect" / "pom.xml"
WORKER_HEAP = "-Xmx512m"
FILE_SOURCE = "org.apache.kafka.connect.file.FileStreamSourceConnector"
FILE_SINK = "org.apache.kafka.connect.file.FileStreamSinkConnector"


def available() -> bool:
    """True if this machine can run a Connect worker (as for the broker: Java, and cached jars or Maven)."""
    return apache_kafka.available(POM)


class ConnectWorker:
    """A running Kafka Connect worker: its REST address and a small client for it."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.dir = workdir

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = 30) -> tuple[int, Any]:
        """(status, decoded JSON body or None) of one REST request; error statuses are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        return status, json.loads(raw) if raw else None

    def wait_for(self, check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """Poll ``check`` until it holds; _TIMED_OUT naming ``what`` if it never does."""
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"Kafka Connect at {self.url}: {what} not within {timeout_s:g}s")
            time.sleep(0.2)


def _worker_properties(bootstrap: str, port: int, name: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": name,
        "config.storage.topic": f"{name}.configs",
        "offset.storage.topic": f"{name}.offsets",
        "status.storage.topic": f"{name}.status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "offset.flush.interval.ms": "1000",
    }


@contextlib.contextmanager
def connect_worker(bootstrap: str, free_port: Callable[[], int], timeout_s: float = 120) -> Iterator[ConnectWorker]:
    """A distributed Kafka Connect worker on ``bootstrap`` (a group of its own), stopped and its files removed
    on exit; yields once its REST API lists connectors (it joined its group)."""
    workdir = Path(tempfile.mkdtemp(prefix="onceflow-connect-"))
    port = free_port()
    properties = _worker_properties(bootstrap, port, f"connect-peer-{uuid.uuid4().hex[:8]}")
    (workdir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    (workdir / "log4j2.properties").write_text(apache_kafka.LOG4J.format(path=workdir / "connect.log"))
    command = ["java", WORKER_HEAP, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
               f"{apache_kafka.jars(POM)}/*", f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
               "org.apache.kafka.connect.cli.ConnectDistributed", str(workdir / "worker.properties")]
    with open(workdir / "stdout.log", "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   preexec_fn=apache_kafka.die_with_parent)
    worker = ConnectWorker(f"http://127.0.0.1:{port}", workdir)
    try:
        worker.wait_for(lambda: _answers(worker, process), "the REST API", timeout_s)
        yield worker
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(worker: ConnectWorker, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        log = (worker.dir / "stdout.log").read_text(errors="replace")[-2000:]
        fail(ErrorCode._TRANSPORT, f"Kafka Connect exited with {process.returncode} before it answered: {log}")
    try:
        return worker.request("GET", "/connectors", timeout_s=5)[0] == 200
    except (OSError, ValueError):
        return False
