"""Ending transactions nobody will commit: those past their deadline, and those of a fenced owner's older epochs.

There are no pings: whoever begins or commits in a group aborts the transactions whose deadline (BEGIN's
timestamp + timeout) has passed, at most every half second. An ABORT that loses to a COMMIT changes nothing: the
first terminal record after a BEGIN decides (see :mod:`onceflow.txn.commit_log`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn.batched_writer import BatchedLogWriter
from onceflow.txn.commit_log import CommitLog, LoggedTransaction

_EXPIRE_EVERY_S = 0.5


def now_ms() -> int:
    return int(time.time() * 1000)


def abort_record(txn_id: str, reason: str) -> TransactionMetadataEntry:
    """An ABORT of ``txn_id``; ``reason`` (timeout, fenced, requested, claimed) tells its committer why it lost."""
    return TransactionMetadataEntry(kind=TransactionMetadataEntry.ABORT, txn_id=txn_id, timestamp_ms=now_ms(),
                                    reason=reason)


def fence_record(owner: str, epoch: int) -> TransactionMetadataEntry:
    """The mark that ``owner``'s instance ``epoch`` took over: an ABORT naming no transaction (``fence.`` never
    starts a transaction id), which decides nothing, so every reader of the log skips it."""
    return TransactionMetadataEntry(kind=TransactionMetadataEntry.ABORT, txn_id=f"fence.{owner}", reason="fenced",
                                    owner=owner, owner_epoch=epoch, timestamp_ms=now_ms())


class Expirer:
    """Aborts one group's expired and fenced transactions; thread-safe."""

    def __init__(self, commit_log: CommitLog, log_writer: BatchedLogWriter) -> None:
        self._log = commit_log
        self._log_writer = log_writer
        self._lock = threading.Lock()
        self._next_expiry = 0.0

    def expire_due(self) -> bool:
        """:meth:`expire`, unless this process did so less than half a second ago; whether it did."""
        with self._lock:
            due = time.monotonic() >= self._next_expiry
            if due:
                self._next_expiry = time.monotonic() + _EXPIRE_EVERY_S
        if due:
            self.expire()
        return due

    def expire(self) -> list[str]:
        """Abort every open transaction whose deadline passed; returns their ids once the aborts are stored."""
        now = now_ms()
        return self._abort_all(lambda t: t.deadline_ms < now, "timeout", complete=False)  # the next one sees later

    def fence(self, owner: str, epoch: int) -> list[str]:
        """Abort the open transactions of ``owner``'s epochs before ``epoch`` (a newer instance took over), and
        mark the take-over in the log (even with none open): the log then moves past every end an older instance
        looked at before, so its one-step commit either sees the new epoch or fails its condition (see
        ``TransactionGroup._commit_in_one_step``)."""
        aborted = self._abort_all(_older(owner, epoch), "fenced", complete=True, also=fence_record(owner, epoch))
        # A one-step commit whose entry landed before the mark, its Kafka transaction still open, would commit after
        # this returns: read on past the mark, which waits for that transaction to end (or takes it over).
        self._log.catch_up(complete=True)
        return aborted

    def abort_older(self, owner: str, epoch: int) -> list[str]:
        """Abort the open transactions of ``owner``'s epochs before ``epoch``, marking nothing: for an owner whose
        transactions all stage their records (never committed in one step), the aborts are all a fence needs."""
        return self._abort_all(_older(owner, epoch), "fenced", complete=True)

    def _abort_all(self, chosen: Callable[[LoggedTransaction], bool], reason: str, complete: bool,
                   also: TransactionMetadataEntry | None = None) -> list[str]:
        self._log.catch_up(complete)  # a fence misses no BEGIN of the instance it fences
        txn_ids = [t.txn_id for t in self._log.open_transactions() if chosen(t)]
        records = [abort_record(txn_id, reason) for txn_id in txn_ids] + ([also] if also is not None else [])
        stored = [self._log_writer.submit(record) for record in records]  # one entry, mostly
        for future in stored:
            self._log_writer.wait(future)
        return txn_ids


def _older(owner: str, epoch: int) -> Callable[[LoggedTransaction], bool]:
    """Whether a transaction is one of ``owner``'s epochs before ``epoch``."""
    return lambda txn: txn.owner == owner and txn.owner_epoch < epoch
