"""Consumer-group membership in the store: fair shares, hand-over only after give-up, fenced commits."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

import pytest

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import GroupMember, GroupSettings, PartitionKey, Store, open_store
from onceflow.integration.brokers import FAST_GROUP_CONFIG

SETTINGS = GroupSettings(FAST_GROUP_CONFIG["session.timeout.ms"], 100, FAST_GROUP_CONFIG["max.poll.interval.ms"])
Events = list[tuple[str, frozenset[PartitionKey]]]


@pytest.fixture
def topic(store: Store) -> Store:
    store.create_stream("t", 4)
    return store


Join = Callable[..., GroupMember]


@pytest.fixture
def join(topic: Store) -> Iterator[Join]:
    """Joins group "g" of ``topic``; every member it joined leaves at teardown (leaving twice is harmless): a
    member left open heartbeats, and on Kafka keeps a client connecting, after its test ended."""
    members: list[GroupMember] = []

    def join_group(settings: GroupSettings = SETTINGS) -> GroupMember:
        members.append(topic.join_group("g", settings))
        return members[-1]

    yield join_group
    for member in members:
        member.leave()


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


def test_a_lone_member_owns_everything(join: Join) -> None:
    owned = sync_until({"a": join()}, [], lambda o: len(o["a"]) == 4)
    assert owned["a"] == {("t", p) for p in range(4)}


def test_partitions_move_only_after_their_owner_gave_them_up(join: Join) -> None:
    events: Events = []
    a = join()
    sync_until({"a": a}, events, lambda o: len(o["a"]) == 4)
    b = join()
    owned = sync_until({"a": a, "b": b}, events, lambda o: len(o["a"]) == 2 and len(o["b"]) == 2)
    assert owned["a"].isdisjoint(owned["b"])
    given_up = [i for i, (what, keys) in enumerate(events) if what == "a gave up" and keys & owned["b"]]
    b_owns = [i for i, (what, keys) in enumerate(events) if what == "b owns" and keys & owned["b"]]
    assert given_up and b_owns and given_up[0] < b_owns[0]


def test_a_member_that_stops_polling_is_removed_and_its_commits_are_refused(topic: Store, join: Join) -> None:
    settings = GroupSettings(SETTINGS.session_timeout_ms, 100, SETTINGS.session_timeout_ms)
    zombie = join(settings)
    sync_until({"zombie": zombie}, [], lambda o: len(o["zombie"]) == 4)
    survivor = join(settings)
    sync_until({"survivor": survivor}, [], lambda o: len(o["survivor"]) == 4, timeout=90)  # zombie never syncs
    with pytest.raises(KafkaException) as info:
        zombie.commit({("t", 0): 5})
    assert info.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    assert topic.committed_offsets("g", [("t", 0)]) == {}
    survivor.commit({("t", 0): 7})
    assert topic.committed_offsets("g", [("t", 0)]) == {("t", 0): 7}


def test_committed_offsets_per_group(topic: Store) -> None:
    topic.commit_offsets("g1", {("t", 0): 7, ("t", 1): 3})
    topic.commit_offsets("g2", {("t", 0): 1})
    assert topic.committed_offsets("g1", [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 7, ("t", 1): 3}
    assert topic.committed_offsets("g2", [("t", 0)]) == {("t", 0): 1}


def test_leave_frees_partitions_for_the_rest(join: Join) -> None:
    a, b = join(), join()
    sync_until({"a": a, "b": b}, [], lambda o: len(o["a"]) == 2 and len(o["b"]) == 2)
    a.leave()
    sync_until({"b": b}, [], lambda o: len(o["b"]) == 4)


def test_a_member_that_stops_polling_says_so_once_per_silence(sqlite_url: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The embedded store's keepalive: a member that stopped polling leaves its group with one warning, not one
    per heartbeat for as long as its process lives (1,701 lines in one test run); polling again rejoins."""
    with contextlib.closing(open_store(sqlite_url)) as store:
        store.create_stream("t", 1)
        member = store.join_group("g", GroupSettings(60_000, 20, 1000))
        try:
            for silence in (1, 2):
                sync_until({"m": member}, [], lambda o: len(o["m"]) == 1)
                awaited = f"warning number {silence} that the member left"
                wait_for(lambda n=silence: len(left_warnings(caplog)) >= n, awaited)
                time.sleep(30 * 0.020)  # 30 more heartbeat intervals of the same silence
                assert len(left_warnings(caplog)) == silence
        finally:
            member.leave()


def left_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "did not poll for max.poll.interval.ms" in r.getMessage()]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.01)
