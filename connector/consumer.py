"""``Consumer``: confluent-kafka's consumer API on any onceflow store.

Consumer groups: members in any processes share the subscribed topics' partitions, through the store's
group protocol (:class:`onceflow.connector.store.GroupMember`; Kafka's own on the Kafka backend). Rebalancing is
incremental (as the cooperative protocol): ``on_assign`` gets the partitions gained, ``on_revoke`` those
given up, ``on_lost`` those taken away after this member's session expired. A partition passes to its new
owner only after the old one committed it, so a graceful hand-over delivers no record twice. Rebalances are
acted on in :meth:`poll`; a member that does not poll for ``max.poll.interval.ms`` leaves its group.

Scaled streams: a partition of a newer epoch is read only after every partition it succeeds was read to
its end (by this consumer, or, in a group, committed by the group), so per-key order holds across a scale.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onceflow.connector.config import ClientEvents, ConsumerConfig, build
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.fetched import Fetched
from onceflow.connector.generations import MemberGenerations
from onceflow.connector.message import Message
from onceflow.connector.store import (
    GroupMember,
    GroupSettings,
    PartitionKey,
    PartitionState,
    StreamDescription,
    open_store,
)
from onceflow.connector.topic import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    ClusterMetadata,
    ConsumerGroupMetadata,
    TopicPartition,
    cluster_metadata,
)
from onceflow.txn.stable_offsets import StableOffsets

log = logging.getLogger(__name__)

RebalanceCallback = Callable[["Consumer", list[TopicPartition]], Any]
_FETCH_MAX_RECORDS = 10_000
_FETCH_PASS_S = 0.1  # a fetch pass over the partitions yields to group upkeep after this long
_IDLE_WAIT_MAX_S = 0.05


def _offsets_given(doing: str, code: ErrorCode, message: Message | None,
                   offsets: list[TopicPartition] | None) -> dict[PartitionKey, int] | None:
    """The next offsets to read after ``message``, or ``offsets`` as given; None if neither was given."""
    if message is not None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if message.error() is not None or topic is None or partition is None or offset is None:
            fail(code, f"{doing}(message=...) needs a record, not an error event")
        return {(topic, partition): offset + 1}
    if offsets is not None:
        bad = [tp for tp in offsets if tp.offset < 0]
        if bad:
            fail(code, f"{doing}(offsets=...) needs offsets >= 0, got {bad}")
        return {(tp.topic, tp.partition): tp.offset for tp in offsets}
    return None


def _tps(keys: Iterable[PartitionKey]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(keys)]


class Consumer:
    """Reads records from a store's streams; see the module docstring."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = build(ConsumerConfig, config, "consumer")
        if not self._config.group_id:
            # As confluent-kafka, which raises "group.id must be set": a consumer that only assign()s needs one too.
            fail(ErrorCode.INVALID_CONFIG, "consumer config needs group.id (confluent-kafka refuses a Consumer "
                 "without one too); a consumer that only assign()s partitions may use any name")
        self._events = ClientEvents(self._config.client, self._config.client_id, "consumer", log)
        self._store = open_store(self._config.store)
        self._member: GroupMember | None = None
        self._generations: MemberGenerations | None = None  # while subscribed
        self._received: dict[PartitionKey, list[int]] = {}  # records and bytes returned, for stats_cb
        self._committed: dict[PartitionKey, int] = {}  # what this consumer last committed, for stats_cb
        self._positions: dict[PartitionKey, int | None] = {}  # next offset to deliver; None: not yet known
        self._stored: dict[PartitionKey, int] = {}  # store_offsets(), when enable.auto.offset.store is false
        self._fetch_offsets: dict[PartitionKey, int] = {}
        self._fetched = Fetched()
        self._paused: set[PartitionKey] = set()
        self._ready: set[PartitionKey] = set()  # successors whose predecessors were read to the end
        self._skipped: set[PartitionKey] = set()  # sealed partitions a first reset to their end skipped whole
        self._finished: dict[PartitionKey, int] = {}  # sealed partitions started at their end, to commit it
        self._eof_sent: dict[PartitionKey, int] = {}
        self._streams: dict[str, StreamDescription] = {}
        self._subscription: list[str] = []
        self._callbacks: dict[str, RebalanceCallback | None] = {}
        self._next_auto_commit = time.monotonic() + self._config.auto_commit_interval_ms / 1000
        self._closed = False
        self._rotation = 0
        # Transaction groups that commit this group's offsets, rolled forward before offsets are read: at the first
        # read after partitions are gained, and at each committed().
        self._stable = StableOffsets(self._store, self._config.store)
        self._unsettled = True

    # -- assignment ---------------------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join ``group.id`` for these topics (a name starting with ``^`` is a regular expression)."""
        self._check_open()
        self._group_id()
        if not topics or not all(isinstance(t, str) for t in topics):
            fail(ErrorCode.INVALID_CONFIG, f"subscribe() needs a non-empty list of topic names, got {topics!r}")
        if self._positions and not self._subscription:
            fail(ErrorCode._STATE, "subscribe() after assign(): call unassign() first")
        self._subscription = list(topics)
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        if self._member is None:
            config = self._config
            self._member = self._store.join_group(self._group_id(), GroupSettings(
                config.session_timeout_ms, config.heartbeat_interval_ms, config.max_poll_interval_ms))
            self._generations = MemberGenerations(self._group_id())

    def unsubscribe(self) -> None:
        """Leave the group, committing positions first if auto-commit is on. The member leaves even if the revoke
        callback or that commit fails: a member left behind would hold its partitions (and keep the group
        non-empty, so its offsets cannot be reset) until its session or poll interval ran out."""
        if self._member is not None:
            try:
                self._drop(set(self._positions), "revoke", commit=True)
            finally:
                self._member.leave()
                self._member = None
                if self._generations is not None:
                    self._generations.left()
                    self._generations = None
                self._subscription = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Read exactly these partitions (no group membership); offsets < 0 start from committed/reset."""
        self._check_open()
        if self._subscription:
            fail(ErrorCode._STATE, "assign() while subscribed: call unsubscribe() first")
        self._add(partitions, replacing=True)

    def unassign(self) -> None:
        self._ready.clear()
        self._skipped.clear()
        self._positions.clear()
        self._stored.clear()
        self._fetch_offsets.clear()
        self._fetched.clear()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Add ``partitions`` to the assignment, as :meth:`assign` would start them, keeping the others."""
        self._check_open()
        if self._subscription:
            fail(ErrorCode._STATE, "incremental_assign() while subscribed: the group assigns the partitions")
        already = sorted({(tp.topic, tp.partition) for tp in partitions} & set(self._positions))
        if already:
            fail(ErrorCode._CONFLICT, f"incremental_assign: {already} already assigned")
        self._add(partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """Remove ``partitions`` from the assignment (records of theirs not yet returned are dropped)."""
        self._check_open()
        keys = {(tp.topic, tp.partition) for tp in partitions}
        missing = sorted(keys - set(self._positions))
        if missing:
            fail(ErrorCode._INVALID_ARG, f"incremental_unassign: {missing} not assigned")
        self._drop(keys, "unassign", commit=False)

    def assignment(self) -> list[TopicPartition]:
        return _tps(self._positions)

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop handing out records of ``partitions``, those already fetched of them included (librdkafka drops
        them: an application that pauses for backpressure and keeps polling would lose them), until resumed."""
        keys = {(tp.topic, tp.partition) for tp in partitions}
        self._paused |= keys
        self._refetch(keys & set(self._positions))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._paused -= {(tp.topic, tp.partition) for tp in partitions}

    def memberid(self) -> str | None:
        return self._member.member_id if self._member is not None else None

    # -- reading --------------------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record (or error event), or None once ``timeout`` seconds passed with none."""
        messages = self._consume(1, timeout)
        return messages[0] if messages else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records; waits at most ``timeout`` seconds (-1: forever) for the first.

        ``num_messages=0`` returns [] at once, as confluent-kafka does."""
        if not isinstance(num_messages, int) or not 0 <= num_messages <= 1_000_000:
            fail(ErrorCode.INVALID_CONFIG, f"num_messages must be 0..1000000, got {num_messages!r}")
        if num_messages == 0:
            self._check_open()
            return []
        return self._consume(num_messages, timeout)

    def _consume(self, limit: int, timeout: float | None) -> list[Message]:
        self._check_open()
        forever = timeout is None or timeout < 0
        deadline = time.monotonic() + (0.0 if forever else float(timeout))  # type: ignore[arg-type]
        wait = 0.001
        while True:
            self._maintain()
            if not self._fetched:
                self._fetch()
            if self._fetched:
                return self._take(limit)
            now = time.monotonic()
            if not forever and now >= deadline:
                return []
            time.sleep(wait if forever else min(wait, deadline - now))
            wait = min(wait * 2, _IDLE_WAIT_MAX_S)

    def _take(self, limit: int) -> list[Message]:
        out, positions = self._fetched.take(limit)
        self._positions.update(positions)
        if self._events.collecting:  # counted only for stats_cb: a hot path otherwise
            for m in out:
                counts = self._received.setdefault((m._topic, m._partition), [0, 0])  # type: ignore[arg-type]
                counts[0] += 1
                counts[1] += len(m._key or b"") + len(m._value or b"")
        return out

    def _fetch(self) -> None:
        """Read from the assigned partitions in rotation until the buffer holds a fetch's worth."""
        keys = sorted(self._positions)
        if not keys:
            return
        self._rotation = (self._rotation + 1) % len(keys)
        order = keys[self._rotation:] + keys[: self._rotation]
        waiting, failed = self._prefetch(order)
        deadline = time.monotonic() + _FETCH_PASS_S
        tried = False
        for tp in order:
            if tried and time.monotonic() > deadline:  # (one read at least: each pass moves the rotation on)
                return
            if tp in self._paused or tp in waiting:
                continue
            if tp in failed:  # raised at its turn, as if its read had met it
                raise failed[tp]
            if not self._successor_ready(tp):  # (one the pass's look did not reach)
                continue
            offset = self._fetch_offset(tp)
            if offset is None:
                continue
            tried = True
            try:
                messages = self._store.read(tp[0], tp[1], offset, _FETCH_MAX_RECORDS)
            except KafkaException as exc:
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._reset(tp, exc.error)
                    continue
                raise
            if messages:
                self._fetched.add(messages)
                self._fetch_offsets[tp] = messages[-1]._offset + 1  # type: ignore[operator]
                if len(self._fetched) >= _FETCH_MAX_RECORDS:
                    return
            elif self._config.enable_partition_eof and self._eof_sent.get(tp) != offset:
                self._eof_sent[tp] = offset
                self._fetched.add([Message(tp[0], tp[1], offset, None, None,
                                           error=KafkaError(ErrorCode._PARTITION_EOF, f"{tp[0]}[{tp[1]}] at end"))])

    def _prefetch(self, order: list[PartitionKey]) -> tuple[set[PartitionKey], dict[PartitionKey, KafkaException]]:
        """Tell the store where this pass will read each partition (a store that fetches over a network starts
        fetching them all at once). Returns the successors still waiting for a predecessor, and what finding a
        partition's position raised, for the pass to raise at that partition's turn. The look at the partitions
        has a time budget of its own, so a slow one never leaves the pass no time to read."""
        deadline = time.monotonic() + _FETCH_PASS_S
        positions: dict[PartitionKey, int] = {}
        waiting: set[PartitionKey] = set()
        failed: dict[PartitionKey, KafkaException] = {}
        for tp in order:
            if time.monotonic() > deadline:
                break
            if tp in self._paused:
                continue
            try:
                if not self._successor_ready(tp):
                    waiting.add(tp)
                elif (offset := self._fetch_offset(tp)) is not None:
                    positions[tp] = offset
            except KafkaException as exc:
                failed[tp] = exc
        self._store.prefetch(positions)
        return waiting, failed

    def _fetch_offset(self, tp: PartitionKey) -> int | None:
        """Where the next fetch of ``tp`` starts; None if its position cannot be initialized (an error event)."""
        if tp not in self._fetch_offsets and not self._initialize_position(tp):
            return None
        return self._fetch_offsets[tp]

    def _initialize_position(self, tp: PartitionKey) -> bool:
        """Start from the committed offset, else as ``auto.offset.reset`` says; False if that is an error."""
        committed = self._committed_offsets([tp]).get(tp)
        if committed is not None:
            self._set_position(tp, committed)
            return True
        if self._config.auto_offset_reset != "earliest" and self._continues(tp):
            state = self._store.partition_state(*tp)
            self._set_position(tp, state.start_offset)
            self._commit_if_finished(tp, state)
            return True
        return self._reset(tp, None)

    def _continues(self, tp: PartitionKey) -> bool:
        """Whether ``tp`` continues predecessors read here or by the group (not skipped whole by a first reset to
        their end): every record of it came after theirs, so it starts at its beginning, whatever the reset
        policy says (latest skipped what was written to it while its predecessors were being finished)."""
        for pred in self._streams[tp[0]].predecessors(tp[1]):
            key = (tp[0], pred)
            if key in self._positions:
                if key not in self._skipped:
                    return True
            elif self._subscription:
                return True  # owned by another member, which read it to its end
        return False

    def _reset(self, tp: PartitionKey, cause: KafkaError | None) -> bool:
        policy = self._config.auto_offset_reset
        if policy == "error":
            reason = f"{tp[0]}[{tp[1]}]: no valid offset and auto.offset.reset=error ({cause or 'no commit'})"
            self._fetched.add([Message(tp[0], tp[1], None, None, None,
                                       error=KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, reason))])
            self._paused.add(tp)
            return False
        state = self._store.partition_state(*tp)
        self._set_position(tp, state.start_offset if policy == "earliest" else state.end_offset)
        if cause is None and policy == "latest" and state.sealed:
            self._skipped.add(tp)
        self._commit_if_finished(tp, state)
        return True

    def _commit_if_finished(self, tp: PartitionKey, state: PartitionState) -> None:
        """A group member starting a sealed partition at its end (empty, or skipped by ``latest``) hands out none of
        its records, so the application never commits it: its end is committed (by :meth:`_commit_finished`, out
        of the fetch: a commit may run the group protocol), or the members reading its successors would wait for
        it forever (they wait for the group's committed offset to reach that end)."""
        if self._member is not None and state.sealed and self._positions.get(tp) == state.end_offset:
            self._finished[tp] = state.end_offset

    def _commit_finished(self) -> None:
        """Commit the ends of the finished partitions still owned; kept for the next try after a transient error."""
        finished = {tp: end for tp, end in self._finished.items() if self._positions.get(tp) == end}  # (not sought)
        if not finished:
            self._finished.clear()
            return
        try:
            self._commit(finished)
        except KafkaException as exc:
            if exc.error.retriable():
                self._events.log.warning("group %s: committing the end of finished %s failed (tried again): %s",
                                         self._config.group_id, sorted(finished), exc)
                return
            if exc.code != ErrorCode.UNKNOWN_MEMBER_ID:
                raise
            # lost meanwhile: its next owner starts it at its end again, and commits it
        self._finished.clear()

    def _set_position(self, tp: PartitionKey, offset: int) -> None:
        self._positions[tp] = offset
        self._fetch_offsets[tp] = offset
        self._fetched.drop({tp})

    def _unready(self, topic: str) -> None:
        """The application moved a position of ``topic`` (seek, assign: a rewind after an aborted transaction): its
        successors wait for their predecessors again, and what was fetched of them ahead is dropped (it would be
        returned before the predecessor's records)."""
        gone = {tp for tp in self._ready if tp[0] == topic}
        if gone:
            self._ready -= gone
            self._refetch(gone)

    def _refetch(self, keys: set[PartitionKey]) -> None:
        """Drop what was fetched of ``keys`` and not handed out: their next fetch starts at their positions."""
        self._fetched.drop(keys)
        for tp in keys:
            position = self._positions.get(tp)
            if position is not None:
                self._fetch_offsets[tp] = position
            else:
                self._fetch_offsets.pop(tp, None)

    def _successor_ready(self, tp: PartitionKey) -> bool:
        """True once every predecessor of ``tp`` (after a scale) was read to its end."""
        if tp in self._ready:
            return True
        topic, partition = tp
        stream = self._streams.get(topic)
        if stream is None or partition not in stream.partitions:
            stream = self._streams[topic] = self._store.describe_stream(topic)
        for pred in stream.predecessors(partition):
            if not self._predecessor_done((topic, pred)):
                return False
        self._ready.add(tp)
        return True

    def _predecessor_done(self, pred: PartitionKey) -> bool:
        """Read to its (sealed) end by this consumer, or, in a group, by whichever member owned it."""
        end = self._store.partition_state(*pred).end_offset
        if pred in self._positions:
            position = self._positions[pred]
            return position is not None and position >= end
        if not self._subscription:
            return True  # assigned by hand without it: the application chose not to read it here
        committed = self._committed_offsets([pred]).get(pred, -1)
        return committed >= end

    # -- offsets ----------------------------------------------------------------------------------------------

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit the next offsets to read: after ``message``, the given ``offsets``, or current positions.

        Commits complete before returning (``asynchronous`` is accepted for compatibility); a member that
        lost a partition in a rebalance gets UNKNOWN_MEMBER_ID and the commit changes nothing.
        """
        self._check_open()
        to_commit = _offsets_given("commit", ErrorCode.INVALID_CONFIG, message, offsets)
        if to_commit is None:
            to_commit = self._offsets_to_commit()
        self._commit(to_commit)
        return None if asynchronous else [TopicPartition(t, p, o) for (t, p), o in sorted(to_commit.items())]

    def store_offsets(self, message: Message | None = None, offsets: list[TopicPartition] | None = None) -> None:
        """Store the offsets that commits without offsets (and auto-commit) commit: after ``message``, or the given
        ``offsets``; for a consumer with ``enable.auto.offset.store`` false, as in confluent-kafka."""
        self._check_open()
        if self._config.enable_auto_offset_store:
            fail(ErrorCode._INVALID_ARG, "store_offsets() needs enable.auto.offset.store=false (with true, every "
                 "record's offset is stored as it is returned)")
        wanted = _offsets_given("store_offsets", ErrorCode._INVALID_ARG, message, offsets)
        if wanted is None:
            fail(ErrorCode._INVALID_ARG, "store_offsets() needs a message or offsets")
        unassigned = sorted(set(wanted) - set(self._positions))
        if unassigned:
            fail(ErrorCode._STATE, f"store_offsets: {unassigned} not assigned to this consumer; nothing stored")
        self._stored.update(wanted)

    def _offsets_to_commit(self, keys: set[PartitionKey] | None = None) -> dict[PartitionKey, int]:
        """What commits without offsets commit: each partition's position, or what store_offsets() stored."""
        source = self._positions if self._config.enable_auto_offset_store else self._stored
        return {tp: o for tp, o in source.items() if o is not None and (keys is None or tp in keys)}

    def _commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        if not offsets:
            return
        if self._member is not None:
            self._member.commit(offsets)
        else:
            self._store.commit_offsets(self._group_id(), offsets)
        self._committed.update(offsets)
        self._events.debug("committed %s", dict(offsets))

    def _committed_offsets(self, keys: list[PartitionKey], settle: bool = False) -> dict[PartitionKey, int]:
        """The group's committed offsets of ``keys``, once every transaction decided so far that carries offsets
        for the group is merged, if partitions were gained since the last look (or if ``settle``)."""
        if settle or self._unsettled:
            self._stable.settle(self._group_id())
            self._unsettled = False
        return self._store.committed_offsets(self._group_id(), keys)

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group and member id, for ``Producer.send_offsets_to_transaction``."""
        if self._member is None:
            return ConsumerGroupMetadata(self._group_id())
        generation = self._generations.generation if self._generations is not None else -1
        return ConsumerGroupMetadata(self._group_id(), self._member.member_id, generation)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        # As Kafka's require_stable offset fetch: every transaction decided so far counts.
        found = self._committed_offsets([(tp.topic, tp.partition) for tp in partitions], settle=True)
        return [TopicPartition(tp.topic, tp.partition, found.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in partitions]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        out = []
        for tp in partitions:
            position = self._positions.get((tp.topic, tp.partition))
            out.append(TopicPartition(tp.topic, tp.partition, OFFSET_INVALID if position is None else position))
        return out

    def seek(self, partition: TopicPartition) -> None:
        """Move an assigned partition's position; OFFSET_BEGINNING and OFFSET_END are accepted."""
        tp = (partition.topic, partition.partition)
        if tp not in self._positions:
            fail(ErrorCode._STATE, f"seek: {tp[0]}[{tp[1]}] is not assigned to this consumer")
        offset = partition.offset
        if offset in (OFFSET_BEGINNING, OFFSET_END):
            state = self._store.partition_state(*tp)
            offset = state.start_offset if offset == OFFSET_BEGINNING else state.end_offset
        elif offset < 0:
            fail(ErrorCode.INVALID_CONFIG, f"seek: invalid offset {offset} for {tp[0]}[{tp[1]}]")
        self._paused.discard(tp)
        self._set_position(tp, offset)
        self._skipped.discard(tp)
        self._unready(tp[0])

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        state = self._store.partition_state(partition.topic, partition.partition)
        return (state.start_offset, state.end_offset)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return cluster_metadata(self._store, topic)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float | None = None
                          ) -> list[TopicPartition]:
        """For each partition (its ``offset`` field holding a timestamp in ms), the earliest offset whose record's
        timestamp is >= it, or -1 (OFFSET_END) when every record is older, as confluent-kafka's.
        UNKNOWN_TOPIC_OR_PART for a partition that does not exist."""
        self._check_open()
        out = []
        for tp in partitions:
            found = self._store.offset_for_time(tp.topic, tp.partition, tp.offset)
            out.append(TopicPartition(tp.topic, tp.partition, OFFSET_END if found is None else found))
        return out

    def close(self) -> None:
        """Commit (if auto-commit is on), leave the group, release the store. Idempotent."""
        if self._closed:
            return
        try:
            if self._member is not None:
                self.unsubscribe()
            elif self._config.enable_auto_commit and self._config.group_id:
                self._commit(self._offsets_to_commit())
        finally:
            self._closed = True
            with contextlib.ExitStack() as closing:  # last-pushed first: the transaction groups, then the store
                closing.callback(self._store.close)
                closing.callback(self._stable.close)

    # -- group membership ------------------------------------------------------------------------------------

    def _maintain(self) -> None:
        if self._member is not None:
            self._follow_group(self._member)
            self._commit_finished()
        if self._events.stats_due():
            self._events.emit_stats(self._statistics())
        if self._config.enable_auto_commit and self._config.group_id and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._config.auto_commit_interval_ms / 1000
            try:
                self._commit(self._offsets_to_commit())
            except KafkaException as exc:  # as librdkafka: an auto-commit lost to a rebalance is only logged
                if exc.code != ErrorCode.UNKNOWN_MEMBER_ID:
                    raise
                self._events.log.warning("auto-commit refused, the group rebalanced: %s", exc)
                self._events.error(exc.error, logged=True)

    def _follow_group(self, member: GroupMember) -> None:
        """Sync with the group; act on partitions lost and gained (those given up were dropped in give_up)."""
        owned = member.sync(self._topics(), self._give_up)
        lost = set(self._positions) - owned
        if lost:
            self._events.log.warning("group %s: member %s lost %s (session expired)", self._config.group_id,
                                     member.member_id, sorted(lost))
            self._drop(lost, "lost", commit=False)
        gained = owned - set(self._positions)
        if gained:
            if self._generations is not None:  # (the metadata taken before this refuses their offsets)
                self._generations.gained(member.member_id, gained)
            # Before anything starts them: a stalled member that lost them may have claimed them (KIP-447's fencing).
            self._stable.abort_claims(self._group_id(), gained)
            partitions = _tps(gained)
            self._events.debug("assigned %s", partitions)
            callback = self._callbacks.get("assign")
            if callback is not None:
                callback(self, partitions)
            self._add(partitions)

    def _give_up(self, keys: frozenset[PartitionKey]) -> None:
        """The group moves these partitions elsewhere: tell the application and commit (auto-commit)."""
        self._drop(set(keys) & set(self._positions), "revoke", commit=True)

    def _topics(self) -> list[str]:
        patterns = [t for t in self._subscription if t.startswith("^")]
        names = [t for t in self._subscription if not t.startswith("^")]
        if patterns:
            names += [s for s in self._store.list_streams() if any(re.match(p, s) for p in patterns)]
        return names

    def _add(self, partitions: list[TopicPartition], *, replacing: bool = False) -> None:
        """Start reading ``partitions`` (``replacing``: instead of the assignment). A partition that does not exist
        is UNKNOWN_TOPIC_OR_PART before anything changes, from one look per topic (on Kafka a partition's state
        costs two round trips: assigning 4 partitions took ~56 ms that way, ~2 ms this way)."""
        streams = {topic: self._store.describe_stream(topic) for topic in dict.fromkeys(tp.topic for tp in partitions)}
        for tp in partitions:
            streams[tp.topic].epoch_of(tp.partition)
        if replacing:
            self.unassign()
        self._streams.update(streams)  # (the reads' look at predecessors after a scale needs no other)
        for topic in streams:
            self._unready(topic)
        self._unsettled = self._unsettled or bool(partitions)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._positions[key] = None
            self._fetch_offsets.pop(key, None)
            if tp.offset >= 0 or tp.offset in (OFFSET_BEGINNING, OFFSET_END):
                self.seek(tp)
        # Partitions given a position start fetching now, as librdkafka's do on assign: a first consume found
        # them fetched or on their way, where it waited for the fetches it started (~40 ms against ~20).
        self._prefetch([key for key in ((tp.topic, tp.partition) for tp in partitions) if key in self._fetch_offsets])

    def _drop(self, keys: set[PartitionKey], reason: str, commit: bool) -> None:
        """Give up partitions: tell the application, commit what it consumed (not when lost), forget them."""
        if not keys:
            return
        try:
            callback = self._callbacks.get(reason) or (self._callbacks.get("revoke") if reason == "lost" else None)
            if callback is not None:
                callback(self, _tps(keys))
            if commit and self._config.enable_auto_commit:
                self._commit(self._offsets_to_commit(keys))
        finally:  # forgotten whatever the callback or the commit raised: the group gives them to another member
            if self._generations is not None:
                self._generations.dropped(keys)
            for tp in keys:
                self._positions.pop(tp, None)
                self._stored.pop(tp, None)
                self._fetch_offsets.pop(tp, None)
            self._fetched.drop(keys)

    def _statistics(self) -> dict[str, Any]:
        """librdkafka's consumer statistics for the figures onceflow has (stats_cb): per assigned partition its
        watermarks, position (app_offset), last commit and lag (-1 where unknown, as librdkafka)."""
        topics: dict[str, dict[str, Any]] = {}
        for tp in sorted(set(self._positions) | set(self._received)):
            received = self._received.get(tp, [0, 0])
            figures: dict[str, Any] = {"partition": tp[1], "rxmsgs": received[0], "rxbytes": received[1],
                                       "txmsgs": 0, "txbytes": 0, "fetchq_cnt": self._fetched.held(tp)}
            if tp in self._positions:
                state = self._store.partition_state(*tp)
                position, committed = self._positions[tp], self._committed.get(tp)
                figures.update(lo_offset=state.start_offset, hi_offset=state.end_offset, ls_offset=state.end_offset,
                               app_offset=OFFSET_INVALID if position is None else position,
                               committed_offset=OFFSET_INVALID if committed is None else committed,
                               consumer_lag=-1 if committed is None else state.end_offset - committed,
                               consumer_lag_stored=-1 if position is None else state.end_offset - position)
            topics.setdefault(tp[0], {"topic": tp[0], "partitions": {}})["partitions"][str(tp[1])] = figures
        return {"replyq": len(self._fetched), "msg_cnt": 0, "msg_size": 0, "txmsgs": 0, "txmsg_bytes": 0,
                "rxmsgs": sum(c[0] for c in self._received.values()),
                "rxmsg_bytes": sum(c[1] for c in self._received.values()), "topics": topics}

    def _group_id(self) -> str:
        if not self._config.group_id:
            fail(ErrorCode.INVALID_CONFIG, "this operation needs group.id in the consumer config")
        return self._config.group_id

    def _check_open(self) -> None:
        if self._closed:
            fail(ErrorCode._STATE, "consumer is closed")
