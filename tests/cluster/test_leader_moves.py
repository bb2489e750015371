"""A running Kafka store whose partition's leader dies: its offset reads and truncations reach the new leader
(librdkafka sends these requests to the leader its metadata names, and a client keeps a dead leader's metadata
until it asks again), while the old leader is down and after it is back as a follower."""

from __future__ import annotations

import time
import uuid

import pytest

from onceflow.connector.store import Record, open_store
from onceflow.integration.brokers import Broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.cluster]


def await_new_leader(cluster: Broker, topic: str, old: int, timeout_s: float = 60) -> int:
    """The node leading ``topic[0]`` once it is not ``old`` (the controller fences a dead node after KRaft's
    broker session timeout)."""
    deadline = time.monotonic() + timeout_s
    while (leader := cluster.leader(topic, 0)) == old:
        assert time.monotonic() < deadline, f"{topic}[0] still led by the dead node {old} after {timeout_s:.0f}s"
        time.sleep(0.5)
    return leader


def test_a_running_store_truncates_and_reads_a_partition_whose_leader_died_and_came_back(
        kafka_cluster: Broker) -> None:
    namespace = f"m{uuid.uuid4().hex[:6]}"
    store = open_store(f"kafka://{kafka_cluster.bootstrap}/{namespace}")
    store.create_stream("events", 1)
    writer = store.open_writer()
    writer.append("events", 0, [Record(None, f"v{i}".encode()) for i in range(10)])
    assert store.truncate_before("events", 0, 2) == 2  # every client of the store has met the leader
    assert store.partition_state("events", 0).start_offset == 2
    leader = kafka_cluster.leader(f"{namespace}.events", 0)
    kafka_cluster.kill(leader)
    try:
        await_new_leader(kafka_cluster, f"{namespace}.events", leader)
        assert store.truncate_before("events", 0, 4) == 4  # the old leader is down
        state = store.partition_state("events", 0)
        assert (state.start_offset, state.end_offset) == (4, 10)
    finally:
        kafka_cluster.start(leader)
    kafka_cluster.wait_until_replicated()  # the old leader is back, a follower now
    assert store.truncate_before("events", 0, 6) == 6
    state = store.partition_state("events", 0)
    assert (state.start_offset, state.end_offset) == (6, 10)
    writer.close()
    store.close()
