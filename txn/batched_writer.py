"""The batched writer of a group's commit log (PIP-160): many callers' control records, one stored entry.

Records are buffered and flushed as one batched entry when the first threshold is reached: max records, max
bytes, or max delay of the oldest record. The default delay, 0, writes an entry as soon as the flusher is free:
the records submitted while one entry is being written share the next, so entries fill under load and a lone
commit waits for nothing (1 ms of delay cost a lone Kafka commit about 1 ms twice, its BEGIN and its COMMIT).
Every caller's future completes with its own record's position (entry offset, batch index, batch size). With
batching off, each record is written at once as an unbatched entry; batching can be switched on and off while
running.

An entry is one stored record, so it stays under ``message.max.bytes`` whatever
``transaction.log.batch.max.bytes`` says: a record too big to be stored alone fails only its own caller
(MSG_SIZE_TOO_LARGE), never the others it would have shared an entry with. The flusher thread outlives any
failure: each caller is completed with its position or a typed error, and a caller waits a bounded time. An
error whose entry may have been stored (a retriable failure that outlasted the retries, a failure after the
append, a wait that timed out) says ``outcome_unknown()``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from onceflow.connector.config import StoreConfig, TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import Record, Writer
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import log_codec, metrics

log = logging.getLogger(__name__)

_RETRY_FOR_S = 30.0
_WAIT_FOR_S = 4 * _RETRY_FOR_S  # a caller's bound: its entry's append and those queued before it may each retry
_ENTRY_OVERHEAD = 512  # bytes a stored entry adds to its records: framing, record_count, the store's record headers
_RECORD_OVERHEAD = 6  # a record's field tag and length prefix inside a batched entry


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a control record is stored: the entry's offset in the commit log, its index and the batch size;
    ``stored_at``: when this process learned it was stored (monotonic), so a later look is known to come after
    (unknown: infinity, which no look comes after)."""

    entry: int
    index: int
    size: int
    stored_at: float = dataclasses.field(default=math.inf, compare=False)

    @property
    def txn_id(self) -> str:
        """The id of a transaction whose BEGIN is here; unique forever within the group."""
        return f"{self.entry}.{self.index}"


@dataclasses.dataclass
class _Pending:
    record: TransactionMetadataEntry
    size: int
    since: float
    future: Future[Position]


class BatchedLogWriter:
    """Writes control records to one commit-log partition; thread-safe; see the module docstring."""

    def __init__(self, writer: Writer, stream: str, config: TransactionConfig,
                 message_max_bytes: int = StoreConfig.message_max_bytes,
                 on_stored: Callable[[int, list[TransactionMetadataEntry]], None] | None = None) -> None:
        """``on_stored``: told each entry stored (its offset and records) before its callers are, so a view of the
        log this process keeps need not read back what it wrote (:meth:`CommitLog.appended`)."""
        self._writer = writer
        self._on_stored = on_stored
        self._stream = stream
        self._group = config.group
        self._max_records = config.log_batch_max_records
        self._max_bytes = min(config.log_batch_max_bytes, message_max_bytes - _ENTRY_OVERHEAD)
        self._max_delay_s = config.log_batch_max_delay_ms / 1000
        self._batching = config.log_batching
        self._pending: list[_Pending] = []
        self._bytes = 0
        self._cond = threading.Condition()
        self._append_lock = threading.Lock()  # one append at a time keeps the writer's sequence numbers in order
        self._closed = False
        self._flusher: threading.Thread | None = None

    @property
    def max_entry_bytes(self) -> int:
        """The most bytes of records one entry holds (from the config and message.max.bytes)."""
        return self._max_bytes

    @property
    def batching(self) -> bool:
        return self._batching

    def set_batching(self, enabled: bool) -> None:
        """Switch batching on or off; records already buffered are flushed first."""
        with self._cond:
            self._batching = enabled
            self._cond.notify_all()

    def submit(self, record: TransactionMetadataEntry) -> Future[Position]:
        """Queue a control record; the future completes with its position once it is stored, or with a typed
        error (MSG_SIZE_TOO_LARGE at once for a record that cannot be stored even alone)."""
        item = _Pending(record, record.ByteSize() + _RECORD_OVERHEAD, time.monotonic(), Future())
        if item.size > self._max_bytes:
            item.future.set_exception(KafkaException(KafkaError(
                ErrorCode.MSG_SIZE_TOO_LARGE, f"group {self._group!r}: a control record of {item.size} bytes cannot "
                f"be stored in the commit log (entries hold at most {self._max_bytes} bytes, from message.max.bytes)")))
            return item.future
        with self._cond:
            if self._closed:
                fail(ErrorCode._STATE, f"the commit log writer of group {self._group!r} is closed")
            if self._batching:
                self._pending.append(item)
                self._bytes += item.size
                self._start_flusher()
                self._cond.notify_all()
                return item.future
        self._write([item], "unbatched")
        return item.future

    def append(self, record: TransactionMetadataEntry) -> Position:
        """Submit and wait (a bounded time)."""
        return self.wait(self.submit(record))

    def wait(self, future: Future[Position]) -> Position:
        """A submitted record's position; _TIMED_OUT with ``outcome_unknown()`` if it is not told in time."""
        try:
            return future.result(timeout=_WAIT_FOR_S)
        except FutureTimeout:
            fail(ErrorCode._TIMED_OUT, f"group {self._group!r}: a commit-log record was not stored within "
                 f"{_WAIT_FOR_S:.0f} s; it may still be", outcome_unknown=True)

    def close(self) -> None:
        """Flush what is buffered, then stop and close the store writer (it was handed over to this one)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            flusher = self._flusher
        if flusher is not None:
            flusher.join(timeout=_WAIT_FOR_S)
        with self._append_lock:
            self._writer.close()

    # -- the flusher ----------------------------------------------------------------------------------------

    def _start_flusher(self) -> None:
        """Start the flusher thread if none runs (the first time, or after one ended abnormally); under _cond."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._run, name=f"txn-log-{self._group}", daemon=True)
            self._flusher.start()

    def _run(self) -> None:
        try:
            while True:
                taken = self._next_batch()
                if taken is None:
                    return
                self._write(*taken)
        finally:
            self._stopped()

    def _next_batch(self) -> tuple[list[_Pending], str] | None:
        """Wait until the buffer must be flushed; the records of one entry and why, or None once closed."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            trigger = self._trigger()
            while trigger is None:
                self._cond.wait(max(0.0, self._pending[0].since + self._max_delay_s - time.monotonic()))
                trigger = self._trigger()
            return self._take(), trigger

    def _stopped(self) -> None:
        """The flusher ends: records still buffered (only if it died, as close() flushes them) fail, never stored,
        and a later submit starts a new flusher."""
        with self._cond:
            self._flusher = None
            left, self._pending, self._bytes = self._pending, [], 0
        _complete(left, KafkaError(ErrorCode._STATE, f"group {self._group!r}: the commit log writer stopped before "
                                   "storing this record", retriable=True))

    def _trigger(self) -> str | None:
        """Why the buffer must be flushed now, if it must."""
        if len(self._pending) >= self._max_records:
            return "max_records"
        if self._bytes >= self._max_bytes:
            return "max_bytes"
        if time.monotonic() - self._pending[0].since >= self._max_delay_s:
            return "max_delay"
        if self._closed or not self._batching:
            return "forced"
        return None

    def _take(self) -> list[_Pending]:
        """The oldest records that fit one entry."""
        count, size = 0, 0
        for item in self._pending[: self._max_records]:
            if count and size + item.size > self._max_bytes:
                break
            count, size = count + 1, size + item.size
        batch, self._pending = self._pending[:count], self._pending[count:]
        self._bytes -= size
        return batch

    def _write(self, batch: list[_Pending], trigger: str) -> None:
        """Store one entry (batched, or unbatched for a single record with batching off) and complete every
        caller's future, whatever fails; never raises (it runs on the flusher, which must outlive failures)."""
        try:
            entry = _encode([item.record for item in batch], trigger)
            base_offset = self._append_with_retry(entry)
        except Exception as exc:  # every caller is told, typed
            _complete(batch, self._append_failure(exc))
            return
        try:
            failpoint("txn.log.after_flush")
            self._observe(batch, len(entry), trigger)
            if self._on_stored is not None:
                self._on_stored(base_offset, [item.record for item in batch])
        except Exception as exc:  # stored, yet something failed before the callers were told
            log.exception("group %s: commit-log entry %d is stored but its callers cannot be told", self._group,
                          base_offset)
            _complete(batch, KafkaError(ErrorCode._STATE, f"group {self._group!r}: the commit-log entry was stored at "
                                        f"{base_offset}, then its writer failed ({exc})", outcome_unknown=True))
            return
        stored_at = time.monotonic()
        for index, item in enumerate(batch):
            item.future.set_result(Position(base_offset, index, len(batch), stored_at))

    def _append_failure(self, exc: Exception) -> KafkaError:
        """What callers are told when their entry could not be stored: definite only if the store refused it
        (encoding errors are the store's own MSG_SIZE_TOO_LARGE, CORRUPT_MESSAGE, ...: typed, refused)."""
        if isinstance(exc, KafkaException) and not (exc.error.retriable() or exc.error.outcome_unknown()):
            return exc.error
        return KafkaError(exc.code if isinstance(exc, KafkaException) else ErrorCode.UNKNOWN,
                          f"group {self._group!r}: storing a commit-log entry failed and it may or may not be stored "
                          f"({exc})", outcome_unknown=True)

    def _observe(self, batch: list[_Pending], entry_bytes: int, trigger: str) -> None:
        group = self._group
        metrics.RECORDS_PER_BATCH.labels(group).observe(len(batch))
        metrics.BYTES_PER_BATCH.labels(group).observe(entry_bytes)
        metrics.OLDEST_RECORD_DELAY.labels(group).observe(time.monotonic() - batch[0].since)
        metrics.FLUSHES.labels(group, trigger).inc()

    def _append_with_retry(self, entry: bytes) -> int:
        """Append one entry, retrying retriable errors for a while (the writer is idempotent: never twice). Every
        attempt passes the same records: a writer takes an append for a retry of the one that failed only then, so
        one that landed but reported an error is found landed, not written again."""
        deadline = time.monotonic() + _RETRY_FOR_S
        records = [Record(None, entry)]
        uncertain = False  # an attempt failed retriably: it may have stored the entry all the same
        while True:
            try:
                with self._append_lock:
                    return self._writer.append(self._stream, 0, records).base_offset
            except KafkaException as exc:
                if exc.error.retriable() and time.monotonic() < deadline:
                    uncertain = True
                    time.sleep(0.01)
                    continue
                if uncertain and not exc.error.retriable():  # a refusal now (say, closed) says nothing of before
                    raise KafkaException(KafkaError(exc.code, f"{exc.error.str()}, after an attempt that may have "
                                                    "stored the entry", outcome_unknown=True)) from exc
                raise


def _encode(records: list[TransactionMetadataEntry], trigger: str) -> bytes:
    return log_codec.encode_unbatched(records[0]) if trigger == "unbatched" else log_codec.encode_batched(records)


def _complete(batch: list[_Pending], error: KafkaError) -> None:
    """Fail every future of ``batch`` not completed yet with ``error``."""
    for item in batch:
        if not item.future.done():
            item.future.set_exception(KafkaException(error))
