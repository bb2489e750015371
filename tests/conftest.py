"""Shared fixtures: a fresh store per test, parametrized by backend for the contract suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, AnyStr

import pytest

from onceflow.connector.store import Store, open_store
from onceflow.schemas import serdes

BACKENDS = ["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)]
WORKERS = Path(__file__).parent / "workers"


def _starts_spark(nodeid: str) -> bool:
    """Tests that start Spark: tests/spark (one session per worker) and docs/spark.md's block (a JVM of its own)."""
    return nodeid.startswith("tests/spark/") or "[docs/spark.md:" in nodeid


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist: unknown to a run without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, except that the tests that start Spark are one unit, handed out first: they share one
    worker's Spark session (its start and first query cost ~1 min on a loaded machine), and never run beside
    another Spark JVM (two at once on 2 cores made Spark's Python workers miss its fixed 10 s connect-back limit:
    'Python worker failed to connect back')."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkTogetherFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if _starts_spark(nodeid) else super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if "spark" in self.workqueue:  # the longest unit first: no worker left alone with it at the end
                self.workqueue.move_to_end("spark", last=False)
            super()._assign_work_unit(node)

    return SparkTogetherFirst(config, log)


@pytest.fixture(autouse=True)
def _registry_clients_of_this_test_only() -> Iterator[None]:
    """A test's registry server listens on a port the OS may hand to a later test's: the process's registry
    clients, cached by URL (``serdes.client``), would answer that test's schema ids from this registry's."""
    yield
    serdes.client.cache_clear()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL of a fresh, empty store on each backend (on Kafka: a namespace of its own)."""
    if request.param == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        return f"kafka://{broker.bootstrap}/t{uuid.uuid4().hex[:12]}"
    return f"sqlite://{tmp_path / 'store.db'}"


def skip_on_tansu(store_url: str, request: pytest.FixtureRequest, why: str) -> None:
    """Skip a Kafka-backend test when the peer is Tansu and ``why`` names the documented difference."""
    if store_url.startswith("kafka://") and request.getfixturevalue("kafka_broker").kind == "tansu":
        pytest.skip(why)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """For tests of the embedded store's own mechanisms (its failpoints, its file)."""
    return f"sqlite://{tmp_path / 'store.db'}"


ABORTS_VISIBLE_ON_TANSU = ("Tansu shows aborted transactional writes to read_committed readers (integration/PEER.md), "
                           "so a refused or fenced write may become visible; run against Apache Kafka")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


def run_worker(
    script: str, *args: str, failpoints: str = "", timeout: float = 120, check: bool = True,
    new_session: bool = False, hits_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/workers/<script>.py`` in a fresh interpreter, optionally with failpoints armed (counting hits
    across all its processes in ``hits_dir``), and as a session leader, so a crash-session failpoint kills it
    with its children."""
    env = {**os.environ, "ONCEFLOW_FAILPOINTS": failpoints}
    if hits_dir is not None:
        env["ONCEFLOW_FAILPOINT_HITS_DIR"] = str(hits_dir)
    proc = subprocess.run([sys.executable, str(WORKERS / f"{script}.py"), *args], env=env, text=True,
                          capture_output=True, timeout=timeout, start_new_session=new_session)
    if check and proc.returncode != 0:
        raise AssertionError(f"worker {script} {args} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def start_worker(script: str, *args: str, failpoints: str = "", release: Path | None = None
                 ) -> subprocess.Popen[str]:
    """``tests/workers/<script>.py`` started, with failpoints armed; ``release``: the file that ends a ``pause``
    failpoint (see :func:`wait_paused`)."""
    env = {**os.environ, "ONCEFLOW_FAILPOINTS": failpoints}
    if release is not None:
        env["ONCEFLOW_FAILPOINT_RELEASE"] = str(release)
    return subprocess.Popen([sys.executable, str(WORKERS / f"{script}.py"), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(worker: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for a started worker; (the rest of its stdout, its stderr). Unlike ``communicate()``, which reads
    the pipes' descriptors directly, this keeps the lines an earlier ``next_line`` had already buffered."""
    assert worker.stdout is not None and worker.stderr is not None
    stderr = worker.stderr
    errors: list[str] = []
    drain_stderr = threading.Thread(target=lambda: errors.append(stderr.read()))  # so a full pipe cannot block
    drain_stderr.start()
    with worker:  # closes the pipes
        out = worker.stdout.read()
        worker.wait()
        drain_stderr.join()
    return out, "".join(errors)


def next_line(worker: subprocess.Popen[str]) -> dict[str, object]:
    """The next JSON line a started worker printed; if it exited instead, fail with what it wrote to stderr."""
    assert worker.stdout is not None and worker.stderr is not None
    line = worker.stdout.readline()
    if not line:
        worker.wait(timeout=30)
        raise AssertionError(f"worker {worker.args} exited {worker.returncode}:\n{worker.stderr.read()}")
    result: dict[str, object] = json.loads(line)
    return result


def wait_paused(worker: subprocess.Popen[str], release: Path, timeout: float = 60) -> None:
    """Wait until a started worker is held at a ``pause`` failpoint (it made ``release``'s ``.paused`` twin);
    fail if it exited first or did not get there in time. Creating ``release`` lets it go on."""
    paused = release.with_name(release.name + ".paused")
    deadline = time.monotonic() + timeout
    while not paused.exists():
        if worker.poll() is not None:
            raise AssertionError(f"worker {worker.args} exited {worker.returncode} before its pause")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker {worker.args} did not reach its pause within {timeout} s")
        time.sleep(0.05)


def process_state(pid: int) -> str | None:
    """A process's state letter in /proc/<pid>/stat (R, S, T stopped, Z zombie, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return None


def announcement(stream: IO[AnyStr] | None, marker: AnyStr, lines: int = 200) -> AnyStr:
    """The first line of a starting process's ``stream`` (its stderr) holding ``marker``: a warning logged while it
    starts, by a task or a client thread, may come before the line announcing it serves."""
    assert stream is not None
    seen = []
    for _ in range(lines):
        line = stream.readline()
        if marker in line:
            return line
        if not line:
            break
        seen.append(line)
    raise AssertionError(f"no line with {marker!r} among the first {len(seen)} of the process's output: {seen!r}")
