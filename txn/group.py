"""A transaction group as one process sees it: its commit log, staging stream, batched log writer and merger.

Any number of processes open the same group. A transaction is begun in one of them (its id is the position of
its BEGIN), written by writers in any of them (:meth:`TransactionGroup.writer`), and committed from any of them
naming the writers' :class:`~onceflow.txn.staging.Participant` s. Outcomes come from the log (see
:mod:`onceflow.txn.commit_log`); the committer then merges, so its data is visible when :meth:`commit` returns, and
any later merge rolls forward what a crashed committer left.

What a caller is told about a commit: returning means committed. A definite error means it did not commit.
An error whose ``outcome_unknown()`` is true (the COMMIT may or may not be stored: a timeout, a lost
connection, a failed log writer) means: ask :meth:`TransactionGroup.outcome` rather than retry. Once the COMMIT
decided the transaction, nothing that follows (merging, truncating) turns it into an error; a merge that failed
is logged and retried in the background (:mod:`onceflow.txn.publisher`) until the records are visible, and
rolled forward by the next merge in any process if this one closes first.

Thread safety: a ``TransactionGroup`` may be shared by all threads of a process (each method may be called from
any thread at any time); a :class:`~onceflow.txn.staging.StagingWriter` belongs to one thread at a time.
Processes never share objects: each opens the group itself (no store connection crosses a fork).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future

from onceflow.connector.config import TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import (
    AppendResult,
    Batch,
    OffsetCommit,
    PartitionKey,
    Record,
    RecordFields,
    Store,
    StreamDescription,
    Writer,
    batch_codec,
    ensure_stream,
)
from onceflow.schemas.txn_log_pb2 import GroupOffsets, InlineBatch, PartitionOffset, TransactionMetadataEntry
from onceflow.txn import log_codec, metrics
from onceflow.txn.batched_writer import BatchedLogWriter, Position
from onceflow.txn.commit_log import CLAIM_PREFIX, CommitLog, LoggedTransaction, Outcome
from onceflow.txn.expiry import Expirer, abort_record, now_ms
from onceflow.txn.merge import Merger
from onceflow.txn.offset_writers import OffsetWriters
from onceflow.txn.progress import ProgressStream, kept_in_stream
from onceflow.txn.publisher import Publisher
from onceflow.txn.staging import Participant, StagingWriter, check_keys
from onceflow.txn.truncation import Truncator

log = logging.getLogger(__name__)

_ONE_STEP_ATTEMPTS = 5  # of one append, on retriable errors
_ONE_STEP_LOOKS = 8  # at the log, when racing committers moved it
_ONE_STEP_PAUSE_S = 2.0  # on Kafka, one-step commits stop this long after one missed the log's end twice
_ONE_STEP_COLLATED = 256  # one-step commits at most in one append (Kafka)
_CONDITIONAL_ATTEMPTS = 50
_INLINE_MAX_BYTES = 256 * 1024  # records a COMMIT may carry: every process reads every COMMIT; keep them small
_INLINE_RECORD_MIN_BYTES = 12  # bytes a record takes in a stored batch at the least (its three lengths)
_PROGRESS_EVERY = 64  # log entries a one-step commit may leave the merge's progress behind (see _commit_in_one_step)


def stream_names(group: str) -> tuple[str, str]:
    """The commit log and the staging stream of a group."""
    return f"__onceflow.txn.{group}.log", f"__onceflow.txn.{group}.staging"


def progress_stream_name(group: str) -> str:
    """The stream holding a group's merge progress (:mod:`onceflow.txn.progress`)."""
    return f"__onceflow.txn.{group}.progress"


class TransactionGroup:
    """One group's transactions: begin, stage, commit, abort, time out, merge; thread-safe; see the module
    docstring."""

    def __init__(self, store: Store, config: TransactionConfig, message_max_bytes: int, *,
                 owns_store: bool = False) -> None:
        metrics.serve(config.metrics_port, config.metrics_host)  # first: a bad metrics address creates nothing
        self.name = config.group
        self._store = store
        self._owns_store = owns_store
        self.log_stream, self.staging_stream = stream_names(config.group)
        ensure_stream(store, self.log_stream, 1)
        ensure_stream(store, self.staging_stream, config.staging_partitions)
        self.progress_stream = progress_stream_name(config.group)
        ensure_stream(store, self.progress_stream, 1)
        self._log = CommitLog(store, self.log_stream, take_over=self._take_over_log)
        self._log_writer = BatchedLogWriter(store.open_writer(), self.log_stream, config, message_max_bytes,
                                            on_stored=self._log.appended)  # its entries read back without a read
        progress = ProgressStream(store, self.progress_stream, f"__onceflow.txn.{config.group}.merge",
                                  (self.log_stream, 0))
        self._merger = Merger(store, self._log, self.staging_stream, progress, message_max_bytes)
        self._offset_writers = OffsetWriters(store)
        self._publisher = Publisher(self.name, lambda until: self._merger.merge(until=until))
        self._truncator = Truncator(store, self._log, self.staging_stream, progress, config)
        self._expirer = Expirer(self._log, self._log_writer)
        self._commit_latency = metrics.COMMIT_LATENCY.labels(self.name)  # looked up once: ~1.5 us a commit
        self._message_max_bytes = message_max_bytes
        # A one-step commit's conditions: the log's end, and where the store checks two in one append (the
        # embedded one), the merge's progress too; elsewhere (Kafka) the merge's progress follows it in the
        # background, and the append is the group's (the log's fenced owner's), not the producer's writer's.
        self._one_step_with_progress = store.atomic_conditions >= 2
        self._cas_writer: Writer | None = None
        self._cas_writer_lock = threading.Lock()
        self._one_step_lock = threading.Lock()  # see _commit_in_one_step
        self._one_step_changed = threading.Condition()  # guards the next three; notified when an append ends
        self._one_step_queue: list[_OneStep] = []  # one-step commits waiting for the next append (Kafka)
        self._described: dict[str, StreamDescription | None] = {}  # targets of commit_at_once, for check_keys
        self._one_step_busy = False  # an append of one-step commits is under way (Kafka)
        self._log_end_known = False  # whether no other process wrote the log since this view's last look
        self._one_step_paused_until = 0.0  # see _ONE_STEP_PAUSE_S

    @property
    def store(self) -> Store:
        return self._store

    @property
    def log_writer(self) -> BatchedLogWriter:
        return self._log_writer

    @property
    def looks_for_fencing(self) -> bool:
        """Whether a one-step commit checks its writer's fencing by a look at the writers' epochs (Kafka), which a
        look made once the transaction began serves (``Writer.check_not_fenced``: the producer makes one while
        the application produces); else its append checks it (the embedded store)."""
        return not self._one_step_with_progress

    def begin(self, timeout_ms: int, owner: str = "", owner_epoch: int = 0) -> str:
        """Begin a transaction that aborts unless committed within ``timeout_ms``; returns its id."""
        return self._log_writer.wait(self.begin_async(timeout_ms, owner, owner_epoch)).txn_id

    def begin_async(self, timeout_ms: int, owner: str = "", owner_epoch: int = 0) -> Future[Position]:
        """:meth:`begin` without waiting: the BEGIN's position (whose ``txn_id`` names it) once it is stored."""
        if not isinstance(timeout_ms, int) or timeout_ms <= 0:
            fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT, f"group {self.name!r}: transaction timeout must be a "
                 f"positive number of ms, got {timeout_ms!r}")
        self._upkeep()
        return self._log_writer.submit(_begin(timeout_ms, owner, owner_epoch))

    def writer(self, txn_id: str, writer_id: str, store_writer: Writer | None = None, *,
               known_open: bool = False) -> StagingWriter:
        """A writer staging records into an open transaction (``store_writer``: a fenced one, to stop zombies,
        that stays the caller's; else one the staging writer opens and its ``close`` closes; ``known_open``: the
        caller just began it, so the log need not be read to check)."""
        if not known_open:
            self._require_open(txn_id, f"write as {writer_id!r} into")
        return StagingWriter(self._store, self.staging_stream, txn_id, writer_id,
                             store_writer or self._store.open_writer(), self._message_max_bytes,
                             owns_writer=store_writer is None)

    def commit(self, txn_id: str, participants: Sequence[Participant],
               offsets: Mapping[str, Mapping[PartitionKey, int]] | None = None,
               members: Mapping[str, str] | None = None) -> None:
        """Commit with exactly the named writers' records and ``offsets`` (group -> positions), then merge.
        ``members``: for a consumer group of ``offsets``, the member whose input they follow (see :meth:`_claim`).

        TRANSACTION_TIMED_OUT if its timeout's abort came first, PRODUCER_FENCED if a newer instance of its
        owner aborted it, INVALID_TXN_STATE if it is unknown or already finished, UNKNOWN_MEMBER_ID if a member
        of ``members`` lost its partitions (refused at its check: abort it; or aborted by the member that took
        them over); an error with ``outcome_unknown()`` if its COMMIT may or may not be stored (then ask
        :meth:`outcome`).
        """
        started = time.monotonic()
        txn = self._require_open(txn_id, "commit")
        self._register(txn_id, offsets)
        if now_ms() > txn.deadline_ms:
            self._decide(txn_id, abort_record(txn_id, "timeout"), "abort")
            fail(ErrorCode.TRANSACTION_TIMED_OUT, f"group {self.name!r}: transaction {txn_id} passed its deadline "
                 "before COMMIT and was aborted")
        self._claim(txn_id, offsets, members)
        position = self._decide(txn_id, _commit(txn_id, participants, offsets), "commit")
        self._committed(txn_id, started, merge_until=position.entry + 1)

    def commit_at_once(self, targets: Mapping[PartitionKey, Sequence[RecordFields]], writer: Writer, *, owner: str = "",
                       owner_epoch: int = 0, offsets: Mapping[str, Mapping[PartitionKey, int]] | None = None,
                       timeout_ms: int = 60_000, begun: Future[Position] | None = None,
                       on_sealed: Callable[[], None] | None = None,
                       on_unknown: Callable[[str], None] | None = None,
                       members: Mapping[str, str] | None = None) -> str | None:
        """Begin and commit a transaction whose records are all at hand, without staging them; returns its id, or
        None when it cannot be done so: then stage and :meth:`commit` as usual.

        In one atomic append if it can (:meth:`_commit_in_one_step`): its BEGIN and COMMIT, its records in their
        partitions and ``offsets`` land together or not at all. Where not, on the embedded store None (the log
        moved meanwhile, a partition was sealed); on Kafka it is committed **inline**: its COMMIT carries the
        records (up to a few hundred KiB; None above), a BEGIN, the COMMIT, then the merge, as for a staged
        transaction, with the staging write and read-back left out. ``begun``: its BEGIN, submitted earlier by
        :meth:`begin_async`; then it is committed inline, and if this returns None the transaction stays open, for
        the caller to stage into. ``on_sealed``: called (in the caller's thread) when a partition of ``targets`` was
        sealed by a scale, so that the caller routes its next records to the stream's current epoch.
        ``on_unknown``: called with the transaction's id when this raises an error of unknown outcome (the log could
        not be read to settle it): :meth:`abort_unless_committed` of that id settles it later. ``members``: as
        for :meth:`commit`; on the embedded store the one step checks them itself.
        """
        for (stream, _), records in targets.items():
            check_keys(self._store, self._described, stream, (fields[0] for fields in records))
        if begun is None:  # (its offsets land with its COMMIT: nothing to register)
            txn_id = self._commit_in_one_step(targets, writer, owner=owner, owner_epoch=owner_epoch, offsets=offsets,
                                              members=members or {}, timeout_ms=timeout_ms, on_sealed=on_sealed,
                                              on_unknown=on_unknown)
            if txn_id is not None or self._one_step_with_progress:
                return txn_id
        self._register("(inline)", offsets)
        return self._commit_inline(targets, writer, owner=owner, owner_epoch=owner_epoch, offsets=offsets,
                                   members=members, timeout_ms=timeout_ms, begun=begun, on_unknown=on_unknown)

    def _commit_in_one_step(self, targets: Mapping[PartitionKey, Sequence[RecordFields]], writer: Writer, *, owner: str,
                            owner_epoch: int, offsets: Mapping[str, Mapping[PartitionKey, int]] | None,
                            members: Mapping[str, str], timeout_ms: int, on_sealed: Callable[[], None] | None,
                            on_unknown: Callable[[str], None] | None) -> str | None:
        """:meth:`commit_at_once` in one atomic append; None if not.

        On Kafka the append is one Kafka transaction of the log's fenced owner (this process's conditional log
        writer), and commits that arrive while one is under way go together in the next (:meth:`_one_step_turn`).
        A writer's fencing is checked there by a look at the writers' epochs made after the view last moved, and a
        new instance of a producer writes a fence mark in the log once it took over (:meth:`fence`): so either the
        look sees the new instance, or the log moved past the end the append expects (CAS_MISMATCH). Offsets of
        onceflow's own groups, kept in their streams, take the staged way (None); on Kafka so do a member's, which
        the inline way claims (:meth:`_claim`)."""
        if not self._one_step_with_progress and (time.monotonic() < self._one_step_paused_until
                                                 or any(kept_in_stream(group) for group in offsets or {})
                                                 or members):
            return None
        self._upkeep()  # abandoned transactions still time out where every commit is one step (before nothing waits)
        step = _OneStep(targets, writer, owner, owner_epoch, offsets or {}, members, timeout_ms)
        if self._one_step_with_progress:
            with self._one_step_lock:  # this process's one-step commits take turns: racing, most would miss
                self._one_steps([step])
        else:
            self._one_step_turn(step)
        if step.sealed and on_sealed is not None:
            on_sealed()
        if step.error is not None:
            if step.error.error.outcome_unknown() and step.named is not None and on_unknown is not None:
                on_unknown(step.named)
            raise step.error
        return step.txn_id

    def _one_step_turn(self, step: _OneStep) -> None:
        """Commit ``step`` with the others waiting when the append under way ends (up to
        :data:`_ONE_STEP_COLLATED`): one Kafka transaction for them all (64 producers committing at once, each in a
        Kafka transaction of its own, taking turns: no more transactions/s than one producer)."""
        with self._one_step_changed:
            self._one_step_queue.append(step)
            while self._one_step_busy and not step.done:
                self._one_step_changed.wait()
            if step.done:
                return
            self._one_step_busy = True
            others = [other for other in self._one_step_queue if other is not step][:_ONE_STEP_COLLATED - 1]
            steps = [step, *others]
            self._one_step_queue = [other for other in self._one_step_queue if other not in steps]
        try:
            self._one_steps(steps)
        finally:
            for other in steps:  # only if _one_steps raised what is not Kafka's (an interrupt) midway
                if other.done:
                    continue
                if other.named is None:  # never tried, or no try landed: to be committed the other way
                    other.finish()
                else:
                    other.finish(error=_unknown(self.name, other.named, "commit", "the thread committing it with "
                                                "others was interrupted"))
            with self._one_step_changed:  # only once each is finished: a woken follower returns what it finds
                self._one_step_busy = False
                self._one_step_changed.notify_all()

    def _one_steps(self, steps: list[_OneStep]) -> None:
        """Commit ``steps`` in one atomic append, each finished with its own outcome: committed, None (to be
        committed another way), or failed. Kafka's errors are never raised: one that ends the attempt before an
        append (a look at the log failed) leaves the rest to the other way."""
        try:
            self._append_steps(steps)
        except KafkaException as exc:  # (an append's own errors are handled there: nothing landed here)
            log.info("group %s: one-step commits take the staged way after %s", self.name, exc)
        for step in steps:
            if not step.done:
                step.finish()

    def _append_steps(self, steps: list[_OneStep]) -> None:
        """:meth:`_one_steps`' attempts. Committers racing in one group move the log between a look at it and the
        append: it looks again, a few times, before it gives up (staging instead costs several writes more: a group
        slowed down as committers were added, 430 transactions/s with one, 91 with 16)."""
        missed = 0  # appends that missed the end a look found
        for look in range(_ONE_STEP_LOOKS):
            # While no other process wrote the log since this view's last look, the first try is at the end the
            # view knows (the append's condition checks it): a commit in a single-process group reads nothing
            # first. Under racing processes every commit looks, as a miss costs more than a look.
            guessed = look == 0 and self._log_end_known
            end = self._log.read_to if guessed else self._look_at_log()
            # Where the commit moves the progress (the embedded store), as its batch expects to find it; else as
            # far as this process knows it to be: a progress behind costs a merge that finds nothing to do, a read
            # costs a round trip (on Kafka of ~10 ms: the progress ends in a transaction marker).
            progress = self._merger.read_progress() if self._one_step_with_progress else None
            merged_to = self._merger.progress_at_least() if progress is None else progress.merged_to or 0
            if self._log.merge_needed_to > merged_to:
                try:
                    self._merger.merge()  # others' commits to merge first
                except KafkaException:
                    return
                continue
            if not self._one_step_with_progress:
                steps = self._not_fenced(steps)
                if not steps:
                    return
            # Its COMMITs name nothing to merge: their records and offsets land with them. So the merge's progress
            # may stay behind them (a merge passes over such COMMITs); it is moved every _PROGRESS_EVERY entries,
            # to keep the log truncatable, and otherwise costs the commit nothing.
            txn_ids, entry = _begun_and_committed_in_one(end, steps)
            for step, txn_id in zip(steps, txn_ids, strict=True):
                step.named = txn_id
            progress_due = end + 1 - merged_to >= _PROGRESS_EVERY
            moves_progress = progress is not None and progress_due
            logged = log_codec.encode_batched(entry)
            batches = [Batch(self.log_stream, 0, [Record(None, logged)], expected_offset=end),
                       *(Batch(stream, partition, records) for (stream, partition), records in _targets(steps).items()),
                       *([self._merger.progress_batch(progress, end + 1)] if progress and moves_progress else [])]
            try:
                results: list[AppendResult] | None = self._append_one_step(", ".join(txn_ids), batches,
                                                                           _offsets(steps), steps[0].writer)
            except KafkaException as exc:
                landed = self._landed(end, logged, steps, exc) if exc.error.outcome_unknown() else False
                if landed is None:
                    return  # each told it is unknown
                if not landed:  # the ids named the entry at ``end``, someone else's now: a step told "unknown"
                    for step in steps:  # later (interrupted) must not name it
                        step.named = None
                if exc.error.outcome_unknown():
                    if not landed:
                        self._log_end_known = False
                        continue  # nothing was written: look again
                    results = None
                elif exc.code == ErrorCode.CAS_MISMATCH:
                    self._log_end_known = False
                    if guessed:  # a missed guess tells nothing of racing merges: the log may just have moved
                        continue
                    self._merger.lost_race()
                    missed += 1
                    if self._one_step_with_progress or missed < 2:
                        continue  # the log moved: look again
                    # Missed twice after a look: another process keeps writing the log, or took it over. Processes
                    # committing in one step at once would each abort the other's transaction as they took the log
                    # over in turn; the inline way suits them (nothing owns the log).
                    self._one_step_paused_until = time.monotonic() + _ONE_STEP_PAUSE_S
                    return
                elif exc.code == ErrorCode.PARTITION_SEALED:
                    for step in steps:
                        step.sealed = True  # (perhaps not its own partition: a look at its routes costs little)
                    return
                elif exc.error.retriable():
                    return  # nothing landed: each to be committed the other way, which retries on its own
                elif len(steps) > 1:
                    for step in steps:  # each alone: what failed them (a bad record, say) is one's own
                        self._one_steps([step])
                    return
                else:
                    for step in steps:
                        step.finish(error=exc)
                    return
            for step, txn_id in zip(steps, txn_ids, strict=True):
                step.finish(txn_id)  # (the callers are told once every step is finished)
            self._log.appended(end, entry, results[0].end_after if results else None)
            if moves_progress and results:
                self._merger.stored(end + 1, results[-1].last_offset)
                merged_to = end + 1
            elif progress_due:
                self._publisher.publish(end + 1)  # a merge in the background moves it
            for step, txn_id in zip(steps, txn_ids, strict=True):
                self._committed(txn_id, step.started, merged_to=merged_to, failpoint_name="txn.commit.after_one_step")
            return

    def _landed(self, end: int, value: bytes, steps: list[_OneStep], unknown: KafkaException) -> bool | None:
        """After the append of a one-step entry (``value``, conditional on the log ending at ``end``) whose outcome
        is unknown: whether it landed, read back once every entry stored is readable (on Kafka the log is taken
        over first, which ends the append's transaction either way: committed, or aborted); if the log cannot
        tell, None, each step told it is unknown.

        Needed as nothing else knows these transactions: their producers saw no BEGIN, and one told "unknown"
        could not ask what became of its transaction, and would publish its records again."""
        try:
            if not self._one_step_with_progress:
                self._log.take_over()
            if self._log.catch_up(complete=True) > end:
                read = self._store.read(self.log_stream, 0, end, 1)
                return bool(read) and read[0].offset() == end and read[0].value() == value
            return False
        except KafkaException as exc:  # (truncated past it, too: OFFSET_OUT_OF_RANGE)
            log.warning("group %s: reading back a one-step commit of unknown outcome failed: %s", self.name, exc)
        for step in steps:
            step.finish(error=_unknown(self.name, str(step.named), "commit", unknown))
        return None

    def _not_fenced(self, steps: list[_OneStep]) -> list[_OneStep]:
        """The steps whose writers a look made since the view last moved finds not fenced (one look serves all); the
        others fail with PRODUCER_FENCED."""
        kept = []
        for step in steps:
            try:
                step.writer.check_not_fenced(since=self._log.advanced_at)
            except KafkaException as exc:
                step.finish(error=exc)
                continue
            kept.append(step)
        return kept

    def _look_at_log(self) -> int:
        """The commit log's end, read; whether it is the end this view knew (no other process wrote since) decides
        whether the next one-step commit tries at the end it knows without a look."""
        seen = self._log.read_to
        end = self._log.catch_up()
        self._log_end_known = end == seen
        return end

    def _append_one_step(self, txn_id: str, batches: list[Batch], positions: list[OffsetCommit],
                         writer: Writer) -> list[AppendResult]:
        """The one-step commit's atomic append, retried as is on a retriable error (see :meth:`_append_atomic`). By
        ``writer`` on the embedded store (its fencing checked inside), else by the log's owner."""
        if self._one_step_with_progress:
            return self._append_atomic(txn_id, batches, positions, writer)
        with self._cas_writer_lock:
            return self._append_atomic(txn_id, batches, positions, self._conditional_writer())

    def _append_atomic(self, txn_id: str, batches: list[Batch], positions: list[OffsetCommit],
                       writer: Writer) -> list[AppendResult]:
        attempt = 0
        while True:  # the last attempt returns or raises
            try:
                return writer.append_atomic(batches, positions)
            except KafkaException as exc:
                # Raised as they are: CAS_MISMATCH, PARTITION_SEALED, an unknown outcome (the caller settles it),
                # definite errors, and the last retriable one: after retriable errors only nothing landed (the
                # embedded store answers a retry of an append that landed "duplicate"; on Kafka a retriable error
                # says the read-back found it not written).
                if (exc.code in (ErrorCode.CAS_MISMATCH, ErrorCode.PARTITION_SEALED) or exc.error.outcome_unknown()
                        or not exc.error.retriable() or attempt == _ONE_STEP_ATTEMPTS - 1):
                    raise
                log.info("group %s: retrying the one-step commit of %s after %s", self.name, txn_id, exc)
                attempt += 1

    def _commit_inline(self, targets: Mapping[PartitionKey, Sequence[RecordFields]], writer: Writer, *, owner: str,
                       owner_epoch: int, offsets: Mapping[str, Mapping[PartitionKey, int]] | None,
                       members: Mapping[str, str] | None, timeout_ms: int, begun: Future[Position] | None,
                       on_unknown: Callable[[str], None] | None) -> str | None:
        """:meth:`commit_at_once` with the records carried in the COMMIT; None if they are too big to be."""
        limit = min(_INLINE_MAX_BYTES, self._log_writer.max_entry_bytes // 2)
        inline = []
        for (stream, partition), records in targets.items():
            # A first cut by count (bigger transactions stage without being encoded here), then by size.
            if len(records) * _INLINE_RECORD_MIN_BYTES > limit:
                return None
            inline.append(InlineBatch(stream=stream, partition=partition, records=batch_codec.encode(
                records, self._message_max_bytes, f"{stream}[{partition}]")))
        if sum(len(batch.records) for batch in inline) > limit:
            return None
        started = time.monotonic()
        try:
            position = self._log_writer.wait(begun or self.begin_async(timeout_ms, owner, owner_epoch))
        except KafkaException as exc:  # no COMMIT was written: whatever became of the BEGIN, nothing committed
            raise KafkaException(KafkaError(exc.code, f"group {self.name!r}: beginning a transaction failed "
                                            f"({exc.error.str()}); nothing was committed",
                                            txn_requires_abort=True)) from None
        txn_id = position.txn_id
        try:
            # A zombie must not commit. Checked by a look after its BEGIN is stored: a successor that fenced it
            # before is seen; one that fences it after aborts this transaction unless the COMMIT is stored first.
            writer.check_not_fenced(since=position.stored_at)
            self._claim(txn_id, offsets, members)
        except KafkaException as exc:
            self._abort_after(txn_id, exc, "fenced" if exc.code == ErrorCode.PRODUCER_FENCED else "requested")
            raise
        record = _commit(txn_id, [], offsets)
        record.inline.extend(inline)
        with self._merger.records_at_hand(txn_id, targets):
            try:
                merge_until = self._decide(txn_id, record, "commit").entry + 1
            except KafkaException as exc:
                if not exc.error.outcome_unknown():
                    raise
                try:
                    merge_until = self._settle(txn_id, exc)
                except KafkaException as unknown:
                    if unknown.error.outcome_unknown() and on_unknown is not None:
                        on_unknown(txn_id)
                    raise
            self._committed(txn_id, started, merge_until=merge_until)
        return txn_id

    def _abort_after(self, txn_id: str, cause: KafkaException, reason: str) -> None:
        """Abort a transaction this process began and will not commit (its BEGIN would otherwise pin the log until
        its timeout); a failure is logged: the timeout aborts it then."""
        try:
            self._decide(txn_id, abort_record(txn_id, reason), "abort")
        except KafkaException as exc:
            log.warning("group %s: transaction %s could not be aborted after %s (%s); its timeout will abort it",
                        self.name, txn_id, cause, exc)

    def _settle(self, txn_id: str, unknown: KafkaException) -> int:
        """After a COMMIT of ``txn_id`` whose outcome is unknown, decide it: by the log if the COMMIT is there, else
        by an ABORT (of the two, the first in the log decides). Returns the entry after the deciding COMMIT; raises a
        definite error if it aborted, ``unknown`` if the log cannot tell.

        Needed where nothing else knows the transaction (its records were never staged, its producer saw no BEGIN):
        an application told "unknown" could not ask, and would publish the records again."""
        try:
            self._log.catch_up(complete=True)
            txn = self._log.get(txn_id)
            if txn is not None and txn.outcome is Outcome.OPEN:
                self._log_writer.append(abort_record(txn_id, "requested"))
                self._log.catch_up(complete=True)
                txn = self._log.get(txn_id)
        except KafkaException:
            raise unknown from None
        if txn is None or txn.decided_at is None:
            raise unknown
        if txn.outcome is Outcome.COMMITTED:
            return txn.decided_at[0] + 1
        if txn.reason in ("timeout", "fenced", "claimed"):
            raise self._finished(txn, "commit")
        raise KafkaException(KafkaError(unknown.code, f"group {self.name!r}: transaction {txn_id} did not commit "
                                        f"({unknown.error.str()}); it is aborted", txn_requires_abort=True))

    def commit_when(self, participants: Sequence[Participant], condition: Callable[[], bool], *,
                    offsets: Mapping[str, Mapping[PartitionKey, int]] | None = None,
                    timeout_ms: int = 60_000) -> str | None:
        """Commit the participants' staged records, joining the transactions they staged in, with ``offsets``,
        if ``condition()`` holds once every earlier transaction is merged; returns the new transaction's id, or
        None when ``condition()`` is false.

        The COMMIT (in one entry with its own BEGIN) is appended only if the log still ends where it ended when
        ``condition`` held, so it still held when the COMMIT landed: of two racing committers with the same
        condition, one wins and the other sees the condition false. A COMMIT whose store answer was lost looks
        like that too, so a condition should say "not done yet". Every joined transaction must be open:
        TRANSACTION_TIMED_OUT if one passed its deadline, INVALID_TXN_STATE if it finished otherwise.
        """
        started = time.monotonic()
        self._register("(conditional)", offsets)
        for _ in range(_CONDITIONAL_ATTEMPTS):
            merged_to = self._merger.merge()
            # The CAS expects the log's end, markers included (Kafka); a conditional append left unfinished holds
            # it back, and only this append's taking ownership ends it: no waiting here (CAS_MISMATCH, again).
            end = self._log.catch_up()
            if merged_to < self._log.read_to:
                continue  # a transaction committed meanwhile: merge it first, so the condition sees it
            if not condition():
                return None
            self._require_joinable({p.txn_id for p in participants if p.txn_id})
            txn_id, entry = _begun_and_committed(end, participants, offsets, timeout_ms)
            try:
                self._append_conditionally(entry, end)
            except KafkaException as exc:
                if exc.code == ErrorCode.CAS_MISMATCH or exc.error.retriable():
                    continue  # the log moved, or the append may have landed: look again
                raise
            self._committed(txn_id, started, merge_until=end + 1)
            return txn_id
        fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"group {self.name!r}: the commit log moved on {_CONDITIONAL_ATTEMPTS} "
             "times in a row while a conditional commit was checked")

    def _register(self, txn_id: str, offsets: Mapping[str, Mapping[PartitionKey, int]] | None) -> None:
        """Before a COMMIT carrying ``offsets`` that the merge writes (not one that lands with them): their consumer
        groups' readers will roll this group forward before they read offsets (:mod:`onceflow.txn.offset_writers`).
        onceflow's own groups are read by onceflow, which rolls forward itself. An error is definite: no COMMIT
        was written."""
        for consumer_group in offsets or ():
            if kept_in_stream(consumer_group):
                continue
            try:
                self._offset_writers.add(consumer_group, self.name)
            except KafkaException as exc:
                raise self._not_committed(txn_id, f"registering as a committer of consumer group "
                                          f"{consumer_group!r}'s offsets", exc) from exc

    def _not_committed(self, txn_id: str, step: str, exc: KafkaException) -> KafkaException:
        """``exc``, raised by ``step`` before a transaction's COMMIT was written, told as the transaction's: it was
        not committed (retriable as ``exc`` was)."""
        return KafkaException(KafkaError(exc.code, f"group {self.name!r}: transaction {txn_id} not committed: {step} "
                                         f"failed ({exc.error.str()})", retriable=exc.error.retriable()))

    def _claim(self, txn_id: str, offsets: Mapping[str, Mapping[PartitionKey, int]] | None,
               members: Mapping[str, str] | None) -> None:
        """Before the COMMIT of a transaction carrying offsets that follow a group member's input: a CLAIM of their
        partitions in the log, then a look that the member is still in its group (UNKNOWN_MEMBER_ID if not: nothing
        was committed). A member that gains one of them after that look aborts this transaction before it reads
        the offsets, unless its COMMIT came first (:meth:`abort_claims`). So a member that lost its partitions
        while stalled (a "zombie") cannot publish its transaction once its successor read the offsets: what
        Kafka's generation check does for its own transactions (KIP-447)."""
        members = members or {}
        claimed = {group: positions for group, positions in (offsets or {}).items() if group in members}
        if not claimed:
            return
        for group in claimed:
            if not members[group]:  # taken while its consumer was out of the group: no claim could pass
                fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {self.name!r}: transaction {txn_id} not committed: its "
                     f"offsets of group {group!r} come from a consumer that was not in the group then")
        try:
            self._log_writer.append(_claim_record(txn_id, claimed))
        except KafkaException as exc:  # (a CLAIM that landed all the same only gets this transaction aborted)
            raise self._not_committed(txn_id, "claiming its offsets' partitions", exc) from exc
        for group, positions in claimed.items():
            self._store.check_member(group, members[group], positions)
        failpoint("txn.commit.after_claim")

    def abort_claims(self, consumer_group: str, partitions: Collection[PartitionKey] | None) -> None:
        """A member gained ``partitions`` of ``consumer_group`` (None: every one, the group has no member left):
        abort each open transaction that claimed offsets of them (its member lost them: see :meth:`_claim`), unless
        its COMMIT came first (then it is merged)."""
        if partitions is not None and not partitions:
            return
        self._log.catch_up(complete=True)
        for txn_id in self._log.claiming(consumer_group, partitions):
            self.abort_unless_committed(txn_id, reason="claimed")

    def abort(self, txn_id: str, reason: str = "requested") -> None:
        """Abort an open transaction; INVALID_TXN_STATE if it already committed."""
        self._require_open(txn_id, "abort")
        self._decide(txn_id, abort_record(txn_id, reason), "abort")

    def outcome(self, txn_id: str) -> Outcome | None:
        """What the log says of a transaction now: OPEN, COMMITTED or ABORTED; None if this group never began
        it, or it finished so long ago that it was truncated away (and this process forgot it).

        After an error with ``outcome_unknown()``: COMMITTED means the commit took effect (do not redo it);
        OPEN means it did not (commit again, or abort); ABORTED means it lost to an abort (a timeout, a fence).
        Every entry stored so far is read first: on Kafka a retriable error if an open transaction keeps some of
        them unreadable for 30 s (see :meth:`CommitLog.catch_up`), rather than an answer they could change.
        """
        txn = self._logged(txn_id)
        return txn.outcome if txn is not None else None

    def _logged(self, txn_id: str) -> LoggedTransaction | None:
        """The transaction as the log shows it once every entry stored so far is read."""
        self._log.catch_up(complete=True)
        return self._log.get(txn_id)

    def abort_unless_committed(self, txn_id: str, owner: str | None = None, owner_epoch: int | None = None,
                               reason: str = "requested") -> bool:
        """Abort ``txn_id`` unless it committed; whether it did. For a transaction whose commit's outcome was
        unknown (``commit_at_once``'s ``on_unknown``, a COMMIT that may still land): the log decides. One the log
        does not know was never begun, unless the log was cut past its entry before this process read it: an error
        of unknown outcome then. ``owner`` (and ``owner_epoch``), if given: a transaction of another owner (or
        instance) at that id is not the caller's, whose never landed there: not committed, and left alone."""
        txn = self._logged(txn_id)
        if txn is not None and owner is not None and (txn.owner, txn.owner_epoch) != (
                owner, txn.owner_epoch if owner_epoch is None else owner_epoch):
            return False
        if txn is not None and txn.outcome is Outcome.OPEN:
            try:
                self._decide(txn_id, abort_record(txn_id, reason), "abort")
                return False
            except KafkaException as exc:
                if exc.error.outcome_unknown():
                    raise
                txn = self._logged(txn_id)  # another record decided it first (its COMMIT, say)
                if txn is None or txn.outcome is Outcome.OPEN:  # the ABORT was refused, not beaten
                    raise
        if txn is not None:
            return self._merge_committed(txn)
        entry, _, _ = txn_id.partition(".")
        if not (entry.isdigit() and self._log.tells_of(int(entry))):
            raise _unknown(self.name, txn_id, "abort", "the log was cut past its entry before this process read it")
        return False

    def committed_after_all(self, txn_id: str) -> bool:
        """Whether the log says ``txn_id`` committed, after its commit's outcome was unknown; if so it is merged
        (see :meth:`_merge_committed`). Every entry stored so far is read first."""
        txn = self._logged(txn_id)
        return txn is not None and self._merge_committed(txn)

    def _merge_committed(self, txn: LoggedTransaction) -> bool:
        """Whether ``txn`` committed; if so it is merged now (in the background if that fails): a committer that
        was told its commit's outcome is unknown never merged it, and committed means visible."""
        if txn.outcome is not Outcome.COMMITTED or txn.decided_at is None:
            return False
        self._committed(txn.txn_id, None, merge_until=txn.decided_at[0] + 1)
        return True

    def open_transactions(self) -> list[LoggedTransaction]:
        """Every transaction the log shows open now."""
        self._log.catch_up(complete=True)
        return self._log.open_transactions()

    def expire(self) -> list[str]:
        """Abort every open transaction whose deadline passed; returns their ids once the aborts are stored."""
        return self._expirer.expire()

    def fence(self, owner: str, epoch: int) -> None:
        """Abort the open transactions of ``owner``'s older epochs (a new producer instance took over), and mark the
        take-over in the log, which fails an older instance's one-step commit (see :meth:`_commit_in_one_step`)."""
        self._expirer.fence(owner, epoch)

    def abort_older(self, owner: str, epoch: int) -> None:
        """Abort the open transactions of ``owner``'s epochs before ``epoch``, without the fence mark :meth:`fence`
        writes: for an owner whose transactions never commit in one step (a Spark sink's tasks, each batch an
        epoch), whose fence would otherwise cost a log entry and a read of the log to its end every batch."""
        self._expirer.abort_older(owner, epoch)

    def merge(self, complete: bool = False) -> None:
        """Roll forward: merge every committed transaction not merged yet. ``complete``: every one whose COMMIT is
        stored so far, including those a conditional append still open on the log holds back from readers on Kafka
        (waits for it, and takes it over after a few seconds: see :meth:`CommitLog.catch_up`)."""
        if complete:
            self._log.catch_up(complete=True)
        self._merger.merge()

    def merge_progress(self) -> int | None:
        """The next commit-log offset the merge will merge, as stored now (None before the first merge)."""
        return self._merger.progress()

    def truncate(self) -> None:
        """Truncate the commit log and staging now, up to what a transaction may still need (commits do this
        every ``transaction.log.truncate.every.entries`` merged entries)."""
        self._truncator.truncate()

    def close(self) -> None:
        """Stop the background work (see the module docstring) and close every writer this group opened, each
        even when one closed before it raised; the error raised last is raised, once all are closed."""
        with contextlib.ExitStack() as closing:  # run last-pushed first: the publisher, ..., the store
            if self._owns_store:
                closing.callback(self._store.close)
            closing.callback(self._close_cas_writer)
            closing.callback(self._merger.close)
            closing.callback(self._log_writer.close)
            closing.callback(self._publisher.close)

    def _close_cas_writer(self) -> None:
        with self._cas_writer_lock:
            if self._cas_writer is not None:
                self._cas_writer.close()

    # -- helpers -------------------------------------------------------------------------------------------

    def _require_open(self, txn_id: str, doing: str) -> LoggedTransaction:
        """The open transaction ``txn_id``, after reading every entry stored so far."""
        self._log.catch_up(complete=True)
        return self._open_in_view(txn_id, doing)

    def _open_in_view(self, txn_id: str, doing: str) -> LoggedTransaction:
        """The open transaction ``txn_id``, as this view last read the log."""
        txn = self._log.get(txn_id)
        if txn is None:
            fail(ErrorCode.INVALID_TXN_STATE, f"group {self.name!r}: cannot {doing} transaction {txn_id!r}: no such "
                 "transaction (never begun, or finished long ago)")
        if txn.outcome is not Outcome.OPEN:
            raise self._finished(txn, doing)
        return txn

    def _require_joinable(self, txn_ids: set[str]) -> None:
        """Each transaction is open and within its deadline (one past it is aborted now); one read of the log for
        all (a Spark batch joins a transaction per task)."""
        if txn_ids:
            self._log.catch_up(complete=True)
        for txn_id in sorted(txn_ids):
            txn = self._open_in_view(txn_id, "join")
            if now_ms() > txn.deadline_ms:
                self._decide(txn_id, abort_record(txn_id, "timeout"), "abort")
                fail(ErrorCode.TRANSACTION_TIMED_OUT, f"group {self.name!r}: transaction {txn_id} passed its "
                     "deadline before the COMMIT that would join it and was aborted")

    def _conditional_writer(self) -> Writer:
        """The writer of conditional log appends; call holding ``_cas_writer_lock``."""
        if self._cas_writer is None:
            self._cas_writer = self._store.open_writer()
        return self._cas_writer

    def _take_over_log(self) -> None:
        """End a conditional append another process left unfinished on the log (it holds every reader back)."""
        with self._cas_writer_lock:
            self._conditional_writer().take_over(self.log_stream, 0)

    def _append_conditionally(self, entry: Sequence[TransactionMetadataEntry], end: int) -> None:
        """Append a log entry if the log still ends at ``end``, one thread at a time: a writer numbers its appends,
        and two threads' appends numbered alike are one append retried to the store, so the second was answered
        "landed" (a duplicate) while only the first had, and its caller took a commit that never happened for its
        own."""
        with self._cas_writer_lock:
            self._conditional_writer().append(self.log_stream, 0, [Record(None, log_codec.encode_batched(entry))],
                                              expected_offset=end)

    def _decide(self, txn_id: str, record: TransactionMetadataEntry, doing: str) -> Position:
        """Append a terminal record and check it is the one that decided the transaction (read back from the
        log); an error with ``outcome_unknown()`` when either step leaves that open."""
        try:
            position = self._log_writer.append(record)
        except KafkaException as exc:
            if exc.error.outcome_unknown():
                raise _unknown(self.name, txn_id, doing, exc) from None
            raise
        try:
            self._log.catch_up_to(position.entry + 1)  # at least up to its record: what comes after decides nothing
        except KafkaException as exc:
            raise _unknown(self.name, txn_id, doing, exc) from None
        txn = self._log.get(txn_id)
        if txn is None:  # open before, so truncated away (decided, merged) before this process read it back
            raise _unknown(self.name, txn_id, doing, f"its record was stored at entry {position.entry}, then "
                           "truncated before this process read it back")
        if txn.decided_at != (position.entry, position.index):
            raise self._finished(txn, doing)
        return position

    def _upkeep(self) -> None:
        """At most every half second, by whoever begins or commits: abort expired transactions, then truncate if
        due and forget merged transactions (a process that begins but never commits would otherwise remember
        every transaction of the group: its log view grew by every one, 16,000 in 105 s of a load run).

        A failure is logged, not raised: the next upkeep tries again, and the operation it came with (a begin, a
        commit) is not this work's; a transaction past its deadline loses to any abort, whenever it comes."""
        try:
            if self._expirer.expire_due():
                # The progress this process's merges stored, if it remembers one: else it is read (a round trip).
                self._truncator.maybe_truncate(self._merger.remembered_progress())
        except KafkaException as exc:
            log.warning("group %s: expiring or truncating failed (tried again in the next upkeep): %s", self.name, exc)

    def _committed(self, txn_id: str, started: float | None, merge_until: int | None = None,
                   merged_to: int | None = None, failpoint_name: str = "txn.commit.after_commit_record") -> None:
        """After the COMMIT decided ``txn_id``: merge up to ``merge_until``, observe its latency since ``started``
        (if known), truncate (``merged_to``: the progress the commit itself stored, if it did). The transaction is
        committed whatever happens here, so a failure is logged, never raised, and the publisher merges again
        until it is visible."""
        try:
            failpoint(failpoint_name)
            if merge_until is not None:
                merged_to = self._merger.merge(until=merge_until)
                failpoint("txn.commit.after_merge")
            if started is not None:
                self._commit_latency.observe(time.monotonic() - started)
            self._truncator.maybe_truncate(merged_to)
        except KafkaException as exc:
            log.error("group %s: transaction %s is committed, but merging or truncating after it failed: %s; "
                      "merging again in the background", self.name, txn_id, exc)
            if merge_until is not None:
                self._publisher.publish(merge_until)

    def _finished(self, txn: LoggedTransaction, doing: str) -> KafkaException:
        where = f"group {self.name!r}: cannot {doing} transaction {txn.txn_id}"
        if txn.outcome is Outcome.COMMITTED:
            return KafkaException(KafkaError(ErrorCode.INVALID_TXN_STATE, f"{where}: it already committed"))
        if txn.reason == "timeout":
            return KafkaException(KafkaError(ErrorCode.TRANSACTION_TIMED_OUT, f"{where}: its timeout aborted it "
                                             "first", txn_requires_abort=False))
        if txn.reason == "fenced":
            return KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, f"{where}: a newer instance of "
                                             f"{txn.owner!r} aborted it", fatal=True))
        if txn.reason == "claimed":
            return KafkaException(KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"{where}: the consumer-group member whose "
                                             "offsets it carries lost their partitions; it was aborted by the member "
                                             "that took them over, or by an admin that set the group's offsets"))
        return KafkaException(KafkaError(ErrorCode.INVALID_TXN_STATE, f"{where}: it was already aborted"))


@dataclasses.dataclass(eq=False)
class _OneStep:
    """A transaction to commit in one step, and once ``done`` its id (None: it is to be committed the staged way)
    or the error that failed it."""

    targets: Mapping[PartitionKey, Sequence[RecordFields]]
    writer: Writer
    owner: str
    owner_epoch: int
    offsets: Mapping[str, Mapping[PartitionKey, int]]
    members: Mapping[str, str]
    timeout_ms: int
    started: float = dataclasses.field(default_factory=time.monotonic)
    sealed: bool = False  # its append met a partition a scale sealed
    named: str | None = None  # its id in the append last tried (an entry's position names its transactions)
    done: bool = False
    txn_id: str | None = None
    error: KafkaException | None = None

    def finish(self, txn_id: str | None = None, error: KafkaException | None = None) -> None:
        self.txn_id, self.error, self.done = txn_id, error, True


def _begun_and_committed_in_one(end: int,
                                steps: Sequence[_OneStep]) -> tuple[list[str], list[TransactionMetadataEntry]]:
    """One commit-log entry to be stored at offset ``end``, holding each step's BEGIN and COMMIT: their ids (named
    by their BEGINs' positions) and the entry's records."""
    txn_ids, records = [], []
    for index, step in enumerate(steps):
        txn_id = Position(end, 2 * index, 2 * len(steps)).txn_id
        txn_ids.append(txn_id)
        records += [_begin(step.timeout_ms, step.owner, step.owner_epoch), _commit(txn_id, [], None)]
    return txn_ids, records


def _targets(steps: Sequence[_OneStep]) -> Mapping[PartitionKey, Sequence[RecordFields]]:
    """The steps' records by partition, in the steps' order (their commit order)."""
    if len(steps) == 1:
        return steps[0].targets
    joined: dict[PartitionKey, list[RecordFields]] = {}
    for step in steps:
        for key, records in step.targets.items():
            joined.setdefault(key, []).extend(records)
    return joined


def _offsets(steps: Sequence[_OneStep]) -> list[OffsetCommit]:
    """The steps' offsets by group (and member, checked by the append), a later step's over an earlier one's."""
    joined: dict[tuple[str, str | None], dict[PartitionKey, int]] = {}
    for step in steps:
        for group, positions in step.offsets.items():
            joined.setdefault((group, step.members.get(group)), {}).update(positions)
    return [OffsetCommit(group, positions, member_id=member) for (group, member), positions in joined.items()]


def _begun_and_committed(end: int, participants: Sequence[Participant],
                         offsets: Mapping[str, Mapping[PartitionKey, int]] | None, timeout_ms: int, owner: str = "",
                         owner_epoch: int = 0) -> tuple[str, list[TransactionMetadataEntry]]:
    """A transaction's BEGIN and COMMIT as one commit-log entry to be stored at offset ``end``: its id (named by
    that position) and the entry's records (``log_codec.encode_batched`` them)."""
    txn_id = Position(end, 0, 2).txn_id
    return txn_id, [_begin(timeout_ms, owner, owner_epoch), _commit(txn_id, participants, offsets)]


def _begin(timeout_ms: int, owner: str, owner_epoch: int) -> TransactionMetadataEntry:
    return TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timestamp_ms=now_ms(), timeout_ms=timeout_ms,
                                    owner=owner, owner_epoch=owner_epoch)


def _commit(txn_id: str, participants: Sequence[Participant],
            offsets: Mapping[str, Mapping[PartitionKey, int]] | None) -> TransactionMetadataEntry:
    commit = TransactionMetadataEntry(kind=TransactionMetadataEntry.COMMIT, txn_id=txn_id, timestamp_ms=now_ms())
    # Repeated fields set only when there is something in them: an empty list given to the constructor still
    # costs ~1 us each, and a one-step commit names neither participants nor (on the embedded store) offsets.
    if participants:
        commit.participants.extend(p.to_proto() for p in participants)
    if offsets:
        commit.offsets.extend(_group_offsets(offsets))
    return commit


def _claim_record(txn_id: str, offsets: Mapping[str, Mapping[PartitionKey, int]]) -> TransactionMetadataEntry:
    """The CLAIM of a transaction's offsets' partitions (see commit_log): an ABORT that names no transaction."""
    claim = TransactionMetadataEntry(kind=TransactionMetadataEntry.ABORT, txn_id=CLAIM_PREFIX + txn_id,
                                     timestamp_ms=now_ms())
    claim.offsets.extend(_group_offsets(offsets))
    return claim


def _group_offsets(offsets: Mapping[str, Mapping[PartitionKey, int]]) -> list[GroupOffsets]:
    """``offsets`` (consumer group -> positions) as the log's records carry them."""
    return [GroupOffsets(group=group, offsets=[PartitionOffset(stream=s, partition=p, offset=o)
                                               for (s, p), o in positions.items()])
            for group, positions in offsets.items()]


def _unknown(group: str, txn_id: str, doing: str, cause: KafkaException | str) -> KafkaException:
    """The error for a terminal record that may or may not have decided ``txn_id``."""
    code = cause.code if isinstance(cause, KafkaException) else ErrorCode.UNKNOWN
    return KafkaException(KafkaError(
        code, f"group {group!r}: the {doing} of transaction {txn_id} may or may not have taken effect ({cause}); "
        f"ask TransactionGroup.outcome({txn_id!r}) before doing anything else", outcome_unknown=True))
