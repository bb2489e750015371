"""An exactly-once sink for numbered batches (a Spark micro-batch, a ``foreachBatch`` call, a batch job).

Seed 002's "read-transform-write copied exactly once": each task stages its part of batch B in a transaction of
its own (:class:`SinkTask`); the driver commits batch B (:meth:`ExactlyOnceSink.commit_batch`) with one COMMIT
that joins the tasks' transactions and moves the sink's progress to B+1 in the same transaction, on the
condition that the progress is B when the COMMIT lands. So B commits only after B-1, a replayed B that already
committed is a no-op, a gap is an error, and a task attempt the driver did not name (failed, retried,
speculative) is never published: its transaction times out or is aborted when its batch ends.

A sink id belongs to the first query that commits through it; another query naming it is refused
(SINK_ID_IN_USE), so two queries never interleave their batch numbers in one sink.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Sequence

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import PartitionKey, Record, Store, Writer, ensure_stream, read_range
from onceflow.txn.group import TransactionGroup
from onceflow.txn.progress import kept_offsets
from onceflow.txn.staging import Participant, StagingWriter

log = logging.getLogger(__name__)

SINK_ID = re.compile(r"^[A-Za-z0-9_-]{1,90}$")
CLAIMS_STREAM = "__onceflow.sinks"
"""Which query owns which sink id: one record per claim, keyed by sink id, appended by CAS."""
_FLUSH_EVERY_RECORDS = 5_000
_CLAIM_ATTEMPTS = 20


def sink_owner(sink_id: str) -> str:
    """The owner named in the BEGIN of a sink's task transactions (owner epoch: the batch id)."""
    return f"sink:{sink_id}"


def progress_group(sink_id: str) -> str:
    """The onceflow group whose offset is the sink's next batch id, kept by the merge as the last record of the
    stream of the same name (:func:`onceflow.txn.progress.kept_in_stream`), where retention cannot remove it."""
    return f"__onceflow.sink.{sink_id}"


@dataclasses.dataclass(frozen=True)
class StagedPart:
    """What one task staged for a batch; the driver names it when it commits the batch. Picklable."""

    txn_id: str
    participant: Participant
    records: int


class SinkTask:
    """One task attempt's part of a batch, staged in a transaction of its own, begun at its first record."""

    def __init__(self, group: TransactionGroup, sink_id: str, batch_id: int, writer_id: str, timeout_ms: int,
                 store_writer: Writer | None = None) -> None:
        self._group = group
        self._sink_id = sink_id
        self._batch_id = batch_id
        self._writer_id = writer_id
        self._timeout_ms = timeout_ms
        self._store_writer = store_writer  # None: the staging writer opens one and closes it with itself
        self._writer: StagingWriter | None = None
        self._records = 0

    def produce(self, stream: str, record: Record, partition: int = -1) -> None:
        """Stage a record for ``stream`` (``partition`` -1: by key when the batch is merged)."""
        if self._writer is None:
            txn_id = self._group.begin(self._timeout_ms, owner=sink_owner(self._sink_id), owner_epoch=self._batch_id)
            self._writer = self._group.writer(txn_id, self._writer_id, self._store_writer, known_open=True)
        self._writer.produce(stream, record, partition)
        self._records += 1
        if self._records % _FLUSH_EVERY_RECORDS == 0:
            self._writer.flush()  # bounded memory for large tasks

    def abandon(self) -> None:
        """End a task that failed before :meth:`finish`: its staging writer is closed (its store writer too, if it
        opened one; a lent one is the lender's to close) and its transaction aborted at once, rather than left open
        to pin the commit log until its timeout. A failed abort is logged: the timeout aborts it then."""
        if self._writer is None:
            return
        self._writer.close()
        try:
            self._group.abort(self._writer.txn_id)
        except KafkaException as exc:
            log.warning("sink %s batch %d: transaction %s of a failed task could not be aborted (%s); its timeout "
                        "will abort it", self._sink_id, self._batch_id, self._writer.txn_id, exc)

    def finish(self) -> StagedPart | None:
        """Stage what is buffered; the part to hand to the driver (None if this task had no records)."""
        if self._writer is None:
            return None
        try:
            participant = self._writer.participant()
        finally:
            self._writer.close()  # one per task attempt (its store writer too, if it opened it)
        failpoint("sink.task.after_stage")
        assert participant is not None  # it produced at least one record
        return StagedPart(self._writer.txn_id, participant, self._records)


class ExactlyOnceSink:
    """The driver's side of one sink: which batch is next, and committing or aborting a batch."""

    def __init__(self, group: TransactionGroup, store: Store, sink_id: str, stream: str) -> None:
        if not SINK_ID.match(sink_id):
            fail(ErrorCode.INVALID_CONFIG, f"sink id must be 1-90 of [A-Za-z0-9_-], got {sink_id!r}")
        self._group = group
        self._store = store
        self.sink_id = sink_id
        self._progress_key: PartitionKey = (stream, 0)
        self._claimed_by: str | None = None
        store.describe_stream(stream)  # UNKNOWN_TOPIC_OR_PART: the merge would drop every row bound for it
        ensure_stream(store, progress_group(sink_id), 1)

    def next_batch(self) -> int | None:
        """The batch id the sink commits next; None before its first commit (any batch id may come first)."""
        return kept_offsets(self._store, progress_group(self.sink_id), [self._progress_key]).get(self._progress_key)

    def commit_batch(self, batch_id: int, parts: Sequence[StagedPart | None], query_id: str) -> bool:
        """Commit batch ``batch_id`` with exactly these parts; False if it had already committed (a replay).

        OUT_OF_ORDER_SEQUENCE_NUMBER if batches in between never committed, or if the batch is older than the last
        one committed (only that one is ever replayed: the query's checkpoint is older than the sink's progress);
        UNKNOWN_TOPIC_OR_PART if the sink's stream is gone; SINK_ID_IN_USE if another query owns the sink id;
        TRANSACTION_TIMED_OUT if a task's transaction timed out before the commit.
        """
        failpoint("sink.batch.before_commit")
        self._claim(query_id)
        self._store.describe_stream(self._progress_key[0])  # (the merge would drop the rows of a deleted stream)
        staged = [p for p in parts if p is not None]

        def batch_is_next() -> bool:
            """True if ``batch_id`` is the next batch, False for a replay of a committed one."""
            expected = self.next_batch()
            if expected is not None and batch_id > expected:
                fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, f"sink {self.sink_id!r}: batch {batch_id} comes after "
                     f"batch {expected - 1}, the last one committed; batches {expected}..{batch_id - 1} are missing")
            if expected is not None and batch_id < expected - 1:
                fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, f"sink {self.sink_id!r}: batch {batch_id} is older than "
                     f"batch {expected - 1}, the last one committed, and only that one is ever replayed: the "
                     "query's checkpoint is older than the sink (restored from a backup, or cut short); its batch "
                     "would publish again rows already published, or skip rows never published")
            return expected is None or batch_id == expected

        committed = self._group.commit_when(
            [p.participant for p in staged], batch_is_next,
            offsets={progress_group(self.sink_id): {self._progress_key: batch_id + 1}})
        failpoint("sink.batch.after_commit")
        self._end_batch(batch_id)
        if committed is None:
            log.info("sink %s: batch %d had already committed; its replay publishes nothing", self.sink_id, batch_id)
        return committed is not None

    def abort_batch(self, batch_id: int) -> None:
        """Abort every open task transaction of this batch (and of earlier ones)."""
        self._end_batch(batch_id)

    def _end_batch(self, batch_id: int) -> None:
        """Task attempts of this batch or earlier ones that were not committed never will be: abort them."""
        self._group.abort_older(sink_owner(self.sink_id), batch_id + 1)

    def _claim(self, query_id: str) -> None:
        """Make sure ``query_id`` owns the sink id, claiming it if nobody does."""
        if self._claimed_by == query_id:
            return
        ensure_stream(self._store, CLAIMS_STREAM, 1)
        for _ in range(_CLAIM_ATTEMPTS):
            end = self._store.partition_state(CLAIMS_STREAM, 0).end_offset
            owner = _claims(self._store, end).get(self.sink_id)
            if owner is not None:
                if owner.query != query_id:
                    fail(ErrorCode.SINK_ID_IN_USE, f"sink id {self.sink_id!r} belongs to query {owner.query}; query "
                         f"{query_id} must use another sink id")
                if owner.group not in (None, self._group.name):
                    # A batch it committed in that group may not be merged yet: this group's merge would not see
                    # it, and the batch would be committed (and published) twice.
                    fail(ErrorCode.INVALID_CONFIG, f"sink id {self.sink_id!r} commits in transaction.group "
                         f"{owner.group!r}, not {self._group.name!r}: keep the group a sink id began with")
                self._claimed_by = query_id
                return
            claim = Record(self.sink_id.encode(), json.dumps({"query": query_id, "group": self._group.name}).encode())
            writer = self._store.open_writer()
            try:
                writer.append(CLAIMS_STREAM, 0, [claim], expected_offset=end)
            except KafkaException as exc:
                if exc.code != ErrorCode.CAS_MISMATCH:
                    raise
            finally:
                writer.close()
        fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"sink id {self.sink_id!r}: could not claim it in "
             f"{_CLAIM_ATTEMPTS} attempts")


@dataclasses.dataclass(frozen=True)
class _Claim:
    query: str
    group: str | None  # None in claims made before the group was recorded


def _claims(store: Store, end: int) -> dict[str, _Claim]:
    """Each sink id's owning query and transaction group, from the claims below ``end``: the first claim of an id
    wins."""
    owners: dict[str, _Claim] = {}
    for message in read_range(store, CLAIMS_STREAM, 0, end=end):
        try:
            claim = json.loads(message.value() or b"")
            owners.setdefault((message.key() or b"").decode(), _Claim(claim["query"], claim.get("group")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{CLAIMS_STREAM} record {message.offset()}: not a sink claim ({exc})")
    return owners
