"""Consumer-group coordination in the store: fair shares, hand-over only after release, fenced commits."""

from __future__ import annotations

import time

import pytest

from connector import ErrorCode, KafkaException
from connector.store import Store
from tests.conftest import skip_without_groups


@pytest.fixture
def topic(store: Store) -> Store:
    skip_without_groups(store.url)
    store.create_stream("t", 4)
    return store


def test_a_lone_member_owns_everything(topic: Store) -> None:
    a = topic.group_heartbeat("g", "a", ["t"], 10_000)
    assert a.owned == {("t", p) for p in range(4)} and not a.revoke and not a.pending


def test_a_partition_moves_only_after_its_owner_releases_it(topic: Store) -> None:
    topic.group_heartbeat("g", "a", ["t"], 10_000)
    b = topic.group_heartbeat("g", "b", ["t"], 10_000)
    assert b.owned == frozenset() and len(b.pending) == 2  # still held by a
    a = topic.group_heartbeat("g", "a", ["t"], 10_000)
    assert a.revoke == b.pending
    topic.group_release("g", "a", a.revoke)
    b = topic.group_heartbeat("g", "b", ["t"], 10_000)
    assert b.owned == a.revoke and not b.pending
    assert topic.group_heartbeat("g", "a", ["t"], 10_000).owned.isdisjoint(b.owned)


def test_an_expired_member_loses_its_partitions_and_its_commits_are_refused(topic: Store) -> None:
    topic.group_heartbeat("g", "zombie", ["t"], 50)
    time.sleep(0.1)  # let the zombie's session expire
    b = topic.group_heartbeat("g", "b", ["t"], 10_000)
    assert len(b.owned) == 4
    with pytest.raises(KafkaException) as info:
        topic.commit_offsets("g", {("t", 0): 5}, member_id="zombie")
    assert info.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    assert topic.committed_offsets("g", [("t", 0)]) == {}
    assert not topic.group_keepalive("g", "zombie")


def test_committed_offsets_per_group(store: Store) -> None:
    store.create_stream("t", 4)
    topic = store
    topic.commit_offsets("g1", {("t", 0): 7, ("t", 1): 3})
    topic.commit_offsets("g2", {("t", 0): 1})
    assert topic.committed_offsets("g1", [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 7, ("t", 1): 3}
    assert topic.committed_offsets("g2", [("t", 0)]) == {("t", 0): 1}


def test_leave_frees_partitions_for_the_rest(topic: Store) -> None:
    topic.group_heartbeat("g", "a", ["t"], 10_000)
    topic.group_heartbeat("g", "b", ["t"], 10_000)
    topic.group_leave("g", "a")
    assert len(topic.group_heartbeat("g", "b", ["t"], 10_000).owned) == 4
