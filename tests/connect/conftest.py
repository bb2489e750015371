"""Fixtures for the Connect worker's tests: a worker config on a fresh embedded store, and REST helpers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.integration.kafka_connect import ConnectWorker as RestClient


@pytest.fixture
def worker_props(tmp_path: Path) -> dict[str, str]:
    """A standalone worker on a fresh embedded store, its REST API on a free port, offsets flushed often, sink
    consumers that see new streams within 0.3 s."""
    return {"store.url": f"sqlite://{tmp_path / 'store.db'}", "listeners": "http://127.0.0.1:0",
            "offset.flush.interval.ms": "200", "consumer.heartbeat.interval.ms": "300"}


@pytest.fixture
def worker(worker_props: dict[str, str]) -> Iterator[ConnectWorker]:
    with ConnectWorker(worker_props) as running:
        yield running


def client(worker: ConnectWorker) -> RestClient:
    """The REST client the harness uses for Apache Kafka Connect, pointed at onceflow's worker."""
    return RestClient(worker.url, Path("."))


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` if it never does."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g}s")
        time.sleep(0.05)


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
