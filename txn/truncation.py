"""Truncation of a group's commit log and staging stream: only what every process agrees is finished is cut.

Many processes share a group and any of them may truncate, so nothing here trusts this process's view of the
log. A round first reads the merge's progress from the store, *then* reads the log up to it: every transaction
begun below the progress is then known to this view, and an entry is cut only if every transaction with a
record in it is decided below the progress (finished and merged). Staging is cut up to its first record of a
transaction that is open, or committed and not merged.

Readers survive a cut made under them: the commit-log view skips to the new start (what was cut was finished),
and a merge that finds staged records or log entries gone re-reads the progress, which another merge moved past
them. One race is left to time: a process that stored a terminal record must read it back to learn whether it
decided its transaction, so commit-log entries are cut only ``transaction.log.truncate.delay.ms`` after a round
found them finished. A process stalled for longer is told its outcome is unknown (see ``TransactionGroup``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from onceflow.connector.config import TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Store
from onceflow.txn import staging
from onceflow.txn.commit_log import CommitLog
from onceflow.txn.progress import ProgressStream

log = logging.getLogger(__name__)

_READ_BATCH = 1000


class Truncator:
    """Truncates one group's commit log and staging stream every ``transaction.log.truncate.every.entries``
    merged entries; thread-safe."""

    def __init__(self, store: Store, commit_log: CommitLog, staging_stream: str,
                 progress: ProgressStream, config: TransactionConfig) -> None:
        self._store = store
        self._log = commit_log
        self._staging = staging_stream
        self._progress = progress
        self._every = config.log_truncate_every_entries
        self._delay_s = config.log_truncate_delay_ms / 1000
        self._lock = threading.Lock()
        self._truncated_at = 0  # the merge progress when this process last truncated
        self._log_cuts: collections.deque[tuple[float, int]] = collections.deque()  # (when found, cut) to wait out

    def maybe_truncate(self, merged_to: int | None = None) -> None:
        """Truncate if the merge moved far enough on since this process last did; forget merged transactions.

        ``merged_to``: a merge progress this process saw stored (its own pass's), else it is read. Only whether
        a round is due depends on it: the round itself reads the progress first, as it must."""
        if merged_to is None:
            merged_to = self._progress.read().merged_to
        if merged_to is None:
            return
        with self._lock:
            due = merged_to - self._truncated_at >= self._every
            if due:
                self._truncated_at = merged_to
        if due:
            self.truncate()
        self._log.forget_merged(merged_to)

    def truncate(self) -> None:
        """One round: cut the log and every staging partition up to what a transaction may still need."""
        progress = self._progress.read()  # first the progress, then the log up to it: never the other way round
        merged_to = progress.merged_to
        if merged_to is None:
            return
        if progress.at is not None:
            self._cut(self._progress.stream, 0, progress.at)  # every progress record but the last is superseded
        self._log.catch_up()
        log_cut = self._wait_out(self._log.live_from(merged_to))
        if log_cut is not None:
            self._cut(self._log.stream, 0, log_cut)
        # Staging too, even while an open transaction pins the log: it only pins its own staging partition.
        for partition in self._store.describe_stream(self._staging).partitions:
            self._cut(self._staging, partition, self._staging_live_from(partition, merged_to))

    def _wait_out(self, cut: int) -> int | None:
        """The latest log cut found at least the delay ago (``cut`` itself with no delay), None if none is."""
        now = time.monotonic()
        due = None
        with self._lock:
            self._log_cuts.append((now, cut))
            while self._log_cuts and self._log_cuts[0][0] <= now - self._delay_s:
                due = self._log_cuts.popleft()[1]
        return due

    def _staging_live_from(self, partition: int, merged_to: int) -> int:
        """The first staged record of ``partition`` that a transaction may still need."""
        while True:
            try:
                return self._first_needed(partition, merged_to)
            except KafkaException as exc:
                if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                # Another process truncated it while it was read: read again from its new start.

    def _first_needed(self, partition: int, merged_to: int) -> int:
        state = self._store.partition_state(self._staging, partition)
        offset = state.start_offset
        while offset < state.end_offset:
            messages = self._store.read(self._staging, partition, offset, _READ_BATCH)
            if not messages:
                break
            for message in messages:
                txn_id = (dict(message.headers() or []).get(staging.TXN) or b"").decode(errors="replace")
                if not self._log.finished_and_merged(txn_id, merged_to):
                    return message.offset() or offset
            offset = (messages[-1].offset() or offset) + 1
        return min(offset, state.end_offset)

    def _cut(self, stream: str, partition: int, before: int) -> None:
        if before <= self._store.partition_state(stream, partition).start_offset:
            return
        try:
            self._store.truncate_before(stream, partition, before)
        except KafkaException as exc:  # truncation only saves space: the next round tries again
            log.warning("cannot truncate %s[%d] before %d: %s", stream, partition, before, exc)
