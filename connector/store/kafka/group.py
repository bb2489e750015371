"""Consumer groups on the Kafka backend: Kafka's own group protocol (cooperative-sticky) for membership.

Each member is a confluent-kafka consumer subscribed to the Kafka topics of its streams' epochs. It never
fetches: every partition it is given is paused at once, and records are read through the store. Kafka's
coordinator shares the partitions out and checks each commit's generation; ``give_up`` runs inside the
revoke callback, before the partitions move on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import confluent_kafka as ck

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.store.contract import GiveUp, GroupSettings, PartitionKey
from onceflow.connector.store.kafka.clients import translate

if TYPE_CHECKING:
    from onceflow.connector.store.kafka.store import KafkaStore

log = logging.getLogger(__name__)

_REBALANCED = (ck.KafkaError.ILLEGAL_GENERATION, ck.KafkaError.UNKNOWN_MEMBER_ID, ck.KafkaError.REBALANCE_IN_PROGRESS,
               ck.KafkaError._STATE)


_RETRY_AFTER_REBALANCE = (ck.KafkaError.REBALANCE_IN_PROGRESS, ck.KafkaError.ILLEGAL_GENERATION)

_MEMBERS: weakref.WeakSet[KafkaGroupMember] = weakref.WeakSet()  # this process's members that have not left
_MEMBERS_LOCK = threading.Lock()  # (a WeakSet iterated while another thread adds to it raises)


def owned_here(kafka_group: str, member_id: str) -> frozenset[PartitionKey] | None:
    """The partitions a member of this process owns now, as its rebalance callbacks left them; None if no member
    of this process has that id. A member's own view is current while it is in its group: the coordinator gives a
    partition to another member only once its owner revoked it (cooperative or eager), or once the owner left
    the group (which a look at the group's members tells)."""
    with _MEMBERS_LOCK:
        members = list(_MEMBERS)
    for member in members:
        if member.kafka_group == kafka_group and member.polled_id == member_id:
            return member.owned
    return None


class KafkaGroupMember:
    """One member's session; see the module docstring."""

    def __init__(self, store: KafkaStore, group: str, kafka_group: str, settings: GroupSettings) -> None:
        self._store = store
        self._group = group
        self.kafka_group = kafka_group
        self._settings = settings
        self._consumer = ck.Consumer({
            **store._conf, "group.id": kafka_group, "enable.auto.commit": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": settings.session_timeout_ms,
            "heartbeat.interval.ms": settings.heartbeat_interval_ms,
            "max.poll.interval.ms": settings.max_poll_interval_ms,
        })
        self._topics: dict[str, tuple[str, int]] = {}  # Kafka topic -> (stream, first partition id), subscribed
        self._known: dict[str, tuple[str, int]] = {}  # every one subscribed so far: a revoke may name a topic
        # that is not subscribed any more (its stream was deleted)
        self._owned: set[PartitionKey] = set()
        self._give_up: GiveUp | None = None
        self._leaving = False
        self._revoking = False  # inside the revoke callback: a commit there must not run the group protocol
        self._pending: dict[PartitionKey, int] = {}  # a commit being asked again; a revoke commits its share first
        self._next_refresh = 0.0
        self.polled_id = ""  # its member id as its last poll left it
        with _MEMBERS_LOCK:
            _MEMBERS.add(self)

    @property
    def owned(self) -> frozenset[PartitionKey]:
        """What it owns now: nothing once it began to leave (its partitions may be another member's already)."""
        return frozenset() if self._leaving else frozenset(self._owned)

    @property
    def member_id(self) -> str:
        return self._consumer.memberid() or ""

    def sync(self, topics: Sequence[str], give_up: GiveUp) -> frozenset[PartitionKey]:
        self._give_up = give_up
        if time.monotonic() >= self._next_refresh:
            self._follow(topics)
            self._next_refresh = time.monotonic() + self._settings.heartbeat_interval_ms / 1000
        event = self._consumer.poll(0)  # runs the group protocol and the rebalance callbacks
        self.polled_id = self._consumer.memberid() or ""  # (read by other threads, never while it closes)
        error = event.error() if event is not None else None
        if error is not None and error.fatal():
            raise translate(error, f"group {self._group!r}")
        return frozenset(self._owned)

    def _follow(self, streams: Sequence[str]) -> None:
        """Subscribe to every epoch topic of the streams (again when a stream was scaled)."""
        mapping = self._store._epoch_topics(streams)
        if mapping != self._topics:
            self._topics = mapping
            self._known.update(mapping)
            if mapping:
                self._consumer.subscribe(sorted(mapping), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                         on_lost=self._on_lost)

    def _keys(self, partitions: list[ck.TopicPartition]) -> set[PartitionKey]:
        keys = set()
        for tp in partitions:
            stream, first = self._known[tp.topic]
            keys.add((stream, first + tp.partition))
        return keys

    def _on_assign(self, consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # membership only: records are read through the store
        self._owned |= self._keys(partitions)

    def _on_revoke(self, consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        keys = self._keys(partitions) & self._owned
        self._revoking = True
        try:
            self._commit_pending(keys)
            if keys and self._give_up is not None and not self._leaving:
                self._give_up(frozenset(keys))
        finally:  # gone whatever give_up raised: confluent-kafka unassigns them after a callback that raised
            self._revoking = False
            self._owned -= keys

    def _commit_pending(self, keys: set[PartitionKey]) -> None:
        """Commit the share of a pending commit that a revoke takes away, before the partitions move on.

        The application asked for this commit while it owned the partitions (it processed those records); if the
        partitions left unacknowledged, their next owner would read the records again. Kafka accepts a commit
        from inside the revoke callback: the member's generation is current there."""
        share = {key: offset for key, offset in self._pending.items() if key in keys}
        if not share:
            return
        try:
            self._consumer.commit(offsets=self._store._kafka_offsets(share), asynchronous=False)
        except ck.KafkaException as exc:  # left pending: the caller's commit fails as the partitions are gone
            log.warning("group %r: commit of %s on revoke failed: %s", self._group, sorted(share), exc.args[0])
            return
        for key in share:
            del self._pending[key]

    def _on_lost(self, consumer: ck.Consumer, partitions: list[ck.TopicPartition]) -> None:
        self._owned -= self._keys(partitions)

    def commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        self._check_owned(offsets)
        # A rebalance lasts at most the rebalance timeout (max.poll.interval.ms) after the session noticed it.
        deadline = time.monotonic() + (self._settings.max_poll_interval_ms + self._settings.session_timeout_ms) / 1000
        outer, self._pending = self._pending, dict(offsets)  # outer: a commit from inside a rebalance callback
        try:
            while self._pending:
                try:
                    self._consumer.commit(offsets=self._store._kafka_offsets(self._pending), asynchronous=False)
                    return
                except ck.KafkaException as exc:
                    if not self._may_retry(exc, deadline):
                        self._refuse(exc)
                self._consumer.poll(0.1)  # runs the group protocol: a revoke commits its share of the pending
                self._check_owned(self._pending)
        finally:
            self._pending = outer

    def _check_owned(self, offsets: Mapping[PartitionKey, int]) -> None:
        lost = sorted(set(offsets) - self._owned)
        if lost:
            fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {self._group!r}: member {self.member_id} no longer owns {lost}; "
                 "the group rebalanced and the commit was refused")

    def _may_retry(self, exc: ck.KafkaException, deadline: float) -> bool:
        """True for a commit refused by a rebalance, asked again once this member rejoined: Kafka refuses commits
        during a rebalance (REBALANCE_IN_PROGRESS) and with the generation that preceded it (ILLEGAL_GENERATION),
        although a cooperative rebalance may leave these partitions here (seen on Apache Kafka with three members
        joining and leaving); those it takes away are committed in the revoke callback."""
        return exc.args[0].code() in _RETRY_AFTER_REBALANCE and not self._revoking and time.monotonic() < deadline

    def _refuse(self, exc: ck.KafkaException) -> NoReturn:
        """A commit Kafka refused, as onceflow's error: UNKNOWN_MEMBER_ID when the group moved on."""
        error: Any = exc.args[0]
        if error.code() in _REBALANCED:
            raise KafkaException(KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"group {self._group!r}: the group "
                                            f"rebalanced; commit refused ({error.str()})")) from exc
        raise translate(exc, f"committing offsets of group {self._group!r}") from exc

    def leave(self) -> None:
        """Leave the group: unsubscribe, serve the revoke of every partition, then close.

        Closing a cooperative-sticky consumer while its group rebalances can hang in librdkafka's close (as
        confluentinc/librdkafka#4527; seen here when a Connect worker stopped two sink tasks at once: one close
        hung past 30 s, and the group kept it as a member, refusing an offset reset: 5 of 14 runs of
        tests/connect/test_mirror.py). Unsubscribing first and polling until nothing is assigned, then closing (the
        workaround given in that issue): 0 of 20."""
        if not self._leaving:  # leaving twice is harmless: the second time only closes again (a no-op)
            self._leaving = True
            with contextlib.suppress(ck.KafkaException):  # not subscribed yet: close all the same
                self._consumer.unsubscribe()
                deadline = time.monotonic() + self._settings.session_timeout_ms / 1000
                while self._consumer.assignment() and time.monotonic() < deadline:
                    self._consumer.poll(0.01)  # serves the revoke callback of what is still assigned
        self._owned.clear()
        self._consumer.close()
        with _MEMBERS_LOCK:  # only now: until it closed, the coordinator may still count it a member
            _MEMBERS.discard(self)

