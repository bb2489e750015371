"""Shared fixtures: a fresh store per test, parametrized by backend for the contract suite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.store import Store, open_store

BACKENDS = ["sqlite"]
WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL of a fresh, empty store on each backend."""
    return f"sqlite://{tmp_path / 'store.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


def run_worker(
    script: str, *args: str, failpoints: str = "", timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/workers/<script>.py`` in a fresh interpreter, optionally with failpoints armed."""
    env = {**os.environ, "ONCEFLOW_FAILPOINTS": failpoints}
    proc = subprocess.run([sys.executable, str(WORKERS / f"{script}.py"), *args], env=env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"worker {script} {args} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def start_worker(script: str, *args: str, failpoints: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "ONCEFLOW_FAILPOINTS": failpoints}
    return subprocess.Popen([sys.executable, str(WORKERS / f"{script}.py"), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
