"""The merge: committed transactions' staged records appended to their target partitions, exactly once.

Transactions are merged in commit-log order, each transaction's records contiguous in each partition; staged
blobs bound for an open partition are appended as they are, without decoding a record. A pass appends
everything it merged *and* the merger's progress (the next commit-log offset, a record of the group's progress
stream: :mod:`onceflow.txn.progress`) in one atomic append conditional on the progress it started from. So a
crash at any point rolls forward from the commit log, and of two processes merging the same entries one wins and
the other finds the work done (CAS_MISMATCH). On Kafka the pass is one Kafka transaction: an exactly-once
consume-transform-produce loop whose progress lives in a topic that never expires.

A process remembers the progress its own last pass stored (the record's offset, and the end that record and
what the store adds after it leave: a Kafka transaction's commit marker takes an offset), or else the one it
last read, and starts its next pass (or one-step commit) from it without reading the progress stream back.
That is only a guess of what the store holds, checked where it counts: the pass's condition is that the stream
still ends there, so if another process stored a progress meanwhile the pass gets CAS_MISMATCH, writes nothing,
and the next attempt reads the stream. As the progress only grows, a remembered one is never past the stored
one. Where other processes merge too, a remembered progress would lose such races often (each costing a pass):
after one loss, the next passes read the stream.

Another process may truncate the commit log and staging under a pass (see :mod:`onceflow.txn.truncation`): it
only cuts what a merge already merged, so a pass that finds its entries or staged records gone re-reads the
progress, which has moved past them, and stops or goes on from there.

Routing does not assume the epoch in force when the transaction began: records staged for a partition that
is no longer open (the stream scaled), or for no partition, go by their keys to the stream's current epoch. A
scale that seals a partition under a pass makes the whole pass fail with PARTITION_SEALED, its progress with it
(on Kafka the store checks the seals after the records landed and before the Kafka transaction commits), and the
next pass routes again: scale and merge are linearized per stream.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.partitioner import partition_for_key
from onceflow.connector.store import (
    Batch,
    OffsetCommit,
    PartitionKey,
    Record,
    RecordFields,
    Store,
    StreamDescription,
    batch_codec,
    describe_if_exists,
)
from onceflow.connector.store.batch_codec import Encoded
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn.commit_log import CommitLog
from onceflow.txn.progress import Progress, ProgressStream, encode_offsets, kept_in_stream
from onceflow.txn.staging import Participant, read_staged

log = logging.getLogger(__name__)

_MAX_RECORDS_PER_PASS = 200_000
_MAX_ATTEMPTS = 100
_DISTRUST_PASSES = 16  # passes that read the progress after a remembered one lost a race (others merge too)
_KEPT_CUT_EVERY = 1_000  # offsets a kept group's stream grows by between cuts of its superseded records


class Merger:
    """Merges one group's committed transactions; any number of processes may run one at once. Thread-safe:
    the passes of one process take turns (they share one store writer, whose sequence numbers must stay in
    order, and would only race each other)."""

    def __init__(self, store: Store, commit_log: CommitLog, staging_stream: str, progress: ProgressStream,
                 max_bytes: int) -> None:
        self._store = store
        self._max_bytes = max_bytes
        self._log = commit_log
        self._staging = staging_stream
        self._progress = progress
        self._writer = store.open_writer()
        self._streams: dict[str, StreamDescription] = {}
        self._lock = threading.Lock()  # held by the caller running a pass
        self._pass_ended = threading.Event()  # set when the pass under way (if any) ends: none yet
        self._pass_ended.set()
        self._reached = 0  # the furthest progress a pass of this process stored or found
        self._stored: Progress | None = None  # the progress this process last stored or read (module docstring)
        self._gap: int | None = None  # a progress record's offset to the stream's end after it, as last read
        self._distrust = 0  # passes left that read the progress instead of remembering it
        self._kept_cut: dict[str, int] = {}  # a kept group's stream -> the offset this process last cut it before
        self._at_hand: dict[str, Mapping[PartitionKey, Sequence[RecordFields]]] = {}  # see records_at_hand

    def close(self) -> None:
        self._lock.acquire()
        with self._turn():
            self._writer.close()

    @contextlib.contextmanager
    def records_at_hand(self, txn_id: str, records: Mapping[PartitionKey, Sequence[RecordFields]]) -> Iterator[None]:
        """While the block runs, a merge of ``txn_id`` takes the records its COMMIT carries from ``records`` (its
        committer's own, which the COMMIT's blobs were encoded from) instead of decoding them again: ~0.6 ms a
        thousand records of the committer's wait."""
        self._at_hand[txn_id] = records
        try:
            yield
        finally:
            del self._at_hand[txn_id]

    def progress(self) -> int | None:
        """The next commit-log offset to merge, None before the first merge."""
        return self._progress.read().merged_to

    def read_progress(self) -> Progress:
        """The progress with what a pass that stores the next one must find (see :meth:`progress_batch`): the one
        this process stored or read last, if it remembers it (a guess the batch's condition checks), else as read:
        a one-step commit that read it each time spent 3 of its 14 SQL statements on it."""
        remembered = self._stored
        if remembered is None:
            remembered = self._read()
            if not self._distrust:  # others merge too: the next commit reads it again
                self._stored = remembered
        return remembered

    def progress_batch(self, read: Progress, merged_to: int) -> Batch:
        """The batch that stores ``merged_to`` in an atomic append, unless the progress moved since ``read``."""
        self._stored = None  # stored outside a pass: what this process's last pass stored is no longer the last
        return self._progress.advance(read, merged_to)

    def remembered_progress(self) -> int | None:
        """The progress this process stored or read last, if it remembers it (see the module docstring); else None."""
        stored = self._stored
        return stored.merged_to if stored is not None else None

    def progress_at_least(self) -> int:
        """How far the merge's progress is known to be, without a read: what this process's passes reached or
        stored last (it only moves on; 0 before this process knew any)."""
        stored = self._stored
        return max(self._reached, stored.merged_to if stored is not None and stored.merged_to is not None else 0)

    def stored(self, merged_to: int, at: int) -> None:
        """A :meth:`progress_batch` landed at offset ``at``: remembered as a pass's own progress is."""
        if self._distrust:
            self._distrust -= 1
        elif self._gap is not None:
            self._stored = Progress(merged_to, at + self._gap, at)

    def lost_race(self) -> None:
        """A :meth:`progress_batch` got CAS_MISMATCH: others store progress too; read it for the next passes."""
        self._distrust = _DISTRUST_PASSES

    def merge(self, until: int | None = None) -> int:
        """Merge every committed transaction stored so far (or below ``until``); returns the progress reached.

        A caller with ``until`` waits for a pass under way instead of queueing for the merge's lock, and returns
        once a pass reached it: committers queued for the lock each took their turn only to find their commit
        merged, one after another (64 committers at once: the lock was free ~30% of the time, being handed on)."""
        while until is not None:
            if self._reached >= until:
                return self._reached
            ended = self._pass_ended
            if self._lock.acquire(blocking=False):
                break
            ended.wait()  # then look again: reached, or this caller runs the next pass
        else:
            self._lock.acquire()
        with self._turn():
            reached = self._merge(until)
            self._reached = max(self._reached, reached)
            return reached

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """The block runs holding the merge's lock (acquired by the caller); callers waiting for it to end are
        woken once it is released."""
        self._pass_ended = ended = threading.Event()
        try:
            yield
        finally:
            self._lock.release()
            ended.set()

    def _merge(self, until: int | None) -> int:
        for _ in range(_MAX_ATTEMPTS):
            remembered, self._stored = self._stored, None
            progress = remembered or self._read()
            if until is None or self._log.read_to < until:
                self._log.catch_up()
            end = self._log.read_to  # not the log's end: Kafka's transaction markers may follow the last entry
            start = progress.merged_to
            if start is None:
                start = self._store.partition_state(self._log.stream, 0).start_offset
            target = end if until is None else min(until, end)
            if start >= target:
                self._stored = remembered  # still the last stored: the committers waiting behind need not read it
                return start
            try:
                merged_to = self._pass(progress, start, end)
            except KafkaException as exc:
                if exc.code == ErrorCode.CAS_MISMATCH:
                    if remembered is not None:
                        self._distrust = _DISTRUST_PASSES
                    continue  # another process merged these entries first
                if exc.code in (ErrorCode.PARTITION_SEALED, ErrorCode.UNKNOWN_TOPIC_OR_PART):
                    # A stream scaled meanwhile (route again into its current epoch), or was deleted (drop what
                    # was bound for it): describe the streams again.
                    self._streams.clear()
                    continue
                if exc.code == ErrorCode.OFFSET_OUT_OF_RANGE and self._merged_past(start):
                    continue  # another process merged these entries and truncated what they read
                if exc.error.retriable():
                    # Landed or not, the pass was conditional on the progress read above: read it again.
                    log.info("merge of %s: retrying after %s", self._log.stream, exc)
                    continue
                raise
            if merged_to >= target:
                return merged_to  # everything asked for: no need to read back what this pass stored
        fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"commit log {self._log.stream}: the merge lost {_MAX_ATTEMPTS} races "
             "in a row")

    def _read(self) -> Progress:
        """The progress as stored now; learns how far the stream's end lies past its last record."""
        progress = self._progress.read()
        if progress.at is not None:
            self._gap = progress.end - progress.at
        return progress

    def _merged_past(self, start: int) -> bool:
        """True when the progress moved past ``start``: what the pass read may have been truncated since."""
        progress = self.progress()
        return progress is not None and progress > start

    def _pass(self, progress: Progress, start: int, end: int) -> int:
        """Merge entries from ``start`` on, as many as fit one pass, in one atomic append; returns the progress
        stored."""
        batches: dict[PartitionKey, list[Encoded]] = {}
        offsets: dict[str, dict[PartitionKey, int]] = {}
        merged_to = start
        count = 0
        for entry, records in self._log.entries(start, end):
            if count >= _MAX_RECORDS_PER_PASS:
                break
            for index, record in enumerate(records):
                if record.kind == TransactionMetadataEntry.COMMIT and self._decides(record.txn_id, entry, index):
                    count += self._collect(record, batches, offsets)
            merged_to = entry + 1
        else:  # every entry below the view's end: past the transaction markers after the last one too, or a merge
            merged_to = end  # asked to reach that end passed again and again, storing progress (100, then failed)
        kept = self._keep_in_streams(offsets, batches)
        failpoint("txn.merge.before_append")
        results = self._writer.append_atomic(
            [*(Batch(stream, partition, Encoded.join(parts)) for (stream, partition), parts in batches.items()),
             self._progress.advance(progress, merged_to)],
            [OffsetCommit(group, positions) for group, positions in self._existing(offsets).items()],
        )
        failpoint("txn.merge.after_append")
        self.stored(merged_to, results[-1].last_offset)
        keys = list(batches)
        for group in kept:
            self._cut_superseded(group, results[keys.index((group, 0))].last_offset)
        log.debug("merged %s up to entry %d (%d records)", self._log.stream, merged_to, count)
        return merged_to

    def _keep_in_streams(self, offsets: dict[str, dict[PartitionKey, int]],
                         batches: dict[PartitionKey, list[Encoded]]) -> list[str]:
        """Move the offsets of onceflow's own groups that have a stream (a sink's progress) into it, as records
        of this pass: a group's committed offsets do not outlive Kafka's ``offsets.retention.minutes``. Returns
        those groups."""
        kept = [g for g in offsets if kept_in_stream(g) and self._stream(g) is not None]
        for group in kept:
            record = Record(None, encode_offsets(offsets.pop(group)))
            blob = batch_codec.encode([record], self._max_bytes, f"{group}[0]")
            batches.setdefault((group, 0), []).append(Encoded([(blob, 1)]))
        return kept

    def _cut_superseded(self, group: str, newest: int) -> None:
        """Now and then, cut a kept group's stream before its newest record: each record holds all of the group's
        offsets, so every earlier one is superseded (a query committing a batch a second for months would keep
        millions). The pass is stored whatever happens here: a failed cut is logged and tried again later."""
        if newest < self._kept_cut.get(group, 0) + _KEPT_CUT_EVERY:
            return
        try:
            self._store.truncate_before(group, 0, newest)
        except KafkaException as exc:
            log.warning("merge of %s: cutting %s before offset %d failed: %s", self._log.stream, group, newest, exc)
            return
        self._kept_cut[group] = newest

    def _decides(self, txn_id: str, entry: int, index: int) -> bool:
        txn = self._log.get(txn_id)
        return txn is not None and txn.decided_at == (entry, index)

    def _collect(self, commit: TransactionMetadataEntry, batches: dict[PartitionKey, list[Encoded]],
                 offsets: dict[str, dict[PartitionKey, int]]) -> int:
        """Add one committed transaction's records (staged, then carried in the COMMIT) and offsets to the pass;
        returns its record count."""
        count = 0
        for proto in commit.participants:
            participant = Participant.from_proto(proto)
            for staged in read_staged(self._store, self._staging, participant.staged_in(commit.txn_id), participant):
                count += self._place(commit.txn_id, staged.stream, staged.partition, staged.records, batches)
        at_hand = self._at_hand.get(commit.txn_id, {})
        for inline in commit.inline:
            records = Encoded.stored(inline.records, f"transaction {commit.txn_id}: records for {inline.stream}",
                                     at_hand.get((inline.stream, inline.partition)))
            count += self._place(commit.txn_id, inline.stream, inline.partition, records, batches)
        for group in commit.offsets:
            positions = offsets.setdefault(group.group, {})
            positions.update({(p.stream, p.partition): p.offset for p in group.offsets})
        return count

    def _existing(self, offsets: dict[str, dict[PartitionKey, int]]) -> dict[str, dict[PartitionKey, int]]:
        """The groups' positions in partitions that still exist: a stream deleted since the COMMIT has no offsets
        to commit (Kafka refuses them, and a merge that failed on them would never publish anything again)."""
        existing: dict[str, dict[PartitionKey, int]] = {}
        for group, positions in offsets.items():
            for (stream, partition), offset in positions.items():
                description = self._stream(stream)
                if description is not None and partition not in description.partitions:
                    self._streams.pop(stream)  # described before a scale added it, perhaps: look again
                    description = self._stream(stream)
                if description is not None and partition in description.partitions:
                    existing.setdefault(group, {})[(stream, partition)] = offset
                else:
                    log.warning("merge of %s: %s[%d] does not exist any more; group %r's offset %d for it is "
                                "dropped", self._log.stream, stream, partition, group, offset)
        return existing

    def _place(self, txn_id: str, stream: str, partition: int, records: Encoded,
               batches: dict[PartitionKey, list[Encoded]]) -> int:
        """Add records bound for ``stream`` (``partition`` -1: by key) to the pass; returns how many."""
        description = self._stream(stream)
        if description is None:
            log.warning("transaction %s: stream %r was deleted; its %d records are dropped", txn_id, stream,
                        len(records))
            return len(records)
        if partition in description.current.partitions:  # as staged: the blob moves unchanged
            batches.setdefault((stream, partition), []).append(records)
        else:
            self._route_by_key(description, records, batches)
        return len(records)

    def _route_by_key(self, description: StreamDescription, records: Sequence[RecordFields],
                      batches: dict[PartitionKey, list[Encoded]]) -> None:
        """Records staged for no partition, or one a scale sealed: by key into the current epoch."""
        current = description.current.partitions
        routed: dict[int, list[RecordFields]] = {}
        for record in records:
            key = record[0]
            routed.setdefault(partition_for_key(key or b"", current), []).append(record)
        for partition, chosen in routed.items():
            blob = batch_codec.encode(chosen, self._max_bytes, f"{description.name}[{partition}]")
            batches.setdefault((description.name, partition), []).append(Encoded([(blob, len(chosen))]))

    def _stream(self, name: str) -> StreamDescription | None:
        description = self._streams.get(name)
        if description is None:
            description = describe_if_exists(self._store, name)
            if description is not None:
                self._streams[name] = description
        return description

