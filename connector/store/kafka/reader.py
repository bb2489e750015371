"""Reading Kafka partitions by offset, read_committed: records, the true end of a partition's tail, and the last
application sequence number written to it."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store.contract import NO_SEQUENCE
from onceflow.connector.store.kafka.clients import (
    ATTEMPT_S,
    SEQUENCE_HEADER,
    TIMEOUT_S,
    offset_of,
    offsets_client,
    record_headers,
    refresh_metadata,
    released_admin,
    through_leader_changes,
    translate,
)
from onceflow.connector.store.kafka.messages import drain
from onceflow.connector.threads import one_at_a_time

READ_AHEAD = 10_000
"""Records a reader holds for a partition nobody read for :data:`IDLE_S` before it stops fetching that partition."""
READ_AHEAD_WHILE_READ = 50_000
"""The same bound for a partition that is being read: higher, since each pause and resume makes librdkafka drop
what it fetched ahead and fetch it again (pausing at 10,000 made a Consumer reading four partitions wait for
fetches: 90k records/s against 140-270k without)."""
STABLE_POLL_FIRST_S = 0.0002
STABLE_POLL_MAX_S = 0.01
"""How :meth:`Reader.await_stable` asks again for markers that were not written yet: they follow the commit within
a ms or two, and every ms waited is the commit's (a fixed 1 ms pause: about half of the inline commits of
10 records on local Apache Kafka waited for one), while a broker slow to write them is asked at most every 10 ms."""
FETCH_QUEUE_BACKOFF_MS = 10
"""How long librdkafka holds off a partition's next fetch when its local queue is full (its default: 1 s). A reader
takes everything fetched into its own buffers at each read, so the queue empties within a read: with the default,
a Consumer reading four partitions of 50k records stalled 850 ms in each run once all four were fetched at once."""
PREFETCH_BACKOFF_S = 30.0
"""How long a partition that :meth:`Reader.prefetch` failed to start is left to its reads to position."""
IDLE_S = 1.0
GONE_RANGE_ATTEMPTS = 6  # a range read again, backing off from 50 ms, while the broker says it is out of range
FORGET_AFTER_S = 120.0
"""A partition nobody read for this long is unassigned and its fetched records dropped (a read re-positions it):
a process that runs for months reads ever new partitions (a topic a day), and each kept would hold up to
:data:`READ_AHEAD` records and a fetch slot for good."""


class Reader:
    """Reads partitions by offset through one assign-mode consumer, fetching ahead sequentially.

    A partition stays assigned after a read, so reading on is one fetch away; one that holds
    :data:`READ_AHEAD` records nobody asked for yet (:data:`READ_AHEAD_WHILE_READ` while it is being read) is
    paused until they are read (a partition read once and then left would otherwise be fetched into memory for
    as long as the reader lives).

    Thread-safe (a store is shared by the threads of a process, as a TransactionGroup is): reads take turns,
    since two at once would re-position the one consumer and take each other's buffered records.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._consumer = ck.Consumer({**conf, "group.id": f"onceflow-reader-{uuid.uuid4().hex}",
                                      "enable.auto.commit": False, "isolation.level": "read_committed",
                                      "auto.offset.reset": "error", "fetch.wait.max.ms": 10,
                                      "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                                      # Connect to every broker as soon as it is known: with sparse connections,
                                      # librdkafka drops the bootstrap connection once it knows the brokers' own
                                      # addresses and holds off new ones for half of reconnect.backoff.ms, so a
                                      # first look and fetch waited ~50 ms. A reader needs the leaders of what it
                                      # reads; it also retries an unreachable bootstrap with growing back-off then
                                      # (6 attempts in 6 s, against 117).
                                      "enable.sparse.connections": False})
        self._offsets = offsets_client(conf)
        # Connected at once too: its first ask for stable offsets (a Consumer's first read) waited ~45 ms to connect
        self._admin = AdminClient({**conf, "enable.sparse.connections": False})
        self._next: dict[tuple[str, int], int] = {}
        self._ends: dict[tuple[str, int], int] = {}  # last stable offset last looked at: records below are decided
        self._true_ends: dict[tuple[str, int], tuple[int, int]] = {}  # high watermark -> end offset read
        # (offset scanned to, last sequence, where it is kept beside the records: see last_sequence)
        self._sequences: dict[tuple[str, int], tuple[int, int, tuple[str, bytes] | None]] = {}
        self._kept: dict[tuple[str, bytes], int] = {}  # (sequences topic, key) -> the last number kept there
        self._kept_read_to: dict[str, int] = {}
        self._buffers: dict[tuple[str, int], deque[ck.Message]] = {}
        self._paused: set[tuple[str, int]] = set()
        self._no_prefetch_until: dict[tuple[str, int], float] = {}  # partitions whose prefetch failed lately
        self._last_read: dict[tuple[str, int], float] = {}  # monotonic time of each partition's last read
        self._next_sweep = time.monotonic() + FORGET_AFTER_S
        self._lock = threading.RLock()

    def watermarks(self, topic: str, local: int) -> tuple[int, int]:
        low, high = through_leader_changes(
            lambda: self._offsets.get_watermark_offsets(ck.TopicPartition(topic, local), timeout=ATTEMPT_S),
            f"reading the offsets of {topic}[{local}]", refresh=lambda: refresh_metadata(self._offsets, [topic]))
        return int(low), int(high)

    def fetched_high_watermark(self, topic: str, local: int) -> int:
        """The partition's high watermark as its last fetch response told it (no round trip); -1 before one."""
        with self._lock, contextlib.suppress(ck.KafkaException):
            _, high = self._consumer.get_watermark_offsets(ck.TopicPartition(topic, local), cached=True)
            return int(high) if high >= 0 else -1
        return -1

    def stable_ends(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's last stable offset: records below it are committed or aborted, so a read_committed
        reader gets every committed one of them; it stops at the first record of an open transaction."""
        wanted = {ck.TopicPartition(t, p): (t, p) for t, p in partitions}
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]

        def ask() -> dict[tuple[str, int], int]:
            futures = self._admin.list_offsets({tp: latest for tp in wanted},
                                               isolation_level=ck.IsolationLevel.READ_COMMITTED,
                                               request_timeout=ATTEMPT_S)
            return {wanted[tp]: int(f.result(timeout=ATTEMPT_S).offset) for tp, f in futures.items()}

        return through_leader_changes(ask, f"reading the last stable offsets of {sorted(wanted.values())}",
                                      refresh=lambda: refresh_metadata(self._admin, {t for t, _ in wanted.values()}))

    def await_stable(self, ends: Mapping[tuple[str, int], int], where: str) -> dict[tuple[str, int], int]:
        """Wait until committed records below ``ends`` are readable: a broker may write a transaction's commit
        markers after it acknowledged the commit, and a commit is promised to be visible when it returns. Returns
        each partition's last stable offset as first seen at or past its end."""
        deadline = time.monotonic() + TIMEOUT_S
        pending = dict(ends)
        seen: dict[tuple[str, int], int] = {}
        pause = STABLE_POLL_FIRST_S
        while pending:
            stable = self.stable_ends(pending)
            seen.update((tp, stable[tp]) for tp, end in pending.items() if stable[tp] >= end)
            pending = {tp: end for tp, end in pending.items() if stable[tp] < end}
            if pending and time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{where}: committed, but not readable within {TIMEOUT_S:g}s: {pending}")
            if pending:
                time.sleep(pause)
                pause = min(pause * 2, STABLE_POLL_MAX_S)
        return seen

    @one_at_a_time
    def end_offset(self, topic: str, local: int) -> tuple[int, int]:
        """(start, end) where end is one past the last record, read from the tail.

        The high watermark alone is not trusted: Tansu reports the last batch's base offset + 1 (PEER.md).
        """
        key = (topic, local)
        low, high = self.watermarks(topic, local)
        cached = self._true_ends.get(key)
        if cached is not None and cached[0] == high:
            return low, cached[1]
        if high <= low:
            return low, high
        position = self._next.get(key)  # read on from where the last look stopped: no re-positioning
        first = position if position is not None and low <= position < high else high - 1
        tail = self.read_range(topic, local, first, high)
        self._scanned_on(key, first, high, tail)
        last = max([offset_of(m) for m in tail] + [offset_of(m) for m in self._buffers.get(key, ())],
                   default=high - 1)
        self._true_ends[key] = (high, max(high, last + 1))
        return low, max(high, last + 1)

    @one_at_a_time
    def read(self, topic: str, local: int, offset: int, max_records: int) -> list[ck.Message]:
        """Records from ``offset``; waits (up to the timeout) for records known to exist, [] at the end."""
        key = (topic, local)
        if time.monotonic() >= self._next_sweep:
            self._forget_idle()
        if self._next.get(key) != offset:
            outside = self._outside(topic, local, offset)
            if outside:
                fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{topic}[{local}]: offset {offset} is {outside}")
            self._position({key: offset})
        buffer = self._buffers[key]
        self._resume_if_drained(key, buffer)  # (paused and never resumed, if resuming failed as it was positioned)
        self._last_read[key] = time.monotonic()
        deadline = self._last_read[key] + TIMEOUT_S
        while not buffer:
            at_end = offset >= self._ends[key]  # nothing decided left when last looked: no wait for a fetch
            self._pump(key, 0.0 if at_end else 0.005)  # (a Consumer asks each partition in turn, ended or not)
            if buffer:
                break
            if at_end:  # look again, once
                self._ends[key] = self.stable_ends([key])[key]
                if offset >= self._ends[key]:
                    break
            elif self._caught_up(topic, local, self._ends[key]):
                break
            if time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{topic}[{local}]: no record from offset {offset} within {TIMEOUT_S}s")
        if max_records >= len(buffer):  # the usual case: everything fetched so far
            out = list(buffer)
            buffer.clear()
        else:
            out = [buffer.popleft() for _ in range(max_records)]
        if out:
            self._next[key] = offset_of(out[-1]) + 1
        self._resume_if_drained(key, buffer)
        return out

    def _resume_if_drained(self, key: tuple[str, int], buffer: deque[ck.Message]) -> None:
        """Fetch a paused partition again once what it holds was mostly read."""
        if key in self._paused and len(buffer) < READ_AHEAD // 2:
            self._consumer.resume([ck.TopicPartition(*key)])
            self._paused.discard(key)

    @one_at_a_time
    def prefetch(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Start fetching each partition from its offset, all at once: a read from there then finds its records
        fetched or on their way. Reads that move a partition one at a time wait for each first fetch in turn (a
        Consumer of four partitions waited 35-180 ms for its first records, confluent-kafka 16-29).

        Only a speed-up, with one look for all: an offset past a partition's last stable offset is left to its
        read, which checks it; one below its start fails its fetch, and its read says so. If starting them fails,
        the reads position their partitions themselves and raise what they meet; those partitions are not
        prefetched again for :data:`PREFETCH_BACKOFF_S` (a partition whose leader is down would hold up every
        pass)."""
        now = time.monotonic()
        if self._no_prefetch_until:
            self._no_prefetch_until = {key: t for key, t in self._no_prefetch_until.items() if t > now}
        candidates = {key: offset for key, offset in positions.items()
                      if self._next.get(key) != offset and key not in self._no_prefetch_until}
        if not candidates:
            return
        try:
            ends = self.stable_ends(candidates)
            wanted = {key: offset for key, offset in candidates.items() if offset <= ends[key]}
            if wanted:
                self._position(wanted, ends)
        except (KafkaException, ck.KafkaException):  # (librdkafka's own, from an assign)
            until = time.monotonic() + PREFETCH_BACKOFF_S
            self._no_prefetch_until.update(dict.fromkeys(candidates, until))

    def _outside(self, topic: str, local: int, offset: int) -> str | None:
        """Why ``offset`` is out of the partition's range, or None if it is in it."""
        low, high = self.watermarks(topic, local)
        if low <= offset <= high or (offset > high and offset <= self.end_offset(topic, local)[1]):
            return None
        return f"outside [{low}, {high}]"

    def _position(self, wanted: Mapping[tuple[str, int], int],
                  ends: Mapping[tuple[str, int], int] | None = None) -> None:
        """Fetch these partitions from these offsets on, dropping what was fetched of them from elsewhere. If it
        fails, each partition is as it was, forgotten (its next read positions it again), or positioned."""
        if ends is None:
            ends = self.stable_ends(wanted)  # first: a failure here changes nothing
        known = {t for t, _ in self._next}
        moved = [key for key in wanted if key in self._next]
        if moved:
            self._consumer.incremental_unassign([ck.TopicPartition(*key) for key in moved])
            for key in moved:
                self._forget(key)
        for topic in {t for t, _ in wanted} - known:
            self._look_up(topic)
        self._consumer.incremental_assign([ck.TopicPartition(*key, offset) for key, offset in wanted.items()])
        now = time.monotonic()  # about to be read: what is fetched ahead is bounded as for a partition read
        for key, offset in wanted.items():
            self._next[key], self._buffers[key], self._last_read[key] = offset, deque(), now
        self._ends.update({key: ends[key] for key in wanted})
        # librdkafka keeps a partition paused through unassign and assign (one forgotten while paused too): paused
        # until resumed, so that if resuming fails, a read resumes it.
        self._paused.update(wanted)
        self._consumer.resume([ck.TopicPartition(*key) for key in wanted])
        self._paused.difference_update(wanted)

    def _forget(self, key: tuple[str, int]) -> None:
        """Drop what this reader knows and holds of a partition it no longer has assigned."""
        for held in (self._next, self._buffers, self._ends, self._last_read):
            held.pop(key, None)
        self._paused.discard(key)

    def _look_up(self, topic: str) -> None:
        """Ask for the metadata of a topic none of whose partitions is assigned, before assigning one: librdkafka
        looks up the leader of a topic its consumer does not know at its next topic scan, once a second, and
        fetches nothing until then (a first read of a partition waited up to 1 s: 0.8 s for one assigned 1.2 s
        after the consumer was made, 5 ms with this look). Only a speed-up: if it fails, the read goes on and
        librdkafka finds the leader itself."""
        with contextlib.suppress(ck.KafkaException):
            refresh_metadata(self._consumer, [topic])

    def _forget_idle(self) -> None:
        """Unassign the partitions nobody read for :data:`FORGET_AFTER_S` and drop what was fetched of them."""
        now = time.monotonic()
        idle = [key for key, at in self._last_read.items() if now - at >= FORGET_AFTER_S]
        if idle:
            self._consumer.incremental_unassign([ck.TopicPartition(*key) for key in idle])
        for key in idle:
            self._forget(key)
        self._next_sweep = now + FORGET_AFTER_S / 4

    @one_at_a_time
    def read_range(self, topic: str, local: int, first: int, end: int) -> list[ck.Message]:
        """Every record in [first, end) still stored (fewer offsets where transaction markers sit; what another
        process truncated meanwhile is skipped: these are reads of a partition's tail)."""
        out: list[ck.Message] = []
        position = first
        while position < end and not (position > first and self._caught_up(topic, local, end)):
            try:
                batch = self.read(topic, local, position, end - position)
            except KafkaException as exc:
                low = self.watermarks(topic, local)[0]
                if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE or low <= position:
                    raise
                position = low  # truncated while read: a read of the tail goes on from the new start
                continue
            if not batch:
                break
            out += batch
            position = offset_of(batch[-1]) + 1
        return out

    def _caught_up(self, topic: str, local: int, end: int) -> bool:
        """True when the consumer's fetch position reached ``end`` (only markers were left); False for a partition
        not read yet (a read of a range that a truncation moved on before its first read)."""
        buffered = self._buffers.get((topic, local))
        if buffered is None or buffered:
            return False
        return bool(self._consumer.position([ck.TopicPartition(topic, local)])[0].offset >= end)

    def _pump(self, reading: tuple[str, int], wait_s: float) -> None:
        """Buffer every record the consumer fetched, of every partition, then act on its errors (see ``drain``:
        a partition cut under a lagging fetch once dropped the commit-log entries fetched behind its error)."""
        # A short wait: a tail often ends in a commit marker, which a poll consumes without returning anything
        # (a long poll waited its whole timeout there); read() then finds the position past it (_caught_up).
        runs, errors = drain(self._consumer, wait_s)
        for key, run in runs:
            buffer = self._buffers.get(key)
            if buffer is not None:
                buffer.extend(run)
                self._pause_if_full(key, buffer)
        for message, error in errors:
            self._fetch_error(message, error, reading)

    def _fetch_error(self, message: ck.Message, error: ck.KafkaError, reading: tuple[str, int]) -> None:
        """An error the consumer returned: ends of partitions are ignored; a partition truncated under its fetch
        position is re-positioned at its next read (OFFSET_OUT_OF_RANGE now if it is the one being read); the
        rest are raised."""
        failed = (message.topic() or "", message.partition() or 0)
        if error.code() == ck.KafkaError._PARTITION_EOF:
            return
        where = f"reading {failed[0]}[{failed[1]}]"
        if error.code() == ck.KafkaError._AUTO_OFFSET_RESET:
            if failed in self._next:  # (not one forgotten since: it is assigned afresh when read again)
                self._next[failed] = -1
            if failed == reading:
                fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{where}: {error.str()}")
            return
        raise translate(error, where)

    def _pause_if_full(self, key: tuple[str, int] | None, buffer: deque[ck.Message]) -> None:
        if key is None or len(buffer) < READ_AHEAD or key in self._paused:
            return
        if len(buffer) >= READ_AHEAD_WHILE_READ or time.monotonic() - self._last_read.get(key, 0.0) >= IDLE_S:
            self._paused.add(key)
            self._consumer.pause([ck.TopicPartition(*key)])

    @one_at_a_time
    def last_sequence(self, topic: str, local: int, start: int, end: int, kept: tuple[str, bytes] | None = None) -> int:
        """The application sequence number of the last record carrying one (NO_SEQUENCE if none does).

        Remembers how far it looked, so later calls read only the records appended since. ``kept``: where the
        number is kept beside its records (topic, key: see ``clients.sequences_topic``); each look takes the greater
        of the two, as retention or compaction may have removed the records that carried it (the kept one is read
        to that topic's end now, so it may name a batch past ``end``: a CAS expecting both then fails, safely).
        """
        key = (topic, local)
        scanned, found, kept_before = self._sequences.get(key, (None, NO_SEQUENCE, None))
        if scanned is not None and start <= scanned <= end and kept_before == kept:
            found = _sequence_in(self._read_range_settled(topic, local, scanned, end), found)
        else:  # first look (or at a stream made again under the name): back from the end, in growing windows
            window, found = 8, NO_SEQUENCE
            while found == NO_SEQUENCE:
                first = max(start, end - window)
                found = _sequence_in(self._read_range_settled(topic, local, first, end), NO_SEQUENCE)
                if first == start:
                    break
                window *= 4
        if kept is not None:  # (compaction may take a record that carried one from the range just read, too)
            found = max(found, self._kept_sequence(*kept))
        self._sequences[key] = (end, found, kept)
        return found

    def _read_range_settled(self, topic: str, local: int, first: int, end: int) -> list[ck.Message]:
        """:meth:`read_range`, asked again a few times while the broker says the range is out of range: a stream
        another process deleted and made again under its name is, to this process's client, the old topic for a
        moment (its fetches failed with OFFSET_OUT_OF_RANGE at offsets the new topic's watermarks had just named).
        A range truncated away stays out of range, and its error is raised."""
        for attempt in range(GONE_RANGE_ATTEMPTS - 1):
            try:
                return self.read_range(topic, local, first, end)
            except KafkaException as exc:
                if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
            time.sleep(0.05 * 2 ** attempt)
        return self.read_range(topic, local, first, end)

    def _kept_sequence(self, topic: str, key: bytes) -> int:
        """The last sequence number kept under ``key`` in ``topic`` (NO_SEQUENCE: none). Reads on from where the
        last call stopped."""
        start, end = self.end_offset(topic, 0)
        read_to = self._kept_read_to.get(topic, 0)
        if read_to < end:
            for message in self.read_range(topic, 0, max(start, read_to), end):
                value = message.value()
                self._kept[(topic, message.key() or b"")] = int(value) if value else NO_SEQUENCE
            self._kept_read_to[topic] = end
        return self._kept.get((topic, key), NO_SEQUENCE)

    def _scanned_on(self, key: tuple[str, int], first: int, end: int, messages: list[ck.Message]) -> None:
        """Carry :meth:`last_sequence`'s scan over ``messages``, just read: every record of [first, end). If it
        had scanned to within that range, it has now scanned to ``end`` (re-reading those records for it moved
        the consumer back and fetched them again: two fetches per partition_state)."""
        scanned = self._sequences.get(key)
        if scanned is not None and first <= scanned[0] <= end:
            self._sequences[key] = (end, _sequence_in(messages, scanned[1]), scanned[2])

    @one_at_a_time
    def close(self, release_admin: bool = True) -> None:
        self._consumer.close()
        self._offsets.close()
        if release_admin:
            self._admin = released_admin("a store's reader")


def _sequence_in(messages: list[ck.Message], default: int) -> int:
    """The last application sequence number among these records, else ``default``."""
    found = default
    for message in messages:
        for name, value in record_headers(message.headers(), keep_sequence=True) or []:
            if name == SEQUENCE_HEADER and value is not None:
                found = int(value)
    return found
