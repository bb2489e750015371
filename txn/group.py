"""A transaction group as one process sees it: its commit log, staging stream, batched log writer and merger.

Any number of processes open the same group. A transaction is begun in one of them (its id is the position of
its BEGIN), written by writers in any of them (:meth:`TransactionGroup.writer`), and committed from any of them
naming the writers' :class:`~onceflow.txn.staging.Participant` s. Outcomes come from the log (see
:mod:`onceflow.txn.commit_log`); the committer then merges, so its data is visible when :meth:`commit` returns, and
any later merge rolls forward what a crashed committer left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

from onceflow.connector.config import TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import Batch, OffsetCommit, PartitionKey, Record, Store, Writer
from onceflow.schemas.txn_log_pb2 import GroupOffsets, PartitionOffset, TransactionMetadataEntry
from onceflow.txn import log_codec, metrics, staging
from onceflow.txn.batched_writer import BatchedLogWriter, Position
from onceflow.txn.commit_log import CommitLog, LoggedTransaction, Outcome
from onceflow.txn.merge import Merger
from onceflow.txn.staging import Participant, StagingWriter

log = logging.getLogger(__name__)

TRUNCATE_EVERY_ENTRIES = 1024
"""Each time the merge moves this many commit-log entries on, the log and the staging stream are truncated up
to the first entry or staged record a transaction may still need."""
_EXPIRE_EVERY_S = 0.5
_ONE_STEP_ATTEMPTS = 5
_CONDITIONAL_ATTEMPTS = 50


def stream_names(group: str) -> tuple[str, str]:
    """The commit log and the staging stream of a group."""
    return f"__onceflow.txn.{group}.log", f"__onceflow.txn.{group}.staging"


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionGroup:
    """One group's transactions: begin, stage, commit, abort, time out, merge; see the module docstring."""

    def __init__(self, store: Store, config: TransactionConfig, message_max_bytes: int, *,
                 owns_store: bool = False) -> None:
        self.name = config.group
        self._store = store
        self._owns_store = owns_store
        self.log_stream, self.staging_stream = stream_names(config.group)
        _ensure_stream(store, self.log_stream, 1)
        _ensure_stream(store, self.staging_stream, config.staging_partitions)
        self._log = CommitLog(store, self.log_stream)
        self._log_writer = BatchedLogWriter(store.open_writer(), self.log_stream, config)
        self._merger = Merger(store, self._log, self.staging_stream, f"__onceflow.txn.{config.group}.merge",
                              message_max_bytes)
        self._message_max_bytes = message_max_bytes
        self._next_expiry = 0.0
        self._truncated_at = 0  # the merge progress when this process last truncated
        self._one_step_commits = True  # until the store says it cannot (Kafka)
        self._cas_writer: Writer | None = None
        metrics.serve(config.metrics_port)

    @property
    def store(self) -> Store:
        return self._store

    @property
    def log_writer(self) -> BatchedLogWriter:
        return self._log_writer

    def begin(self, timeout_ms: int, owner: str = "", owner_epoch: int = 0) -> str:
        """Begin a transaction that aborts unless committed within ``timeout_ms``; returns its id."""
        return self.begin_async(timeout_ms, owner, owner_epoch).result().txn_id

    def begin_async(self, timeout_ms: int, owner: str = "", owner_epoch: int = 0) -> Future[Position]:
        """:meth:`begin` without waiting: the BEGIN's position (whose ``txn_id`` names it) once it is stored."""
        if not isinstance(timeout_ms, int) or timeout_ms <= 0:
            fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT, f"group {self.name!r}: transaction timeout must be a "
                 f"positive number of ms, got {timeout_ms!r}")
        self._expire_due()
        return self._log_writer.submit(TransactionMetadataEntry(
            kind=TransactionMetadataEntry.BEGIN, timestamp_ms=_now_ms(), timeout_ms=timeout_ms, owner=owner,
            owner_epoch=owner_epoch))

    def writer(self, txn_id: str, writer_id: str, store_writer: Writer | None = None, *,
               known_open: bool = False) -> StagingWriter:
        """A writer staging records into an open transaction (``store_writer``: a fenced one, to stop zombies;
        ``known_open``: the caller just began it, so the log need not be read to check)."""
        if not known_open:
            self._require_open(txn_id, f"write as {writer_id!r} into")
        return StagingWriter(self._store, self.staging_stream, txn_id, writer_id,
                             store_writer or self._store.open_writer(), self._message_max_bytes)

    def commit(self, txn_id: str, participants: Sequence[Participant],
               offsets: Mapping[str, Mapping[PartitionKey, int]] | None = None) -> None:
        """Commit with exactly the named writers' records and ``offsets`` (group -> positions), then merge.

        TRANSACTION_TIMED_OUT if its timeout's abort came first, PRODUCER_FENCED if a newer instance of its
        owner aborted it, INVALID_TXN_STATE if it is unknown or already finished.
        """
        started = time.monotonic()
        txn = self._require_open(txn_id, "commit")
        if _now_ms() > txn.deadline_ms:
            self._decide(txn_id, _abort(txn_id, "timeout"), "abort")
            fail(ErrorCode.TRANSACTION_TIMED_OUT, f"group {self.name!r}: transaction {txn_id} passed its deadline "
                 "before COMMIT and was aborted")
        position = self._decide(txn_id, _commit(txn_id, participants, offsets), "commit")
        failpoint("txn.commit.after_commit_record")
        self._merger.merge(until=position.entry + 1)
        failpoint("txn.commit.after_merge")
        metrics.COMMIT_LATENCY.labels(self.name).observe(time.monotonic() - started)
        self._truncate_finished()

    def commit_at_once(self, targets: Mapping[PartitionKey, Sequence[Record]], writer: Writer, *, owner: str = "",
                       owner_epoch: int = 0, offsets: Mapping[str, Mapping[PartitionKey, int]] | None = None,
                       timeout_ms: int = 60_000) -> str | None:
        """Begin and commit, in one atomic append, a transaction whose records are all at hand: its BEGIN and
        COMMIT, its records in their partitions, the merge's progress and ``offsets`` land together or not at all.

        It needs a store that checks a partition's end inside an atomic append (the embedded one) and a log
        with nothing left to merge. Returns the transaction's id, or None when it cannot be done so (the log
        moved meanwhile, a partition was sealed, or the store cannot): then stage and :meth:`commit` as usual.
        """
        if not self._one_step_commits:
            return None
        started = time.monotonic()
        self._expire_due()  # abandoned transactions still time out where every commit is one step
        end = self._log.catch_up()
        progress = self._merger.progress()
        if progress != end and not (progress is None and end == 0):
            return None  # commits to merge first, or others' records not yet passed over
        now = _now_ms()
        txn_id = Position(end, 0, 2).txn_id
        entry = log_codec.encode_batched([
            TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timestamp_ms=now, timeout_ms=timeout_ms,
                                     owner=owner, owner_epoch=owner_epoch),
            _commit(txn_id, [], offsets)])
        progress_key = (self.log_stream, 0)
        batches = [Batch(self.log_stream, 0, [Record(None, entry)], expected_offset=end),
                   *(Batch(stream, partition, records) for (stream, partition), records in targets.items())]
        positions = [OffsetCommit(self._merger.progress_group, {progress_key: end + 1},
                                  expected={progress_key: progress}),
                     *(OffsetCommit(group, offsets_of) for group, offsets_of in (offsets or {}).items())]
        for attempt in range(_ONE_STEP_ATTEMPTS):
            try:
                writer.append_atomic(batches, positions)  # retried as is: if it landed, the store says duplicate
                break
            except KafkaException as exc:
                if exc.code == ErrorCode.INVALID_REQUEST:
                    self._one_step_commits = False  # this store cannot; never try again
                if exc.code in (ErrorCode.INVALID_REQUEST, ErrorCode.CAS_MISMATCH, ErrorCode.PARTITION_SEALED):
                    return None
                if not exc.error.retriable() or attempt == _ONE_STEP_ATTEMPTS - 1:
                    raise
                log.info("group %s: retrying the one-step commit of %s after %s", self.name, txn_id, exc)
        failpoint("txn.commit.after_one_step")
        metrics.COMMIT_LATENCY.labels(self.name).observe(time.monotonic() - started)
        self._truncate_finished()
        return txn_id

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
        for _ in range(_CONDITIONAL_ATTEMPTS):
            merged_to = self._merger.merge()
            end = self._log.catch_up()  # the CAS expects the log's end, transaction markers included (Kafka)
            if merged_to < self._log.read_to:
                continue  # a transaction committed meanwhile: merge it first, so the condition sees it
            if not condition():
                return None
            self._require_joinable({p.txn_id for p in participants if p.txn_id})
            txn_id = Position(end, 0, 2).txn_id
            entry = log_codec.encode_batched([
                TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timestamp_ms=_now_ms(),
                                         timeout_ms=timeout_ms),
                _commit(txn_id, participants, offsets)])
            try:
                self._conditional_writer().append(self.log_stream, 0, [Record(None, entry)], expected_offset=end)
            except KafkaException as exc:
                if exc.code == ErrorCode.CAS_MISMATCH or exc.error.retriable():
                    continue  # the log moved, or the append may have landed: look again
                raise
            failpoint("txn.commit.after_commit_record")
            self._merger.merge(until=end + 1)
            failpoint("txn.commit.after_merge")
            metrics.COMMIT_LATENCY.labels(self.name).observe(time.monotonic() - started)
            self._truncate_finished()
            return txn_id
        fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"group {self.name!r}: the commit log moved on {_CONDITIONAL_ATTEMPTS} "
             "times in a row while a conditional commit was checked")

    def abort(self, txn_id: str, reason: str = "requested") -> None:
        """Abort an open transaction; INVALID_TXN_STATE if it already committed."""
        self._require_open(txn_id, "abort")
        self._decide(txn_id, _abort(txn_id, reason), "abort")

    def outcome(self, txn_id: str) -> Outcome | None:
        """What the log says of a transaction now (None: unknown, or finished and merged long ago)."""
        self._log.catch_up()
        txn = self._log.get(txn_id)
        return txn.outcome if txn is not None else None

    def open_transactions(self) -> list[LoggedTransaction]:
        """Every transaction the log shows open now."""
        self._log.catch_up()
        return self._log.open_transactions()

    def expire(self) -> list[str]:
        """Abort every open transaction whose deadline passed; returns their ids."""
        self._log.catch_up()
        now = _now_ms()
        expired = [t.txn_id for t in self._log.open_transactions() if t.deadline_ms < now]
        for stored in [self._log_writer.submit(_abort(txn_id, "timeout")) for txn_id in expired]:
            stored.result()  # in the log (in one batched entry) when this returns
        return expired

    def fence(self, owner: str, epoch: int) -> None:
        """Abort the open transactions of ``owner``'s older epochs (a new producer instance took over)."""
        self._log.catch_up()
        stale = [t.txn_id for t in self._log.open_transactions() if t.owner == owner and t.owner_epoch < epoch]
        for future in [self._log_writer.submit(_abort(txn_id, "fenced")) for txn_id in stale]:
            future.result()

    def merge(self) -> None:
        """Roll forward: merge every committed transaction not merged yet."""
        self._merger.merge()

    def close(self) -> None:
        self._log_writer.close()
        if self._owns_store:
            self._store.close()

    # -- helpers -------------------------------------------------------------------------------------------

    def _require_open(self, txn_id: str, doing: str) -> LoggedTransaction:
        self._log.catch_up()
        txn = self._log.get(txn_id)
        if txn is None:
            fail(ErrorCode.INVALID_TXN_STATE, f"group {self.name!r}: cannot {doing} transaction {txn_id!r}: no such "
                 "transaction (never begun, or finished long ago)")
        if txn.outcome is not Outcome.OPEN:
            raise self._finished(txn, doing)
        return txn

    def _require_joinable(self, txn_ids: set[str]) -> None:
        """Each transaction is open and within its deadline (one past it is aborted now)."""
        for txn_id in sorted(txn_ids):
            txn = self._require_open(txn_id, "join")
            if _now_ms() > txn.deadline_ms:
                self._decide(txn_id, _abort(txn_id, "timeout"), "abort")
                fail(ErrorCode.TRANSACTION_TIMED_OUT, f"group {self.name!r}: transaction {txn_id} passed its "
                     "deadline before the COMMIT that would join it and was aborted")

    def _conditional_writer(self) -> Writer:
        if self._cas_writer is None:
            self._cas_writer = self._store.open_writer()
        return self._cas_writer

    def _decide(self, txn_id: str, record: TransactionMetadataEntry, doing: str) -> Position:
        """Append a terminal record and check it is the one that decided the transaction."""
        position = self._log_writer.append(record)
        self._log.catch_up()
        txn = self._log.get(txn_id)
        if txn is None or txn.decided_at != (position.entry, position.index):
            if txn is None:
                fail(ErrorCode.INVALID_TXN_STATE, f"group {self.name!r}: transaction {txn_id!r} is gone")
            raise self._finished(txn, doing)
        return position

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
        return KafkaException(KafkaError(ErrorCode.INVALID_TXN_STATE, f"{where}: it was already aborted"))

    def _expire_due(self) -> None:
        if time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + _EXPIRE_EVERY_S
            self.expire()

    def _truncate_finished(self) -> None:
        """Drop commit-log entries whose records all belong to finished, merged transactions."""
        merged_to = self._merger.progress()
        if merged_to is None:
            return
        if merged_to - self._truncated_at >= TRUNCATE_EVERY_ENTRIES:
            # Staging too, even while an open transaction pins the log: it only pins its own staging partition.
            self._truncated_at = merged_to
            self._truncate(self.log_stream, 0, self._log.live_from(merged_to))
            for partition in self._store.describe_stream(self.staging_stream).partitions:
                self._truncate(self.staging_stream, partition, self._staging_live_from(partition, merged_to))
        self._log.forget_merged(merged_to)

    def _staging_live_from(self, partition: int, merged_to: int) -> int:
        """The first staged record of ``partition`` that a transaction may still need."""
        state = self._store.partition_state(self.staging_stream, partition)
        offset = state.start_offset
        while offset < state.end_offset:
            messages = self._store.read(self.staging_stream, partition, offset, 1000)
            if not messages:
                break
            for message in messages:
                txn_id = (dict(message.headers() or []).get(staging.TXN) or b"").decode(errors="replace")
                if not self._log.finished_and_merged(txn_id, merged_to):
                    return message.offset() or offset
            offset = (messages[-1].offset() or offset) + 1
        return state.end_offset

    def _truncate(self, stream: str, partition: int, before: int) -> None:
        if before <= self._store.partition_state(stream, partition).start_offset:
            return
        try:
            self._store.truncate_before(stream, partition, before)
        except KafkaException as exc:
            log.warning("group %s: cannot truncate %s[%d] before %d: %s", self.name, stream, partition, before, exc)


def _commit(txn_id: str, participants: Sequence[Participant],
            offsets: Mapping[str, Mapping[PartitionKey, int]] | None) -> TransactionMetadataEntry:
    return TransactionMetadataEntry(
        kind=TransactionMetadataEntry.COMMIT, txn_id=txn_id, timestamp_ms=_now_ms(),
        participants=[p.to_proto() for p in participants],
        offsets=[GroupOffsets(group=group, offsets=[PartitionOffset(stream=s, partition=p, offset=o)
                                                    for (s, p), o in positions.items()])
                 for group, positions in (offsets or {}).items()])


def _abort(txn_id: str, reason: str) -> TransactionMetadataEntry:
    return TransactionMetadataEntry(kind=TransactionMetadataEntry.ABORT, txn_id=txn_id, timestamp_ms=_now_ms(),
                                    reason=reason)


def _ensure_stream(store: Store, name: str, partitions: int) -> None:
    try:
        store.create_stream(name, partitions)
    except KafkaException as exc:
        if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise
