"""A standalone worker SIGKILLed mid-transaction and started again: every line of the source file is in the stream
and in its exactly-once copy once, none lost, none twice (checked with the history checker).

The worker runs ``onceflow connect standalone`` with a FileStreamSource (file -> ``lines``) and a StreamSink
(``lines`` -> ``lines-copy``); a failpoint kills it at a step of a transaction (a one-step commit stored but not
reported, a COMMIT in the log before its merge, a task's producer just after it fenced its predecessor), or the
test kills it at an arbitrary moment once records flow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.connector.store import open_store, read_stream
from onceflow.integration import checker, history
from tests.conftest import announcement

pytestmark = pytest.mark.crash

LINES = 400
STAGED = {"producer.batch.num.messages": "10"}  # transactions bigger than this are staged before their COMMIT
# The killed worker's sink consumer keeps its partitions until its session expires: a short one.
FAST_SESSIONS = {"consumer.session.timeout.ms": "2000", "consumer.heartbeat.interval.ms": "300"}


def write_config(directory: Path, store_url: str, worker_extra: dict[str, str]) -> list[str]:
    """The worker's and connectors' properties files; the command line that runs them."""
    files = {
        "worker.properties": {"store.url": store_url, "listeners": "http://127.0.0.1:0",
                              "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
                              "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
                              **FAST_SESSIONS, **worker_extra},
        "source.properties": {"name": "src", "connector.class": "FileStreamSource", "topic": "lines",
                              "file": str(directory / "in.txt"), "batch.size": "25",
                              "value.converter": "org.apache.kafka.connect.storage.StringConverter"},
        "copy.properties": {"name": "copy", "connector.class": "onceflow.connect.stream.StreamSinkConnector",
                            "topics": "lines", "topic.format": "${topic}-copy"},
    }
    for name, props in files.items():
        (directory / name).write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return [sys.executable, "-m", "onceflow.connector.cli", "connect", "standalone",
            *(str(directory / name) for name in files)]


def start(command: list[str], failpoints: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, "ONCEFLOW_FAILPOINTS": failpoints}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def count(store_url: str, stream: str) -> int:
    store = open_store(store_url)
    try:
        return sum(1 for _ in read_stream(store, stream)) if stream in store.list_streams() else 0
    finally:
        store.close()


def wait_for(check: object, what: str, worker: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if worker.poll() is not None:
            raise AssertionError(f"{what}: the worker exited {worker.returncode}: {worker.stderr.read()!r}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.1)


def check_stream(store_url: str, stream: str, directory: Path, values: list[str]) -> checker.Report:
    """Each input line as a committed write to ``stream``; one reader of the whole stream."""
    directory.mkdir()
    recorder = history.Recorder(directory, "pipeline")
    for value in values:
        recorder.ok(recorder.invoke("txn", txn=value, writes=[[stream, value]]), outcome="committed")
    store = open_store(store_url)
    try:
        seen = [[stream, m.partition(), m.offset(), (m.value() or b"").decode()] for m in read_stream(store, stream)]
    finally:
        store.close()
    recorder.read("reader", seen, complete=[stream])
    recorder.close()
    return checker.check(history.load(directory))


@pytest.mark.parametrize(("failpoint", "worker_extra"), [
    ("txn.commit.after_one_step=crash@9", {}),
    ("txn.commit.after_commit_record=crash@6", STAGED),
    ("producer.init.after_fence=crash@2", {}),
    ("", {}),  # killed by the test once records flow
])
def test_a_worker_killed_mid_transaction_loses_and_repeats_nothing(tmp_path: Path, failpoint: str,
                                                                   worker_extra: dict[str, str]) -> None:
    values = [f"line-{i:05d}" for i in range(LINES)]
    (tmp_path / "in.txt").write_text("".join(f"{v}\n" for v in values))
    store_url = f"sqlite://{tmp_path / 'store.db'}"
    command = write_config(tmp_path, store_url, worker_extra)
    doomed = start(command, failpoint)
    if failpoint:
        assert doomed.wait(timeout=60) == -signal.SIGKILL, doomed.stderr.read()  # type: ignore[union-attr]
    else:
        wait_for(lambda: count(store_url, "lines-copy") > 0, "records flowing", doomed)
        doomed.kill()
        doomed.wait()
    doomed.stderr.close()  # type: ignore[union-attr]
    survivor = start(command)
    announcement(survivor.stderr, b" serving ")  # up, its SIGTERM handler set
    try:
        wait_for(lambda: count(store_url, "lines-copy") >= LINES and count(store_url, "lines") >= LINES,
                 "every line in both streams", survivor)
    finally:
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=60) == 0, survivor.stderr.read()  # type: ignore[union-attr]
        survivor.stderr.close()  # type: ignore[union-attr]
    for stream in ("lines", "lines-copy"):
        report = check_stream(store_url, stream, tmp_path / stream, values)
        assert report.valid, f"{stream}: {report.summary()}"
        assert report.operations == {"txn ok": LINES, "read ok": 1}
