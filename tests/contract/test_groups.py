"""Consumer-group membership in the store: fair shares, hand-over only after give-up, fenced commits."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import GroupMember, GroupSettings, PartitionKey, Store
from onceflow.integration.brokers import FAST_GROUP_CONFIG

SETTINGS = GroupSettings(FAST_GROUP_CONFIG["session.timeout.ms"], 100, FAST_GROUP_CONFIG["max.poll.interval.ms"])
Events = list[tuple[str, frozenset[PartitionKey]]]


@pytest.fixture
def topic(store: Store) -> Store:
    store.create_stream("t", 4)
    return store


def sync_until(members: dict[str, GroupMember], events: Events, done: Callable[[dict[str, frozenset]], bool],
               timeout: float = 60) -> dict[str, frozenset[PartitionKey]]:
    """Sync every member until ``done(owned by name)``; records give-ups and first ownerships in ``events``."""
    deadline = time.monotonic() + timeout
    seen: dict[str, frozenset[PartitionKey]] = {}
    while True:
        owned = {}
        for name, member in members.items():
            owned[name] = member.sync(["t"], lambda keys, name=name: events.append((f"{name} gave up", keys)))
            if owned[name] - seen.get(name, frozenset()):
                events.append((f"{name} owns", owned[name] - seen.get(name, frozenset())))
            seen[name] = owned[name]
        if done(owned):
            return owned
        assert time.monotonic() < deadline, f"group never reached the expected state; owned: {owned}"
        time.sleep(0.05)


def test_a_lone_member_owns_everything(topic: Store) -> None:
    member = topic.join_group("g", SETTINGS)
    owned = sync_until({"a": member}, [], lambda o: len(o["a"]) == 4)
    assert owned["a"] == {("t", p) for p in range(4)}
    member.leave()


def test_partitions_move_only_after_their_owner_gave_them_up(topic: Store) -> None:
    events: Events = []
    a = topic.join_group("g", SETTINGS)
    sync_until({"a": a}, events, lambda o: len(o["a"]) == 4)
    b = topic.join_group("g", SETTINGS)
    owned = sync_until({"a": a, "b": b}, events, lambda o: len(o["a"]) == 2 and len(o["b"]) == 2)
    assert owned["a"].isdisjoint(owned["b"])
    given_up = [i for i, (what, keys) in enumerate(events) if what == "a gave up" and keys & owned["b"]]
    b_owns = [i for i, (what, keys) in enumerate(events) if what == "b owns" and keys & owned["b"]]
    assert given_up and b_owns and given_up[0] < b_owns[0]
    a.leave()
    b.leave()


def test_a_member_that_stops_polling_is_removed_and_its_commits_are_refused(topic: Store) -> None:
    settings = GroupSettings(SETTINGS.session_timeout_ms, 100, SETTINGS.session_timeout_ms)
    zombie = topic.join_group("g", settings)
    sync_until({"zombie": zombie}, [], lambda o: len(o["zombie"]) == 4)
    survivor = topic.join_group("g", settings)
    sync_until({"survivor": survivor}, [], lambda o: len(o["survivor"]) == 4, timeout=90)  # zombie never syncs
    with pytest.raises(KafkaException) as info:
        zombie.commit({("t", 0): 5})
    assert info.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    assert topic.committed_offsets("g", [("t", 0)]) == {}
    survivor.commit({("t", 0): 7})
    assert topic.committed_offsets("g", [("t", 0)]) == {("t", 0): 7}
    survivor.leave()


def test_committed_offsets_per_group(topic: Store) -> None:
    topic.commit_offsets("g1", {("t", 0): 7, ("t", 1): 3})
    topic.commit_offsets("g2", {("t", 0): 1})
    assert topic.committed_offsets("g1", [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 7, ("t", 1): 3}
    assert topic.committed_offsets("g2", [("t", 0)]) == {("t", 0): 1}


def test_leave_frees_partitions_for_the_rest(topic: Store) -> None:
    a, b = topic.join_group("g", SETTINGS), topic.join_group("g", SETTINGS)
    sync_until({"a": a, "b": b}, [], lambda o: len(o["a"]) == 2 and len(o["b"]) == 2)
    a.leave()
    sync_until({"b": b}, [], lambda o: len(o["b"]) == 4)
    b.leave()
