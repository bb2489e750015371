"""A sink's driver or task SIGKILLed at every sink failpoint, on every backend: re-running the batch (as Spark
does after a restart from its checkpoint) publishes it exactly once; a Kafka CAS writer killed after its check
writes nothing."""

from __future__ import annotations

import json
import signal

import pytest

from onceflow.connector.failpoints import FAILPOINTS
from onceflow.connector.store import Store, read_range, read_stream
from tests.conftest import run_worker

pytestmark = pytest.mark.crash

SINK_FAILPOINTS = [name for name in FAILPOINTS if name.startswith("sink.")]


def committed(stdout: str) -> bool:
    answer: bool = json.loads(stdout.splitlines()[-1])["committed"]
    return answer


@pytest.mark.parametrize("failpoint", SINK_FAILPOINTS)
def test_a_batch_rerun_after_a_kill_is_published_exactly_once(store: Store, failpoint: str) -> None:
    store_url = store.url
    store.create_stream("out", 2)
    crashed = run_worker("sink_batch", store_url, "s1", "0", "3", "5", failpoints=f"{failpoint}=crash@1",
                         check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    rerun = committed(run_worker("sink_batch", store_url, "s1", "0", "3", "5").stdout)
    assert rerun is (failpoint != "sink.batch.after_commit")  # committed before the kill: the rerun is a replay
    assert committed(run_worker("sink_batch", store_url, "s1", "1", "2", "5").stdout)
    values = sorted(m.value() or b"" for m in read_stream(store, "out"))
    assert values == sorted(f"b{b}-p{p}-{i}".encode() for b, parts in ((0, 3), (1, 2)) for p in range(parts)
                            for i in range(5))


@pytest.mark.kafka
def test_a_kafka_cas_writer_killed_after_its_check_writes_nothing(store: Store) -> None:
    if not store.url.startswith("kafka"):
        pytest.skip("the Kafka backend's failpoint")
    store_url = store.url
    store.create_stream("t", 1)
    crashed = run_worker("cas_racer", store_url, "t", "zombie", "1", failpoints="kafka.cas.after_check=crash@1",
                         check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert store.partition_state("t", 0).end_offset == 0
    after = [json.loads(line) for line in run_worker("cas_racer", store_url, "t", "next", "1").stdout.splitlines()]
    assert after == [{"value": "next:0", "expected": 0, "error": None, "reason": None, "offset": 0}]
    assert [m.value() for m in read_range(store, "t", 0)] == [b"next:0"]
