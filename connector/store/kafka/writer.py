"""Writing to Kafka: plain appends through the idempotent producer, a writer.id's appends and atomic appends as
Kafka transactions, CAS appends through a fenced owner per partition (see the package docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import batch_codec
from onceflow.connector.store.contract import (
    NO_SEQUENCE,
    AppendCallback,
    AppendResult,
    Batch,
    Condition,
    OffsetCommit,
    RecordFields,
    check_atomic_batches,
    check_open,
)
from onceflow.connector.store.kafka.clients import (
    LIBRDKAFKA_BATCH_SIZE,
    SEQUENCE_HEADER,
    TIMEOUT_S,
    as_bytes,
    call,
    ensure_topic,
    is_internal,
    offset_of,
    translate,
    translating,
)
from onceflow.connector.store.kafka.messages import Report, reporter, send

if TYPE_CHECKING:
    from onceflow.connector.store.kafka.store import KafkaStore


log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("onceflow.connector.store.kafka.librdkafka")

MAX_OWNERS = 32
"""Fenced owners a writer keeps at once: each is a transactional producer (threads, connections), and a process that
runs for months may CAS into ever new partitions; taking one more closes the one unused longest."""
OWNER_IDLE_S = 300.0
"""A fenced owner unused this long is closed when the writer next takes one: its next write takes ownership afresh,
which costs a round trip and is sound (as after a rival took over)."""

ROUTING_LOOK_MAX_AGE_S = 0.1
"""An atomic append routes its batches by a catalog look at most this old (see append_atomic)."""

RECORD_WIRE_SLACK = 65_536
"""How much more librdkafka may count of a record than message.max.bytes counts in onceflow (key, value, header
names and values): its framing, varint lengths, header names' UTF-8, a CAS's sequence header."""

QUEUE_FULL_WAIT_S = 0.05
"""How long a write waits at a time for room in librdkafka's full queue (see KafkaWriter._hand_over)."""

OWNER_COMMIT_TIMEOUT_S = 10.0
"""A fenced owner's commit that takes longer is given up (it is retried with a fresh owner): a fenced owner's
commit can hang instead of failing (Tansu, integration/PEER.md)."""


class KafkaWriter:
    """An appending session: idempotent producer, or a fenced transactional one for a ``writer.id``."""

    def __init__(self, store: KafkaStore, writer_id: str | None, epoch: int,
                 delivery_timeout_ms: int | None = None) -> None:
        self._store = store
        self._writer_id = writer_id
        self._epoch = epoch
        conf = {**_producing(store), "enable.idempotence": True, "linger.ms": 5}
        if writer_id is not None:  # its appends are transactions, complete before they return
            store._require_hidden_aborts(f"writer.id {writer_id!r}")
            conf["transactional.id"] = f"onceflow-writer-{store._prefix}{writer_id}"  # per namespace
        elif delivery_timeout_ms is not None:  # librdkafka gives up when the caller stops waiting
            conf["delivery.timeout.ms"] = delivery_timeout_ms
        self._producer = ck.Producer(conf)
        self._queue_wait_s = TIMEOUT_S if delivery_timeout_ms is None else delivery_timeout_ms / 1000
        if writer_id is not None:
            call(self._producer.init_transactions, TIMEOUT_S, doing=f"fencing older writers of {writer_id!r}")
        self._owners: dict[str, ck.Producer] = {}  # least recently used first
        self._owner_used: dict[str, float] = {}  # monotonic time of each owner's last use
        self._wrote: dict[str, _Wrote] = {}  # per owned partition: where this owner's last CAS append left it
        self._session = uuid.uuid4().hex
        self._in_flight: list[_InFlight] = []  # asynchronous appends, in the order they were made
        self._carrier: str | None = None  # the internal topic of offsets-only transactions, once created
        self._closed = False

    @property
    def writer_id(self) -> str | None:
        return self._writer_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def append(
        self,
        stream: str,
        partition: int,
        records: Sequence[RecordFields],
        *,
        expected_offset: int | None = None,
        expected_sequence: int | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        check_open(self._closed, self._store.url)
        batch = Batch(stream, partition, records)
        where = f"{stream}[{partition}]"
        condition = Condition(expected_offset, expected_sequence, sequence)
        # The look that routes the batch: as in append_atomic, one this process made just before serves a
        # conditional append (its look after writing is what counts against a scale; a back-to-back CAS writer's
        # last one ended a moment ago). A writer.id's fencing, and the plain idempotent append (whose records
        # cannot be taken back), look afresh.
        if self._writer_id is not None or not self._store._never_scaled(stream):
            fresh = self._writer_id is not None or condition.unconditional
            self._store._catalog.refresh(None if fresh else time.monotonic() - ROUTING_LOOK_MAX_AGE_S)
        topic, local = self._target(batch, refresh=False)
        self._check_not_fenced(where)
        if condition.unconditional:
            offsets = self._produce(self._producer, [(topic, local, records, None)], (), where, [batch])[0][0]
            return _result(offsets)
        owner_key = f"{topic}-{local}"
        owner = self._owner(owner_key)
        kept = None if condition.new_sequence is None else self._store._kept_sequence_at(stream, topic, local)
        last_sequence = self._check_as_owner(owner_key, topic, local, condition, where, kept)
        failpoint("kafka.cas.after_check")
        land_at = None if condition.expected_offset is None else (0, condition.expected_offset)
        produced, stable = self._as_owner(owner_key, where, lambda: self._produce(
            owner, [(topic, local, records, condition.new_sequence)], (), where, [batch], land_at=land_at,
            kept=kept))
        offsets = produced[0]
        written = condition.new_sequence
        if self._owners.get(owner_key) is owner:  # still the owner that wrote it (not one a failure dropped)
            self._wrote[owner_key] = _Wrote(offsets[-1] + 2, written if written is not None else last_sequence)
        return _result(offsets, stable.get((topic, local)))

    def append_atomic(self, batches: Sequence[Batch], offsets: Sequence[OffsetCommit] = ()) -> list[AppendResult]:
        """One Kafka transaction; its condition, if any, is checked by the fenced owner of what it is about."""
        check_open(self._closed, self._store.url)
        check_atomic_batches(batches, offsets)
        where = ", ".join(f"{b.stream}[{b.partition}]" for b in batches)
        # One look for all the batches, to route them. The look after writing them is what counts against a scale
        # (a stale route costs a retry, PARTITION_SEALED), so one this process made just before serves: a merge
        # follows its commit's look for fencing by a few ms. A writer.id's fencing is checked against this one.
        since = None if self._writer_id is not None else time.monotonic() - ROUTING_LOOK_MAX_AGE_S
        self._store._catalog.refresh(since)
        items = [(*self._target(b, refresh=False), b.records, None) for b in batches]
        guard = self._guard(batches, items, offsets, where)
        self._check_not_fenced(where)
        if guard is None:
            produced, stable = self._produce(self._transactional(), items, offsets, where, batches)
        else:
            owner = self._owner(guard.owner_key)
            guard.check()  # after taking ownership: every rival that could still write is fenced
            produced, stable = self._as_owner(guard.owner_key, where, lambda: self._produce(
                owner, items, offsets, where, batches, land_at=guard.land_at))
            self._remember_atomic(guard, owner, items, produced)
        return [_result(landed, stable.get((topic, local))) for (topic, local, _, _), landed in zip(items, produced,
                                                                                                   strict=True)]

    def _remember_atomic(self, guard: _Guard, owner: ck.Producer,
                         items: Sequence[tuple[str, int, Sequence[RecordFields], int | None]],
                         produced: Sequence[list[int]]) -> None:
        """What a conditional atomic append left its partition, for the owner's next check (a merge's progress is
        written this way, one pass after another); what it knew before is stale, as is its sequence."""
        self._wrote.pop(guard.owner_key, None)
        if guard.land_at is not None and self._owners.get(guard.owner_key) is owner:
            topic, local, _, _ = items[guard.land_at[0]]
            self._wrote[guard.owner_key] = _Wrote(_ends(items, produced)[(topic, local)] + 1, None)

    def _guard(self, batches: Sequence[Batch], items: Sequence[tuple[str, int, Sequence[RecordFields], int | None]],
               offsets: Sequence[OffsetCommit], where: str) -> _Guard | None:
        """How an atomic append's one condition is checked: by the fenced owner of a conditional offset commit's
        group, or of a conditional batch's partition (then the batch must also land at the expected offset)."""
        conditional = {i: b.expected_offset for i, b in enumerate(batches) if b.expected_offset is not None}
        commits = [commit for commit in offsets if commit.expected]
        if any(commit.member_id is not None for commit in offsets):
            fail(ErrorCode.INVALID_REQUEST, f"{where}: on Kafka an atomic append cannot check a group member's "
                 "ownership in the same step; commit a member's offsets in a transaction (TransactionGroup)")
        if len(conditional) + len(commits) > 1:
            fail(ErrorCode.INVALID_REQUEST, f"{where}: on Kafka an atomic append may have one condition (a batch's "
                 f"expected offset or an offset commit's expected offsets), got {len(conditional) + len(commits)}")
        if commits:
            commit = commits[0]
            return _Guard(f"group-{self._store._prefix}{commit.group}", lambda: commit.check(
                self._store.committed_offsets(commit.group, list(commit.expected or {}))))
        if not conditional:
            return None
        (index, expected), = conditional.items()
        topic, local, _, _ = items[index]
        if not is_internal(batches[index].stream):
            fail(ErrorCode.INVALID_REQUEST, f"{where}: Kafka cannot check a partition's end offset inside a "
                 "transaction; a conditional batch needs the embedded store or one of onceflow's own streams, "
                 "which only their fenced owner writes")
        owner_key = f"{topic}-{local}"
        return _Guard(owner_key, lambda: self._check_as_owner(owner_key, topic, local, Condition(expected), where),
                      (index, expected))

    def append_async(self, stream: str, partition: int, records: Sequence[RecordFields],
                     callback: AppendCallback) -> None:
        """Produce without waiting (the idempotent producer pipelines batches); a writer.id's appends are
        transactions, so they complete before this returns."""
        check_open(self._closed, self._store.url)
        if self._writer_id is not None:
            callback(self.append(stream, partition, records), None)
            return
        batch = Batch(stream, partition, records)
        topic, local = self._target(batch, refresh=False)  # a stale view is caught after delivery
        pending = _InFlight(batch, callback, len(records))
        self._in_flight.append(pending)
        sent, error = self._hand_over(self._producer, topic, local, records, None, pending.report)
        if error is not None:
            if sent:  # what went out may still land: reported with it, once, never to be sent again
                pending.cut_short(sent, error)
            else:  # nothing on its way: failed, as if never asked
                self._in_flight.pop()
            if not sent or not isinstance(error, Exception):  # a KeyboardInterrupt still interrupts
                raise error
        call(self._producer.poll, 0, doing=f"{topic}[{local}]: appending")

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # librdkafka batches and pipelines appends itself

    def poll(self, timeout: float = 0) -> None:
        if self._in_flight:
            call(self._producer.poll, timeout, doing="serving delivery reports")
            self._complete()

    def flush(self, timeout: float) -> None:
        if self._in_flight:
            call(self._producer.flush, timeout, doing="delivering appends")
            self._complete()
        for pending in self._in_flight:  # librdkafka may still deliver them: never retriable
            pending.callback(None, _unacknowledged(ErrorCode._TIMED_OUT, pending.batch, f"within {timeout:g}s"))
        self._in_flight.clear()

    def _complete(self) -> None:
        """Run the callbacks of delivered batches, in order, after one look at the catalog for seals."""
        done = 0
        while done < len(self._in_flight) and self._in_flight[done].delivered:
            done += 1
        if not done:
            return
        finished, self._in_flight = self._in_flight[:done], self._in_flight[done:]
        unchecked = self._refresh_for_seals(finished)
        for pending in finished:
            try:
                if pending.stopped is not None:
                    raise KafkaException(pending.stopped)
                if pending.error is not None and pending.error.code() == ck.KafkaError._MSG_TIMED_OUT:
                    raise KafkaException(_unacknowledged(ErrorCode._MSG_TIMED_OUT, pending.batch,
                                                         "within delivery.timeout.ms"))
                if pending.error is not None:
                    raise _refused_or_unknown(pending.errors, bool(pending.offsets), pending.batch,
                                              f"{pending.batch.stream}[{pending.batch.partition}]: appending")
                if unchecked is not None:
                    raise KafkaException(_seal_unchecked(pending.batch, unchecked))
                self._check_still_open([pending.batch], [pending.offsets])
            except KafkaException as exc:
                pending.callback(None, exc.error)
                continue
            pending.callback(_result(pending.offsets), None)

    def _refresh_for_seals(self, finished: Sequence[_InFlight]) -> KafkaError | None:
        """One look at the catalog before delivered batches are reported (a scale may have sealed their partition
        under them); its error, if the catalog could not be read: every batch still gets its report."""
        if all(pending.error is not None or self._store._never_scaled(pending.batch.stream) for pending in finished):
            return None  # nothing landed where a scale could have sealed it: nothing to check
        try:
            self._store._catalog.refresh()
        except KafkaException as exc:
            return exc.error
        return None

    def _target(self, batch: Batch, refresh: bool = True) -> tuple[str, int]:
        """The Kafka topic and partition of an open partition, after checking the records."""
        where = f"{batch.stream}[{batch.partition}]"
        if not batch.records or not isinstance(batch.records, batch_codec.Encoded):  # checked when encoded
            batch_codec.check(batch.records, self._store._config.message_max_bytes, where)
        if self._writer_id is None and self._store._never_scaled(batch.stream):
            refresh = False  # no scale and no fencing to check: the look is not needed
        try:
            topic, local, sealed_end = self._store._topic_of(batch.stream, batch.partition, refresh)
        except KafkaException as exc:
            if refresh or exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART:
                raise
            topic, local, sealed_end = self._store._topic_of(batch.stream, batch.partition)  # made since last look
        if sealed_end is not None:
            fail(ErrorCode.PARTITION_SEALED, f"{where} is sealed: its epoch was scaled; append to the current epoch")
        return topic, local

    def _check_still_open(self, batches: Sequence[Batch], produced: Sequence[list[int]],
                          transactional: bool = False) -> None:
        """PARTITION_SEALED if a scale sealed a partition below what this append wrote, by the catalog as last
        refreshed. A plain batch that reached Kafka in several requests may straddle the sealed end: the records
        below it are visible, the rest never will be; outcome unknown then, never rerouted whole (which would
        publish the visible ones twice). A transaction's records all stay hidden: it aborts."""
        for batch, landed in zip(batches, produced, strict=True):
            where = f"{batch.stream}[{batch.partition}]"
            _, _, sealed_end = self._store._topic_of(batch.stream, batch.partition, refresh=False)
            if sealed_end is None or max(landed) < sealed_end:
                continue
            if not transactional and min(landed) < sealed_end:
                raise KafkaException(KafkaError(ErrorCode.PARTITION_SEALED, f"{where} was sealed at offset "
                                                f"{sealed_end} while this append landed at {min(landed)}.."
                                                f"{max(landed)}: the records below it are visible, the others never "
                                                "will be (outcome unknown: read the partition before appending them "
                                                "again)", outcome_unknown=True))
            fail(ErrorCode.PARTITION_SEALED, f"{where} was sealed while this append was in flight: none of it is "
                 "visible to onceflow readers; append to the current epoch")

    def take_over(self, stream: str, partition: int) -> None:
        """A new fenced owner of the partition (this writer's own included: a rival may have fenced it since)."""
        check_open(self._closed, self._store.url)
        topic, local, _ = self._store._topic_of(stream, partition, refresh=False)
        owner_key = f"{topic}-{local}"
        previous = self._drop_owner(owner_key)
        if previous is not None:
            with contextlib.suppress(ck.KafkaException):  # a fenced one may refuse to
                previous.close()
        self._owner(owner_key)  # init_transactions: aborts the transaction an earlier owner left open

    def check_not_fenced(self, since: float | None = None) -> None:
        self._store._catalog.refresh(since)
        self._check_not_fenced(f"writer.id {self._writer_id!r}")

    def _check_not_fenced(self, where: str) -> None:
        if self._writer_id is not None:
            current = self._store._catalog.get(f"writer:{self._writer_id}")
            if current and current["epoch"] != self._epoch:
                fail(ErrorCode.PRODUCER_FENCED, f"{where}: writer.id {self._writer_id!r} epoch {self._epoch} was "
                     f"fenced by epoch {current['epoch']}", fatal=True)

    def _check_as_owner(self, owner_key: str, topic: str, local: int, condition: Condition, where: str,
                        kept: tuple[str, bytes] | None = None) -> int | None:
        """Check a CAS append's expectation once owning the partition; the partition's last sequence, if read
        (``kept``: where it is kept beside the records, see ``clients.sequences_topic``).

        An owner that is still the owner knows what its last append left: no rival writes without fencing it
        first, and a fenced owner's next transaction fails (then CAS_MISMATCH, see _as_owner). So an expectation
        that matches what it last wrote is checked without reading the tail; a plain producer that appended
        meanwhile is caught by the write itself (land_at: the batch must land at the expected offset). Anything
        else — the first append, an expectation that does not match — is checked against the tail, read now.
        """
        wrote = self._wrote.get(owner_key)
        if wrote is not None and (wrote.last_sequence is not None or condition.new_sequence is None):
            known = wrote.last_sequence
            try:
                condition.check(where, wrote.end, lambda: known if known is not None else NO_SEQUENCE)
                return known
            except KafkaException:
                pass  # perhaps only stale (a plain producer appended): look at the tail
        reader = self._store._tail
        start, end = reader.end_offset(topic, local)
        read: list[int] = []

        def last_sequence() -> int:
            read.append(reader.last_sequence(topic, local, start, end, kept))
            return read[0]

        condition.check(where, end, last_sequence)
        return read[0] if read else None

    def _as_owner(self, owner_key: str, where: str, write: Callable[[], _Produced]) -> _Produced:
        """Run a write of a fenced owner; being fenced means a rival took over and won: CAS_MISMATCH. After any
        other failure the owner is dropped too (its transaction may hang, as a fenced one does on Tansu): the
        next write takes ownership afresh, which settles the old transaction first."""
        try:
            return write()
        except KafkaException as exc:
            self._drop_owner(owner_key)
            if exc.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH) or exc.error.fatal():
                fail(ErrorCode.CAS_MISMATCH, f"{where}: another writer took over during this conditional append")
            raise

    def _owner(self, owner_key: str) -> ck.Producer:
        """The fenced owner of a partition or a group's offsets: taking it over fences every rival."""
        owner = self._owners.pop(owner_key, None)  # put back last: the owners are kept least recently used first
        if owner is None:
            self._close_owners(unused_since=time.monotonic() - OWNER_IDLE_S, keep=MAX_OWNERS - 1)
            self._store._require_hidden_aborts(f"a CAS or atomic append ({owner_key})")
            # linger.ms as librdkafka's default: a flush sends at once anyway, and with 0 a merge's records left in
            # many small requests (a merge of 1000 records over 4 partitions flushed in 6.9 ms, 4.5 with 5).
            owner = ck.Producer({"logger": _LibrdkafkaLog(), **_producing(self._store),
                                 "transactional.id": f"onceflow-cas-{owner_key}", "linger.ms": 5})
            try:
                call(owner.init_transactions, TIMEOUT_S, doing=f"taking ownership of {owner_key}")
            except KafkaException as exc:  # a rival's init bumped the epoch under this one's: it lost the race
                if exc.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
                    fail(ErrorCode.CAS_MISMATCH, f"taking ownership of {owner_key}: a rival took it at once ({exc})")
                raise
            self._wrote.pop(owner_key, None)  # a new owner knows nothing yet: rivals may have written meanwhile
        self._owners[owner_key] = owner
        self._owner_used[owner_key] = time.monotonic()
        return owner

    def _close_owners(self, unused_since: float, keep: int) -> None:
        """Close the owners unused since ``unused_since``, and the least recently used beyond ``keep``."""
        for key in list(self._owners):
            if len(self._owners) <= keep and self._owner_used[key] >= unused_since:
                break
            owner = self._drop_owner(key)
            if owner is not None:
                _close(owner, transactional=True)

    def _drop_owner(self, key: str) -> ck.Producer | None:
        """Stop using an owner (the caller closes it, or leaves it: a failed one's close may hang on Tansu)."""
        self._owner_used.pop(key, None)
        self._wrote.pop(key, None)
        return self._owners.pop(key, None)

    def _transactional(self) -> ck.Producer:
        """A transactional producer for atomic appends: the writer.id's own, else one of this session's."""
        if self._writer_id is not None:
            return self._producer
        return self._owner(f"atomic-{self._session}")

    def _produce(self, producer: ck.Producer, items: Sequence[tuple[str, int, Sequence[RecordFields], int | None]],
                 offsets: Sequence[OffsetCommit], where: str, batches: Sequence[Batch],
                 land_at: tuple[int, int] | None = None, kept: tuple[str, bytes] | None = None) -> _Produced:
        """Write ``batches`` (their Kafka targets: ``items``; one transaction unless ``producer`` is the idempotent
        one); their offsets, in order, and in a transaction each written partition's last stable offset as first
        seen once it committed.

        A scale may seal a partition while its records are on their way: a transaction is checked against the
        seals after its records landed and before it commits, and aborts with PARTITION_SEALED if one landed
        past a sealed end. Past that look a seal ends above every record landed (see ``_finish_seal``), so what
        commits is visible; a merge's progress, stored in the same transaction, never moves past records that
        readers cannot see. The idempotent producer's records cannot be taken back: they are checked after they
        landed.

        ``land_at``: (item, offset): that item's batch must land at that offset, else the transaction aborts with
        CAS_MISMATCH: a plain producer may append between a CAS owner's look at the tail and its write.
        ``kept``: (topic, key) where the one item's sequence number is kept, in the same transaction (a CAS owner's).
        """
        transactional = producer is not self._producer or self._writer_id is not None
        landed: list[list[int]] = [[] for _ in items]
        carried: list[int] = []  # the offset of the carrier record, in a transaction that only commits offsets
        errors: list[ck.KafkaError] = []
        if transactional:
            call(producer.begin_transaction, doing=f"{where}: beginning a transaction")
        try:
            if transactional:
                failpoint("kafka.txn.before_send")
            handed = 0
            for (topic, local, records, sequence), got, batch in zip(items, landed, batches, strict=True):
                sent, error = self._hand_over(producer, topic, local, records, sequence, reporter(got, errors))
                handed += sent
                if error is None:
                    continue
                if transactional or not handed or not isinstance(error, Exception):
                    raise error  # (a transaction aborts below; nothing plain went out; an interrupt)
                raise KafkaException(_stopped(batch, sent, error)) from error  # plain records out: may land
            if transactional and offsets and not items:
                self._send_carrier(producer, reporter(carried, errors))
            if kept is not None:
                self._keep_sequence(producer, kept, items[0][3], reporter([], errors))
            call(producer.flush, TIMEOUT_S, doing=f"{where}: writing")
            if land_at is not None and landed[land_at[0]] and landed[land_at[0]][0] != land_at[1]:
                fail(ErrorCode.CAS_MISMATCH, f"{where}: expected end offset {land_at[1]}, but another writer "
                     f"appended first (the batch would land at {landed[land_at[0]][0]}); not written")
            _raise_failed_delivery(errors, landed, batches, where, transactional)  # before a commit (the except aborts)
            if not all(self._store._never_scaled(b.stream) for b in batches):  # only a scale seals a partition
                try:
                    self._store._catalog.refresh()
                    self._check_still_open(batches, landed, transactional)
                except KafkaException as exc:  # plain records landed: visible unless sealed under them
                    if transactional or exc.code == ErrorCode.PARTITION_SEALED:
                        raise
                    raise KafkaException(_seal_unchecked(batches[0], exc.error)) from exc
            if transactional:
                for commit in offsets:
                    self._send_offsets(producer, commit, where)
                failpoint("kafka.txn.before_commit")
        except BaseException:  # the commit was never asked for: nothing of this transaction lands
            if transactional:
                if _aborted(producer):
                    self._await_aborted(_ends(items, landed), where)
                else:
                    self._forget(producer)  # fenced, or failed: the next write takes ownership afresh
            raise
        if transactional:
            ends = _ends(items, landed)
            witness = next((_Witness(topic, local, got[0], records[0][0], records[0][1])  # (a Record, or its fields)
                            for (topic, local, records, _), got in zip(items, landed, strict=True) if got), None)
            if witness is None and carried and self._carrier is not None:
                witness = _Witness(self._carrier, 0, carried[0], None, b"")
            return landed, self._commit(producer, witness, ends, where)
        return landed, {}

    def _commit(self, producer: ck.Producer, witness: _Witness | None, ends: Mapping[tuple[str, int], int],
                where: str) -> dict[tuple[str, int], int]:
        """Commit the producer's open transaction and wait until its records are readable; returns each partition's
        last stable offset as first seen past them.

        When the commit's outcome is not known — an EndTxn error (Apache Kafka answers a commit that races a
        rival's fencing with UNKNOWN_SERVER_ERROR, librdkafka's "Unknown broker error"; a fenced reply may answer
        a retried EndTxn whose first attempt committed), a timeout, markers not readable in time — the log decides:
        the transaction's first record, read back (read_committed) at the offset it was written to, is visible
        exactly when the transaction committed. Committed: this returns, as a success. Not committed: the error,
        PRODUCER_FENCED if a rival fenced the producer meanwhile, else retriable (nothing was written). Only when
        the read-back cannot decide either is the error flagged outcome-unknown.
        """
        owned = any(producer is owner for owner in self._owners.values())
        try:
            call(producer.commit_transaction, OWNER_COMMIT_TIMEOUT_S if owned else TIMEOUT_S,
                  doing=f"{where}: committing")
            return self._store._tail.await_stable(ends, where)
        except KafkaException as exc:
            failed = exc
        fenced, fatal, aborted = failed.code in _FENCED_CODES, failed.error.fatal(), False
        if not fatal:  # settles a transaction still open; a decided one refuses (then: fatal)
            try:
                call(producer.abort_transaction, TIMEOUT_S, doing=f"{where}: aborting after a failed commit")
                aborted = True
                self._await_aborted(ends, where)
            except KafkaException as exc:
                fenced, fatal = fenced or exc.code in _FENCED_CODES, exc.error.fatal()
        self._forget(producer)  # in an error state whatever the outcome: the next write takes ownership afresh
        if not aborted and self._read_back(witness, where, failed):
            log.info("%s: the commit reported %s, but its records landed (read back: %s)", where, failed.error, witness)
            try:
                return self._store._tail.await_stable(ends, where)  # the other partitions' markers too (one txn)
            except KafkaException as exc:  # committed, but not yet readable everywhere: never a plain failure
                raise KafkaException(KafkaError(exc.code, f"{where}: committed (read back), but not readable yet: "
                                                f"{exc.error.str()}", outcome_unknown=True)) from exc
        reason = f"{failed.error.str()}; read back: not written"
        log.info("%s: the commit reported %s; read back: not written", where, failed.error)
        if fenced:  # a rival took over: for a fenced owner, CAS_MISMATCH (_as_owner)
            raise KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, reason, fatal=True)) from failed
        raise KafkaException(KafkaError(failed.code, reason, fatal=fatal, retriable=not fatal)) from failed

    def _await_aborted(self, ends: Mapping[tuple[str, int], int], where: str) -> None:
        """Wait until an aborted transaction's records are decided: its abort markers are written after
        abort_transaction returns, and until then the end offset the store reports stops before them (the last
        stable offset), so an expectation taken from it right after a refused CAS append would be stale."""
        if not ends:
            return
        try:
            self._store._tail.await_stable(ends, f"{where}: aborting")
        except KafkaException as exc:  # the abort stands (the caller's error says so); only the reported end lags
            log.info("%s: aborted, but its markers were not seen: %s", where, exc.error)

    def _read_back(self, witness: _Witness | None, where: str, failed: KafkaException) -> bool:
        """True if the transaction whose first record is ``witness`` committed, False if it aborted; an
        outcome-unknown error when the partition does not tell within the timeout (its transaction still open)."""
        if witness is None:  # a transaction without records: nothing to read back
            fail(failed.code, f"{where}: the commit's outcome is unknown: {failed.error.str()}", outcome_unknown=True)
        reader = self._store._tail
        try:
            reader.await_stable({(witness.topic, witness.local): witness.offset + 1}, where)
            # A read that raises (OFFSET_OUT_OF_RANGE) where the record was truncated meanwhile, never skips on:
            # after a stall, another process may have cut a committed record, and "not there" would mean aborted.
            found = reader.read(witness.topic, witness.local, witness.offset, 1)
        except KafkaException as exc:
            raise KafkaException(KafkaError(
                exc.code, f"{where}: the commit's outcome is unknown ({failed.error.str()}) and reading it back "
                f"failed: {exc.error.str()}", outcome_unknown=True)) from exc
        if not found or offset_of(found[0]) != witness.offset:
            return False  # below the last stable offset and not visible: aborted
        message = found[0]
        if as_bytes(message.key()) != witness.key or as_bytes(message.value()) != witness.value:
            fail(ErrorCode.UNKNOWN, f"{where}: the commit's outcome is unknown ({failed.error.str()}): offset "
                 f"{witness.offset} of {witness.topic}[{witness.local}], where this write's first record was "
                 "acknowledged, holds another record", outcome_unknown=True)
        return True

    def _forget(self, producer: ck.Producer) -> None:
        """Drop a fenced owner whose transaction failed (the writer.id's own producer stays: it is the writer)."""
        for key, owner in list(self._owners.items()):
            if owner is producer:
                self._drop_owner(key)

    def _keep_sequence(self, producer: ck.Producer, kept: tuple[str, bytes], sequence: int | None,
                       report: Report) -> None:
        """The batch's sequence number where it outlives the batch (``clients.sequences_topic``), in its transaction."""
        topic, key = kept
        _, error = self._hand_over(producer, topic, 0, [(key, str(sequence).encode(), None, -1)], None, report)
        if error is not None:
            raise error

    def _send_carrier(self, producer: ck.Producer, report: Report) -> None:
        """An empty record to an internal topic, so a transaction that only commits offsets is not empty: Tansu
        drops the offsets of an empty transaction after a producer's first (integration/PEER.md)."""
        if self._carrier is None:
            self._carrier = f"__onceflow_offsets_carrier.{self._store._prefix}".rstrip(".")
            ensure_topic(self._store._admin, self._carrier, 1)
        _, error = self._hand_over(producer, self._carrier, 0, [(None, b"", None, -1)], None, report)
        if error is not None:
            raise error

    def _hand_over(self, producer: ck.Producer, topic: str, local: int, records: Sequence[RecordFields],
                   sequence: int | None, report: Report) -> tuple[int, BaseException | None]:
        """Hand ``records`` to librdkafka, waiting while its queue is full: how many it took, and what stopped it
        if anything did (confluent-kafka's errors as onceflow's), returned so that the caller knows what is on its
        way.

        librdkafka holds queue.buffering.max.messages records (100,000) and .kbytes (1 GiB) at most: a batch of 1 MB
        records, or a Producer allowed more records in flight than that, filled it midway through a batch, whose
        BufferError escaped with part of the batch sent. Waiting serves delivery reports, which make room; when
        none came for the writer's delivery timeout (TIMEOUT_S without one), _QUEUE_FULL, retriable.
        """
        if sequence is not None:  # a CAS by sequence: the number rides on the batch's last record's headers
            key, value, headers, timestamp = records[-1]
            records = [*records[:-1], (key, value, [*(headers or ()), (SEQUENCE_HEADER, str(sequence).encode())],
                                       timestamp)]
        doing = f"{topic}[{local}]: appending"
        sent, progressed_at = 0, time.monotonic()
        try:
            with translating(doing):
                while True:
                    before = sent
                    sent, refused = send(producer.produce, topic, local, records, report, sent)
                    if not isinstance(refused, BufferError):
                        break
                    if sent > before:  # a stall is what the bound is for, not a long batch
                        progressed_at = time.monotonic()
                    if not len(producer):  # nothing it holds will make room: the record can never fit
                        fail(ErrorCode._QUEUE_FULL, f"{doing}: a record larger than librdkafka's whole queue "
                             "(queue.buffering.max.kbytes; a transaction's staged records take up to "
                             "message.max.bytes each)")
                    if time.monotonic() - progressed_at >= self._queue_wait_s:
                        fail(ErrorCode._QUEUE_FULL, f"{doing}: librdkafka's queue stayed full for "
                             f"{self._queue_wait_s:g}s: its deliveries are not coming back", retriable=True)
                    producer.poll(QUEUE_FULL_WAIT_S)
                if refused is not None:
                    raise refused
        except BaseException as exc:  # a KeyboardInterrupt too: the caller reports what went out
            return sent, exc
        return sent, None

    def _send_offsets(self, producer: ck.Producer, commit: OffsetCommit, where: str) -> None:
        positions = self._store._kafka_offsets(commit.offsets)
        with self._store._group_consumer(commit.group) as consumer:
            metadata = consumer.consumer_group_metadata()
        call(producer.send_offsets_to_transaction, positions, metadata, TIMEOUT_S,
              doing=f"{where}: committing offsets of group {commit.group!r}")

    def close(self) -> None:
        """Deliver what is pending, then close this writer's producers (the fenced owners it still holds too).
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(TIMEOUT_S)  # a fatal error it raises is news: no report may have told it
        finally:
            self._close_owners(unused_since=float("inf"), keep=0)
            _close(self._producer, transactional=self._writer_id is not None)


def _producing(store: KafkaStore) -> dict[str, Any]:
    """The config of a producer of ``store``'s records: librdkafka's message.max.bytes above onceflow's by
    :data:`RECORD_WIRE_SLACK` (within librdkafka's range), so that produce() takes every record the check before it
    took (one it still refuses, with thousands of headers, fails its batch as outcome unknown). With both at
    1,000,000, a record of 999,993 bytes passed the check and produce() refused it midway through its batch, the
    records before it already sent. What the broker refuses fails in delivery reports."""
    limit = store._config.message_max_bytes + RECORD_WIRE_SLACK
    # Never below librdkafka's batch.size: message.max.bytes caps its requests' batches too.
    return {**store._conf, "message.max.bytes": min(max(limit, LIBRDKAFKA_BATCH_SIZE), 1_000_000_000)}


def _aborted(producer: ck.Producer) -> bool:
    """Abort the producer's open transaction, if it has one; False if it could not: fenced, or failed (then it
    needs no abort: the broker aborts a fenced or timed-out producer's transaction)."""
    try:
        producer.abort_transaction(TIMEOUT_S)
    except ck.KafkaException as exc:
        return bool(exc.args[0].code() == ck.KafkaError._STATE)  # no transaction open: nothing to abort
    return True


def _close(producer: ck.Producer, transactional: bool) -> None:
    """Deliver what the producer holds and close it; a producer that failed closes without an error too.

    A producer that failed fatally (fenced by a newer instance of its transactional id, or its idempotence
    broken) raises that error once more from its next poll or flush, though the operation that met it (a commit)
    or its records' delivery reports already told. Its close() aborts an open transaction and warns when it
    cannot, so that abort is made here first, and a producer that cannot abort is left to be destroyed with its
    last reference, which is quiet. (In the crash matrix a zombie fenced during its commit died in close().)
    """
    if transactional and not _aborted(producer):
        return
    try:
        producer.flush(TIMEOUT_S)
    except ck.KafkaException as exc:
        if not exc.args[0].fatal():
            raise
    producer.close()


_FENCED_CODES = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode._FENCED)


_Produced = tuple[list[list[int]], dict[tuple[str, int], int]]
"""What KafkaWriter._produce wrote: each batch's offsets, and each partition's last stable offset after its
transaction committed (none for the idempotent producer)."""


@dataclasses.dataclass(frozen=True)
class _Wrote:
    """Where a fenced owner's last CAS append left its partition: the end offset after it (its last record's
    offset + 2: the commit marker takes one) and the last application sequence number (None: not known)."""

    end: int
    last_sequence: int | None


@dataclasses.dataclass(frozen=True)
class _Witness:
    """A transaction's first record as written: where the broker acknowledged it, and its key and value. After a
    commit with an unknown outcome, it is visible to a read_committed reader at that offset exactly when the
    transaction committed (an offset holds one record; an aborted one is never shown)."""

    topic: str
    local: int
    offset: int
    key: bytes | None
    value: bytes | None


class _LibrdkafkaLog:
    """The ``logger`` of a fenced owner: librdkafka's lines as DEBUG records of ``<this module>.librdkafka``.

    Losing a CAS race makes librdkafka print FATAL lines ("This instance has been fenced by a newer instance"),
    hundreds in a busy race; the race's outcome reaches the caller as CAS_MISMATCH, so the lines are kept for
    debugging, not printed to stderr.
    """

    def log(self, level: int, msg: str, *args: object) -> None:
        if _librdkafka_log.isEnabledFor(logging.DEBUG):
            _librdkafka_log.debug(f"%s {msg}", logging.getLevelName(level), *args)


@dataclasses.dataclass(frozen=True)
class _Guard:
    """An atomic append's condition: whose fenced owner writes it, what to check once owning, and where its
    conditional batch must land ((item, offset), if it has one)."""

    owner_key: str
    check: Callable[[], object]
    land_at: tuple[int, int] | None = None


class _InFlight:
    """An asynchronous append waiting for its records' delivery reports."""

    __slots__ = ("batch", "callback", "count", "errors", "offsets", "report", "stopped")

    def __init__(self, batch: Batch, callback: AppendCallback, count: int) -> None:
        self.batch = batch
        self.callback = callback
        self.count = count
        self.offsets: list[int] = []
        self.errors: list[ck.KafkaError] = []
        self.report = reporter(self.offsets, self.errors)
        self.stopped: KafkaError | None = None  # why the batch was handed over only in part

    def cut_short(self, sent: int, error: BaseException) -> None:
        """Only ``sent`` records were handed over before ``error``: done when they are reported, as an append
        whose outcome is unknown (some of it may land)."""
        self.count = sent
        self.stopped = _stopped(self.batch, sent, error)

    @property
    def delivered(self) -> bool:
        return self.report.reported == self.count

    @property
    def error(self) -> ck.KafkaError | None:
        return self.errors[0] if self.errors else None


def _unacknowledged(code: ErrorCode, batch: Batch, when: str, fatal: bool = False) -> KafkaError:
    """An asynchronous append not acknowledged in time: sent, perhaps written, so its outcome is unknown and
    sending it again could write it twice."""
    return KafkaError(code, f"{batch.stream}[{batch.partition}]: {len(batch.records)} record(s) not acknowledged "
                      f"{when}; they may or may not be written (outcome unknown: read the partition before "
                      "appending them again)", outcome_unknown=True, fatal=fatal)


def _seal_unchecked(batch: Batch, error: KafkaError) -> KafkaError:
    """A plain batch that landed, whose look at the catalog for a seal under it failed: visible unless sealed, so
    its outcome is unknown (and a lost catalog stays fatal)."""
    return _unacknowledged(error.code(), batch, f"as open: the catalog could not be read to check for a seal "
                           f"({error.str()})", fatal=error.fatal())


def _stopped(batch: Batch, sent: int, error: BaseException) -> KafkaError:
    """A batch of which only ``sent`` records went out before ``error`` stopped it: its outcome is unknown."""
    kafka = error.error if isinstance(error, KafkaException) else None
    return _unacknowledged(kafka.code() if kafka else ErrorCode._FAIL, batch, f"(stopped after {sent} of them by "
                           f"{kafka.str() if kafka else repr(error)})", fatal=bool(kafka and kafka.fatal()))


def _raise_failed_delivery(errors: list[ck.KafkaError], landed: list[list[int]], batches: Sequence[Batch],
                           where: str, transactional: bool) -> None:
    """Raise if a record of a synchronous append was not reported delivered once flushed. In a transaction that
    is definite (the transaction aborts). The idempotent producer's records cannot be taken back: one not reported
    within the flush is still queued and may land later, as may one timed out (_MSG_TIMED_OUT: perhaps written
    before its acknowledgement was lost): outcome unknown, never "not written" (a caller would write it twice)."""
    if not errors and all(len(got) == len(batch.records) for got, batch in zip(landed, batches, strict=True)):
        return
    unreported = sum(len(batch.records) for batch in batches) - sum(map(len, landed)) - len(errors)
    timed_out = any(error.code() == ck.KafkaError._MSG_TIMED_OUT for error in errors)
    if not transactional and (timed_out or unreported):
        batch = next(b for b, got in zip(batches, landed, strict=True) if len(got) != len(b.records))
        raise KafkaException(_unacknowledged(ErrorCode._MSG_TIMED_OUT if timed_out else ErrorCode._TIMED_OUT, batch,
                                             "within delivery.timeout.ms" if timed_out else f"within {TIMEOUT_S:.0f}s"))
    if not transactional and errors:
        batch = next(b for b, got in zip(batches, landed, strict=True) if len(got) != len(b.records))
        raise _refused_or_unknown(errors, any(landed), batch, f"{where}: appending")
    raise translate(errors[0] if errors else ck.KafkaError(ck.KafkaError._TIMED_OUT), f"{where}: appending")


_NOT_STORED = frozenset({
    ck.KafkaError.MSG_SIZE_TOO_LARGE, ck.KafkaError.RECORD_LIST_TOO_LARGE, ck.KafkaError.INVALID_MSG,
    ck.KafkaError.INVALID_MSG_SIZE, ck.KafkaError.INVALID_RECORD, ck.KafkaError.INVALID_TIMESTAMP,
    ck.KafkaError.INVALID_REQUIRED_ACKS, ck.KafkaError.POLICY_VIOLATION, ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
    ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError._UNKNOWN_PARTITION, ck.KafkaError._UNKNOWN_TOPIC,
    ck.KafkaError._PURGE_QUEUE})
"""Delivery errors of the idempotent producer that mean the records were refused, never stored (librdkafka: not
persisted). Any other may come with records stored: _MSG_TIMED_OUT, _TRANSPORT, NOT_ENOUGH_REPLICAS_AFTER_APPEND
or any code after a producer-id change (possibly persisted), OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID
(fatal, possibly persisted), _PURGE_INFLIGHT, and a record reported delivered without an offset (_STATE here:
DUPLICATE_SEQUENCE_NUMBER, stored)."""


def _refused_or_unknown(errors: list[ck.KafkaError], some_landed: bool, batch: Batch, doing: str) -> KafkaException:
    """A plain batch whose delivery failed: refused (definite) only if nothing of it landed and every error says
    not stored; else outcome unknown (its landed records are visible: a retry would write them twice)."""
    refused = translate(errors[0], doing)
    if not some_landed and all(error.code() in _NOT_STORED for error in errors):
        return refused
    how = f"as stored ({'some landed, then ' if some_landed else ''}{errors[0].str()})"
    return KafkaException(_unacknowledged(refused.code, batch, how, fatal=refused.error.fatal()))


def _ends(items: Sequence[tuple[str, int, Sequence[RecordFields], int | None]],
          landed: Sequence[list[int]]) -> dict[tuple[str, int], int]:
    """One past the last offset each written partition got (partitions nothing landed in are left out)."""
    ends: dict[tuple[str, int], int] = {}
    for (topic, local, _, _), got in zip(items, landed, strict=True):
        if got:
            ends[(topic, local)] = max(ends.get((topic, local), 0), max(got) + 1)
    return ends


def _result(offsets: list[int], stable: int | None = None) -> AppendResult:
    """The result of a batch that landed at ``offsets``; ``stable``: its partition's last stable offset seen once
    its transaction committed. That it is two past the batch's last record says the transaction's marker lies in
    between and nothing else (the marker is written past the records and below the last stable offset)."""
    dense = offsets[-1] - offsets[0] == len(offsets) - 1
    return AppendResult(offsets[0], len(offsets), offsets=None if dense else tuple(offsets),
                        end_after=stable if stable == offsets[-1] + 2 else None)
