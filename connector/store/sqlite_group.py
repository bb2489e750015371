"""Consumer groups on the embedded store: membership rows, one owner row per partition, a hand-over protocol.

A member renews its session row (from a background thread every ``heartbeat_interval_ms``); one whose row
is older than ``session_timeout_ms`` is removed, with its partitions. Each sync computes the target share
(each topic's partitions, every epoch's, round-robin over the members subscribed to it, by member id). A
member takes a partition only when no owner row holds it, and gives one up (``give_up``, then deletes its
row) when the target moves it elsewhere: a graceful hand-over never has two owners.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store.contract import (
    GiveUp,
    GroupDescription,
    GroupMemberDescription,
    GroupSettings,
    PartitionKey,
)

if TYPE_CHECKING:
    from onceflow.connector.store.sqlite import SqliteStore

log = logging.getLogger(__name__)
_REBALANCE_SYNC_S = 0.05


def now_ms() -> int:
    return int(time.time() * 1000)


class SqliteGroupMember:
    """One member's session; see the module docstring."""

    def __init__(self, store: SqliteStore, group: str, settings: GroupSettings) -> None:
        self._store = store
        self._group = group
        self._settings = settings
        self._member_id = _new_member_id()
        self._owned: frozenset[PartitionKey] = frozenset()
        self._next_sync = 0.0
        self._last_sync = time.monotonic()
        self._left_at: float | None = None  # the _last_sync after which the keepalive made this member leave
        self._joined = False  # its row was written once: a sync that finds it gone finds the session ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keepalive_loop, daemon=True, name=f"onceflow-{self._member_id}")
        self._thread.start()

    @property
    def member_id(self) -> str:
        return self._member_id

    def sync(self, topics: Sequence[str], give_up: GiveUp) -> frozenset[PartitionKey]:
        now = time.monotonic()
        self._last_sync = now
        if now < self._next_sync:
            return self._owned
        with self._store._write() as db:
            owned, target = self._heartbeat(db, topics)
        revoke = frozenset(owned - target)
        if revoke:
            give_up(revoke)
            with self._store._write() as db:
                db.executemany(
                    "DELETE FROM group_owners WHERE group_id = ? AND stream = ? AND partition = ? AND member_id = ?",
                    [(self._group, s, p, self._member_id) for s, p in revoke])
        self._owned = frozenset(owned - revoke)
        settled = not revoke and owned >= target
        interval = self._settings.heartbeat_interval_ms / 1000
        self._next_sync = time.monotonic() + (interval if settled else min(interval, _REBALANCE_SYNC_S))
        return self._owned

    def _heartbeat(self, db: sqlite3.Connection, topics: Sequence[str]) -> tuple[set[PartitionKey], set[PartitionKey]]:
        """Renew this member, drop expired ones, take free partitions of its share; (owned, target).

        A member whose row is gone (it stopped polling, or another member found its session expired) owns
        nothing after this sync, and takes nothing in it: its partitions may have been read and committed by
        others since, so the application is told they were lost, and reads them again from the committed
        offsets once the next sync gives them back."""
        now = now_ms()
        ended = self._joined and db.execute("SELECT 1 FROM group_members WHERE group_id = ? AND member_id = ?",
                                            (self._group, self._member_id)).fetchone() is None
        if ended:
            # Under a new id, as a Kafka member the coordinator forgot: what the application sends with the old
            # one (ConsumerGroupMetadata taken before) is refused even once this member owns the partitions again.
            renewed = _new_member_id()
            log.warning("member %s's session in group %s had ended; it joins again as %s, its partitions lost",
                        self._member_id, self._group, renewed)
            self._member_id = renewed
        self._joined = True
        db.execute(
            "INSERT OR REPLACE INTO group_members (group_id, member_id, topics, heartbeat_ms, session_timeout_ms) "
            "VALUES (?,?,?,?,?)",
            (self._group, self._member_id, json.dumps(sorted(set(topics))), now, self._settings.session_timeout_ms))
        for (dead,) in db.execute("SELECT member_id FROM group_members WHERE group_id = ? AND "
                                  "heartbeat_ms + session_timeout_ms < ?", (self._group, now)).fetchall():
            remove_member(db, self._group, dead)
        members = db.execute("SELECT member_id, topics FROM group_members WHERE group_id = ? ORDER BY member_id",
                             (self._group,)).fetchall()
        target = _target_assignment(db, members).get(self._member_id, set())
        owners = {(s, p): m for s, p, m in db.execute(
            "SELECT stream, partition, member_id FROM group_owners WHERE group_id = ?", (self._group,))}
        owned = {tp for tp, m in owners.items() if m == self._member_id}
        acquire = set() if ended else {tp for tp in target - owned if tp not in owners}
        db.executemany("INSERT INTO group_owners (group_id, stream, partition, member_id) VALUES (?,?,?,?)",
                       [(self._group, s, p, self._member_id) for s, p in acquire])
        return owned | acquire, target

    def commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        with self._store._write() as db:
            check_owner(db, self._group, self._member_id, offsets)
            write_offsets(db, self._group, offsets)

    def leave(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._store._write() as db:
            remove_member(db, self._group, self._member_id)
        self._owned = frozenset()

    def _keepalive_loop(self) -> None:
        """Renew the session; leave the group when the application stopped syncing (polling).

        It leaves (and says so) once per silence: until the next sync rejoins, there is nothing to renew.
        """
        interval = self._settings.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            if self._last_sync == self._left_at:
                continue
            try:
                with self._store._write() as db:
                    last_sync = self._last_sync
                    if time.monotonic() - last_sync > self._settings.max_poll_interval_ms / 1000:
                        log.warning("member %s did not poll for max.poll.interval.ms; leaving group %s",
                                    self._member_id, self._group)
                        remove_member(db, self._group, self._member_id)
                        self._next_sync = 0.0
                        self._left_at = last_sync
                    else:
                        db.execute("UPDATE group_members SET heartbeat_ms = ? WHERE group_id = ? AND member_id = ?",
                                   (now_ms(), self._group, self._member_id))
            except KafkaException as exc:  # the next sync rejoins and reports what was lost
                log.warning("heartbeat of member %s failed: %s", self._member_id, exc)


def _new_member_id() -> str:
    """A member id no session of any group had before."""
    return f"member-{uuid.uuid4().hex}"


def check_owner(db: sqlite3.Connection, group: str, member_id: str, partitions: Iterable[PartitionKey]) -> None:
    """UNKNOWN_MEMBER_ID unless ``member_id`` owns each of ``partitions`` in ``group`` now."""
    owned = set(db.execute("SELECT stream, partition FROM group_owners WHERE group_id = ? AND member_id = ?",
                           (group, member_id)))
    lost = sorted(set(partitions) - owned)
    if lost:
        fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group!r}: member {member_id} no longer owns {lost}; the group "
             "rebalanced and the commit was refused")


def write_offsets(db: sqlite3.Connection, group: str, offsets: Mapping[PartitionKey, int]) -> None:
    db.executemany("INSERT OR REPLACE INTO group_offsets (group_id, stream, partition, next_offset) VALUES (?,?,?,?)",
                   [(group, s, p, o) for (s, p), o in offsets.items()])
    failpoint("sqlite.group.after_commit_offsets")


def committed_in(db: sqlite3.Connection, group: str, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
    """A group's committed next offsets of ``partitions`` (those without one are absent)."""
    wanted = set(partitions)
    rows = db.execute("SELECT stream, partition, next_offset FROM group_offsets WHERE group_id = ?", (group,))
    return {(str(s), int(p)): int(o) for s, p, o in rows if (s, p) in wanted}


def remove_member(db: sqlite3.Connection, group: str, member_id: str) -> None:
    db.execute("DELETE FROM group_members WHERE group_id = ? AND member_id = ?", (group, member_id))
    db.execute("DELETE FROM group_owners WHERE group_id = ? AND member_id = ?", (group, member_id))


def _target_assignment(db: sqlite3.Connection, members: list[tuple[str, str]]) -> dict[str, set[PartitionKey]]:
    """Round-robin each topic's partitions (every epoch's) over the members subscribed to it, by member id."""
    subscribers: dict[str, list[str]] = {}
    for member_id, topics_json in members:
        for topic in json.loads(topics_json):
            subscribers.setdefault(topic, []).append(member_id)
    target: dict[str, set[PartitionKey]] = {}
    for topic, subscribed in subscribers.items():
        rows = db.execute("SELECT p.partition FROM partitions p JOIN streams s USING (stream_id) "
                          "WHERE s.name = ? ORDER BY p.partition", (topic,)).fetchall()
        for i, (partition,) in enumerate(rows):
            target.setdefault(subscribed[i % len(subscribed)], set()).add((topic, int(partition)))
    return target


def group_names(db: sqlite3.Connection) -> list[str]:
    """Groups with live members or committed offsets (expired members count as gone, as their sessions are)."""
    rows = db.execute("SELECT group_id FROM group_members WHERE heartbeat_ms + session_timeout_ms >= ? "
                      "UNION SELECT group_id FROM group_offsets ORDER BY 1", (now_ms(),))
    return [str(name) for (name,) in rows]


def describe_in(db: sqlite3.Connection, group: str) -> GroupDescription:
    """A group's live members with what each owns, and its committed offsets."""
    live = [str(m) for (m,) in db.execute(
        "SELECT member_id FROM group_members WHERE group_id = ? AND heartbeat_ms + session_timeout_ms >= ? "
        "ORDER BY member_id", (group, now_ms()))]
    owned: dict[str, list[PartitionKey]] = {m: [] for m in live}
    for stream, partition, member in db.execute(
            "SELECT stream, partition, member_id FROM group_owners WHERE group_id = ? ORDER BY stream, partition",
            (group,)):
        if member in owned:
            owned[member].append((str(stream), int(partition)))
    members = tuple(GroupMemberDescription(m, m, "localhost", tuple(owned[m])) for m in live)
    offsets = {(str(s), int(p)): int(o) for s, p, o in db.execute(
        "SELECT stream, partition, next_offset FROM group_offsets WHERE group_id = ?", (group,))}
    return GroupDescription(group, members, offsets)


def delete_in(db: sqlite3.Connection, group: str) -> None:
    """Forget an empty group (its expired members' rows too); see ``Store.delete_group``."""
    description = describe_in(db, group)
    if description.members:
        fail(ErrorCode.NON_EMPTY_GROUP, f"group {group!r} has {len(description.members)} live members; it can be "
             "deleted once they left")
    if not description.offsets:
        fail(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist")
    for table in ("group_members", "group_owners", "group_offsets"):
        db.execute(f"DELETE FROM {table} WHERE group_id = ?", (group,))
