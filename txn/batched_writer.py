"""The batched writer of a group's commit log (PIP-160): many callers' control records, one stored entry.

Records are buffered and flushed as one batched entry when the first threshold is reached: max records, max
bytes, or max delay of the oldest record. Every caller's future completes with its own record's position
(entry offset, batch index, batch size). With batching off, each record is written at once as an unbatched
entry; batching can be switched on and off while running.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future

from onceflow.connector.config import TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.store import Record, Writer
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import log_codec, metrics

_RETRY_FOR_S = 30.0


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a control record is stored: the entry's offset in the commit log, its index and the batch size."""

    entry: int
    index: int
    size: int

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

    def __init__(self, writer: Writer, stream: str, config: TransactionConfig) -> None:
        self._writer = writer
        self._stream = stream
        self._group = config.group
        self._max_records = config.log_batch_max_records
        self._max_bytes = config.log_batch_max_bytes
        self._max_delay_s = config.log_batch_max_delay_ms / 1000
        self._batching = config.log_batching
        self._pending: list[_Pending] = []
        self._bytes = 0
        self._cond = threading.Condition()
        self._append_lock = threading.Lock()  # one append at a time keeps the writer's sequence numbers in order
        self._closed = False
        self._flusher: threading.Thread | None = None

    @property
    def batching(self) -> bool:
        return self._batching

    def set_batching(self, enabled: bool) -> None:
        """Switch batching on or off; records already buffered are flushed first."""
        with self._cond:
            self._batching = enabled
            self._cond.notify_all()

    def submit(self, record: TransactionMetadataEntry) -> Future[Position]:
        """Queue a control record; the future completes with its position once it is stored."""
        future: Future[Position] = Future()
        with self._cond:
            if self._closed:
                fail(ErrorCode._STATE, f"the commit log writer of group {self._group!r} is closed")
            if self._batching:
                self._pending.append(_Pending(record, record.ByteSize(), time.monotonic(), future))
                self._bytes += self._pending[-1].size
                self._start_flusher()
                self._cond.notify_all()
                return future
        self._write([_Pending(record, 0, time.monotonic(), future)], "unbatched")
        return future

    def append(self, record: TransactionMetadataEntry) -> Position:
        """Submit and wait."""
        return self.submit(record).result()

    def close(self) -> None:
        """Flush what is buffered, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join()

    # -- the flusher ----------------------------------------------------------------------------------------

    def _start_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._run, name=f"txn-log-{self._group}", daemon=True)
            self._flusher.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                trigger = self._trigger()
                while trigger is None:
                    self._cond.wait(max(0.0, self._pending[0].since + self._max_delay_s - time.monotonic()))
                    trigger = self._trigger()
                batch = self._take()
            self._write(batch, trigger)

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
        """Store one entry (batched, or unbatched for a single record with batching off) and complete the futures."""
        records = [item.record for item in batch]
        entry = log_codec.encode_unbatched(records[0]) if trigger == "unbatched" else log_codec.encode_batched(records)
        try:
            base_offset = self._append_with_retry(entry)
        except KafkaException as exc:
            for item in batch:
                item.future.set_exception(exc)
            return
        failpoint("txn.log.after_flush")
        group = self._group
        metrics.RECORDS_PER_BATCH.labels(group).observe(len(batch))
        metrics.BYTES_PER_BATCH.labels(group).observe(len(entry))
        metrics.OLDEST_RECORD_DELAY.labels(group).observe(time.monotonic() - batch[0].since)
        metrics.FLUSHES.labels(group, trigger).inc()
        for index, item in enumerate(batch):
            item.future.set_result(Position(base_offset, index, len(batch)))

    def _append_with_retry(self, entry: bytes) -> int:
        deadline = time.monotonic() + _RETRY_FOR_S
        while True:
            try:
                with self._append_lock:
                    return self._writer.append(self._stream, 0, [Record(None, entry)]).base_offset
            except KafkaException as exc:
                if not exc.error.retriable() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
