"""``Producer``: confluent-kafka's producer API on any onceflow store, plus CAS appends and fenced writers.

Records are batched per partition (``linger.ms``, ``batch.num.messages``, ``batch.size``) and appended
idempotently: a retried batch is never written twice. Delivery reports are served from :meth:`poll` and
:meth:`flush`, as in confluent-kafka. Batches are handed to the store from the calling thread, during
``produce``, ``poll`` and ``flush``: the embedded store writes them there and then; on Kafka the idempotent
producer delivers them in the background (batches pipeline) and their reports come from ``poll``/``flush``.
Thread-safe, as confluent-kafka's: threads sharing a producer take turns in its calls (a ``poll`` waiting for
a report lets the others in; a ``flush`` holds them until it is done).

``produce(..., expected_offset=N)`` or ``expected_sequence=S`` makes a CAS append: the record lands only if
the partition's end offset is N (or its last application sequence number is S), else its delivery report
carries CAS_MISMATCH and nothing is written. A producer with ``writer.id`` is a fenced epoch writer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from onceflow.connector.accumulator import (
    DUE,
    FULL,
    Batch,
    DeliveryCallback,
    accumulator,
    batch_of_one,
    fast_produce,
)
from onceflow.connector.config import ClientEvents, ProducerConfig, build
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.message import Headers, Message
from onceflow.connector.producer_transactions import ProducerTransactions, Report
from onceflow.connector.store import (
    AppendResult,
    Condition,
    PartitionKey,
    RecordFields,
    StreamDescription,
    Writer,
    records_of,
)
from onceflow.connector.store.batch_codec import record_size
from onceflow.connector.store.shared import stores
from onceflow.connector.threads import one_at_a_time
from onceflow.connector.topic import ClusterMetadata, ConsumerGroupMetadata, TopicPartition, cluster_metadata

log = logging.getLogger(__name__)

T = TypeVar("T")
_RETRY_BACKOFF_S = 0.05


def _to_bytes(what: str, data: str | bytes | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    fail(ErrorCode.INVALID_RECORD, f"{what} must be str, bytes or None, got {type(data).__name__}")


def _to_headers(headers: Mapping[str, Any] | list[tuple[str, Any]] | None) -> Headers | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(name), _to_bytes(f"header {name!r}", value)) for name, value in items]


class Producer:
    """Appends records to a store's streams; see the module docstring."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = build(ProducerConfig, config, "producer")
        self._events = ClientEvents(self._config.client, self._config.client_id, "producer", log)
        self._delivered: dict[PartitionKey, list[int]] = {}  # records and bytes delivered, for stats_cb
        tid = self._config.transactional_id
        # The queued batches, and the topics' partitions they are routed to (the accumulator's: it queues the
        # usual record without a Python call; see connector.accumulator).
        self._lock = threading.RLock()
        self._queue = accumulator(self._lock, self._config.linger_ms / 1000, self._config.batch_num_messages,
                                  self._config.batch_size, self._config.queue_buffering_max_messages,
                                  self._config.store.message_max_bytes, self._config.on_delivery,
                                  transactional=tid is not None)
        # A transactional Producer's records take the full path until it admits one into an open transaction
        # (ProducerTransactions.admit); each transactional call closes the fast path again.
        self._queue.accepting = tid is None
        self._store = stores.acquire(self._config.store)  # with the process's other Producers
        # Its appends outside transactions. A transactional Producer makes none: it opens it only if it must (on
        # Kafka a librdkafka producer, threads and connections each, that 64 such Producers kept idle).
        self._writer: Writer | None = None
        if self._config.transactional_id is None:
            try:
                self._appender()  # now: a writer.id fences its older instances as the Producer is made
            except BaseException:
                stores.release(self._store)
                raise
        self._streams: dict[str, StreamDescription] = {}
        self._batches = self._queue.batches
        self._current = self._queue.current  # partitions of each topic's open epoch
        self._partitions = self._queue.partitions  # every partition id of each topic, as last described
        self._reports: deque[tuple[DeliveryCallback, KafkaError | None, Message]] = deque()
        self._outcomes: deque[tuple[PartitionKey, Batch, Condition, AppendResult | None, KafkaError | None]]
        self._outcomes = deque()  # completed appends whose reports are not queued yet
        self._fatal: KafkaError | None = None
        self._transactions = (ProducerTransactions(self._store, self._config, tid, self._forget_routes)
                              if tid is not None else None)
        self._closed = False

    # -- public API ---------------------------------------------------------------------------------------

    @fast_produce
    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        *,
        callback: DeliveryCallback | None = None,
        expected_offset: int | None = None,
        expected_sequence: int | None = None,
        sequence: int | None = None,
    ) -> None:
        """Queue a record; with ``expected_offset``/``expected_sequence`` it is a CAS append (see module).

        A hot path: the usual record never gets here. ``fast_produce`` queues it with one call of the accumulator
        (compiled where pip built it); this is the path of every other record, and of every error."""
        with self._lock:
            self._produce(topic, value, key, partition, callback or on_delivery or self._config.on_delivery,
                          timestamp, headers, Condition(expected_offset, expected_sequence, sequence))

    def _produce(self, topic: str, value: str | bytes | None, key: str | bytes | None, partition: int,
                 report_to: DeliveryCallback | None, timestamp: int,
                 headers: Mapping[str, Any] | list[tuple[str, Any]] | None, condition: Condition) -> None:
        """:meth:`produce`'s full path: any record, and its errors."""
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        if self._closed:
            fail(ErrorCode._STATE, f"{topic}: the producer is closed; the record was not queued")
        if self._queue.in_flight >= self._config.queue_buffering_max_messages:
            raise BufferError(f"producer queue is full ({self._queue.in_flight} records awaiting delivery reports); "
                              "call poll() or flush()")
        value, key = _to_bytes("value", value), _to_bytes("key", key)
        header_list = _to_headers(headers)
        size = record_size(key, value, header_list)
        if size > self._config.store.message_max_bytes:
            fail(ErrorCode.MSG_SIZE_TOO_LARGE, f"{topic}: record of {size} bytes is over message.max.bytes "
                 f"({self._config.store.message_max_bytes})")
        fields = (key, value, header_list, timestamp or int(time.time() * 1000))
        routed = partition == -1 or partition is None
        if not routed and partition < 0:
            fail(ErrorCode._INVALID_ARG, f"{topic}: partition {partition}: expected a partition id >= 0, or -1 "
                 "to let the partitioner choose")
        try:
            target = self._route(topic, key) if routed else self._check_partition(topic, partition)
        except KafkaException as exc:
            if not self._report_unknown_topic(topic, partition, fields, report_to, exc):
                raise
            return
        if self._transactions is not None:
            if not condition.unconditional:
                fail(ErrorCode.INVALID_REQUEST, f"{topic}: a CAS append cannot be part of a transaction")
            self._queue.accepting = self._transactions.admit(topic)
        if self._transactions is None or report_to is not None:  # see Accumulator.in_flight
            self._queue.in_flight += 1
        if condition.unconditional:
            self._send_queued(self._queue.enqueue((topic, target), fields, report_to, routed, size))
            return
        self._send_batch((topic, target))  # keep order: what was produced before goes first, and lands first (the
        if self._writer is not None:  # condition is checked against the partition's end; on Kafka it was in flight)
            self._writer.flush(self._config.delivery_timeout_ms / 1000)
            self._handle_outcomes()
        self._send((topic, target), batch_of_one(fields, report_to, routed), condition)

    def poll(self, timeout: float | None = None) -> int:
        """Send due batches and serve delivery reports; returns how many callbacks ran."""
        deadline = time.monotonic() + (timeout if timeout is not None and timeout >= 0 else float("inf"))
        while True:
            served, next_due = self._poll_once()
            if served or next_due is None or time.monotonic() >= deadline:
                return served
            time.sleep(max(0.0, min(next_due, deadline) - time.monotonic()))  # other threads may produce meanwhile

    @one_at_a_time
    def _poll_once(self) -> tuple[int, float | None]:
        """One round of :meth:`poll`: the callbacks it ran, and when the next batch is due (None: none queued)."""
        self._send_due()
        if self._writer is not None:
            self._writer.poll(0)
        self._handle_outcomes()
        served = self._serve_reports()
        if self._events.stats_due():
            self._events.emit_stats(self._statistics())
        next_due = self._queue.next_due  # infinite: only a transaction's records are queued
        return served, next_due if self._batches and next_due < float("inf") else None

    @one_at_a_time
    def flush(self, timeout: float | None = None) -> int:
        """Send everything queued and serve every report; returns the records still queued (0)."""
        if self._transactions is not None:  # its records are the transaction's: never appended outside it
            self._stage_queued()
        else:
            while True:  # a completed batch may re-route records into new batches (a scaled stream)
                self._send_all()
                if self._writer is not None:
                    self._writer.flush(self._config.delivery_timeout_ms / 1000)
                self._handle_outcomes()
                if not self._batches:
                    break
        self._serve_reports()
        if self._events.stats_due():
            self._events.emit_stats(self._statistics())
        return len(self)

    @one_at_a_time
    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Drop the records still queued in batches (``in_queue``): their delivery reports, served by the next
        :meth:`poll` or :meth:`flush`, carry _PURGE_QUEUE and nothing of them is written. Records already handed
        to the store are not purged (``in_flight`` changes nothing): on Kafka they may be written already, and
        their reports come as usual. Queued transactional records are dropped by ``abort_transaction``."""
        if not in_queue or self._transactions is not None:
            return
        for (topic, partition), batch in list(self._batches.items()):
            error = KafkaError(ErrorCode._PURGE_QUEUE, f"{topic}[{partition}]: purged from the queue before it was "
                               "sent")
            self._report(batch, topic, partition, None, error)
        self._batches.clear()
        self._queue.next_due = float("inf")

    def __len__(self) -> int:
        return self._queue.in_flight

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return cluster_metadata(self._store, topic)

    @one_at_a_time
    def close(self) -> None:
        """Flush, then release the store; a second close does nothing, and a produce() after it raises _STATE."""
        if self._closed:
            return
        self._closed = True
        self._queue.accepting = False  # every later record takes the full path, which refuses it
        try:
            self.flush()  # a delivery callback it serves may still produce (and fail: the producer is closed)
        finally:
            try:
                if self._transactions is not None:
                    self._transactions.close()  # its group is shared: released whatever failed before
            finally:
                try:
                    if self._writer is not None:
                        self._writer.close()
                finally:
                    stores.release(self._store)  # shared: once per Producer, whatever failed before

    # -- transactions (Kafka's API; see connector.producer_transactions) ---------------------------------------

    @one_at_a_time
    def init_transactions(self, timeout: float | None = None) -> None:
        """Fence older instances of this transactional.id, abort their open transaction, finish their commits."""
        self._txns().init()

    @one_at_a_time
    def begin_transaction(self) -> None:
        self._queue.accepting = False
        self._txns().begin()

    @one_at_a_time
    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: ConsumerGroupMetadata,
                                    timeout: float | None = None) -> None:
        """Commit a consumer group's next offsets exactly when (and only if) the transaction commits."""
        if not isinstance(group_metadata, ConsumerGroupMetadata):
            fail(ErrorCode.INVALID_REQUEST, "group_metadata must come from Consumer.consumer_group_metadata()")
        # As confluent-kafka: logical and invalid offsets (OFFSET_INVALID: a partition with no position yet, as a
        # successor waiting for its predecessors after a scale) are ignored, not refused.
        offsets = {(tp.topic, tp.partition): tp.offset for tp in positions if tp.offset >= 0}
        for topic, partition in offsets:
            self._check_partition(topic, partition)  # UNKNOWN_TOPIC_OR_PART, and none of them is added
        self._txns().send_offsets(group_metadata.group_id, offsets, group_metadata.member_id,
                                  group_metadata.generation_id)

    @one_at_a_time
    def commit_transaction(self, timeout: float | None = None) -> None:
        """Commit: the transaction's records become visible, in commit order, when this returns."""
        self._in_transaction(ProducerTransactions.commit)
        self._serve_reports()

    @one_at_a_time
    def abort_transaction(self, timeout: float | None = None) -> None:
        self._in_transaction(ProducerTransactions.abort)
        self._serve_reports()

    def _in_transaction(self, call: Callable[[ProducerTransactions], None]) -> None:
        """A call of the transaction on every record queued for it (handed over first); the delivery reports it
        made due are queued, whatever it raised."""
        transactions = self._txns()
        try:
            self._hand_over()
            call(transactions)
        finally:
            self._reports.extend(transactions.take_reports())

    def _hand_over(self) -> None:
        """Give the open transaction the records queued for it, with the delivery reports due once they are staged
        (a record's report comes with no offset: offsets are assigned when the transaction merges). The fast path
        closes until a record is admitted again."""
        assert self._transactions is not None
        self._queue.accepting = False
        taken = self._queue.take()
        if not taken:
            return
        try:
            records = {tp: batch.fields for tp, batch in taken.items()}
            reports: list[Report] = [(callback, None, Message(topic, partition, None, *batch.fields[i]))
                       for (topic, partition), batch in taken.items() for i, callback in batch.callbacks.items()]
            self._transactions.add(records, reports)
        except BaseException as exc:  # an interrupt, say: these records are lost to the transaction
            self._transactions.fail_with(exc, "handing records over")
            raise

    def _stage_queued(self) -> None:
        """Stage the open transaction's queued records (a failure makes it abortable, and fails their reports)."""
        self._in_transaction(ProducerTransactions.flush)

    def _appender(self) -> Writer:
        """The writer of this Producer's appends outside transactions, opened on first use."""
        if self._writer is None:
            self._writer = self._store.open_writer(self._config.writer_id, self._config.delivery_timeout_ms)
        return self._writer

    def _txns(self) -> ProducerTransactions:
        if self._transactions is None:
            fail(ErrorCode._NOT_CONFIGURED, "the transactional API needs transactional.id in the producer config")
        return self._transactions

    # -- routing ------------------------------------------------------------------------------------------------

    def _stream(self, topic: str, refresh: bool = False) -> StreamDescription:
        stream = None if refresh else self._streams.get(topic)
        if stream is None:
            stream = self._streams[topic] = self._store.describe_stream(topic)
            self._current[topic] = stream.current.partitions
            self._partitions[topic] = frozenset(stream.partitions)
        return stream

    def _forget_routes(self, topics: Iterable[str]) -> None:
        """Describe these topics again before routing to them (a scale sealed a partition of one)."""
        for topic in topics:
            self._streams.pop(topic, None)
            self._current.pop(topic, None)

    def _route(self, topic: str, key: bytes | None) -> int:
        target = self._queue.route(topic, key)
        if target is None:
            self._stream(topic)
            target = self._queue.route(topic, key)
        assert target is not None  # the topic's open epoch is known now
        return target

    def _report_unknown_topic(self, topic: str, partition: int, fields: RecordFields,
                              report_to: DeliveryCallback | None, exc: KafkaException) -> bool:
        """A topic that does not exist fails the record's delivery, as confluent-kafka reports it (False: raise
        ``exc`` instead: a missing partition of a known topic, or a transactional producer, whose commit would
        not know of the failure)."""
        if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART or topic in self._streams or self._transactions is not None:
            return False
        if report_to is not None:
            error = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"{topic}: topic does not exist (create it with "
                               "AdminClient.create_topics); the record was not written")
            self._queue.in_flight += 1
            self._reports.append((report_to, error, Message(topic, -1 if partition is None else partition, None,
                                                            *fields, error)))
        return True

    def _check_partition(self, topic: str, partition: int) -> int:
        if partition not in self._partitions.get(topic, ()):
            # Described just now, or again if known: raises UNKNOWN_TOPIC_OR_PART if it is not there either.
            self._stream(topic, refresh=topic in self._partitions).epoch_of(partition)
        return partition

    def _advance_sticky(self, topic: str, partition: int) -> None:
        if self._queue.sticky.get(topic) == partition:
            current = self._stream(topic).current.partitions
            self._queue.sticky[topic] = current[(current.index(partition) + 1) % len(current)]

    # -- batching and sending --------------------------------------------------------------------------------

    @one_at_a_time
    def _send_queued(self, queued: int) -> None:
        """Send what the accumulator says is ready: every batch when one is FULL, the due ones when one is DUE; a
        transaction's records are staged when they are FULL."""
        if self._transactions is not None:
            if queued == FULL:
                self._stage_queued()
        elif queued == FULL:
            self._send_all()  # the other partitions' batches too: on the embedded store, in the same write
        elif queued == DUE:
            self._send_due()

    def _send_due(self) -> None:
        now = time.monotonic()
        if now < self._queue.next_due:
            return
        with self._appender().grouped():
            for tp, batch in list(self._batches.items()):
                if batch.deadline <= now:
                    self._send_batch(tp)
        self._queue.next_due = min((b.deadline for b in self._batches.values()), default=float("inf"))

    def _send_all(self) -> None:
        """Send every batch, together: the embedded store writes them in one durable write."""
        if self._batches:
            with self._appender().grouped():
                while self._batches:
                    self._send_batch(next(iter(self._batches)))
        self._queue.next_due = float("inf")

    def _send_batch(self, tp: PartitionKey) -> None:
        batch = self._batches.pop(tp, None)
        if batch is not None:
            self._send(tp, batch, Condition())
            self._advance_sticky(tp[0], tp[1])

    def _send(self, tp: PartitionKey, batch: Batch, condition: Condition) -> None:
        """Append one batch (unconditional ones in the background where the store can), retrying retriable
        errors raised on sending; its delivery reports are queued when it completes."""
        topic, partition = tp
        try:
            if condition.unconditional:
                # The queued field tuples as they are (a store reads a record by position): a named tuple made per
                # record cost 0.18 us a record, and ~0.7 more in collections over a large batch. The callback only
                # notes the outcome: it is handled after the store call returns, so nothing it raises is mistaken
                # for a failed append (and retried).
                self._with_retry(tp, lambda: self._appender().append_async(
                    topic, partition, batch.fields, lambda result, error: self._outcomes.append(
                        (tp, batch, condition, result, error))))
            else:
                records = records_of(batch.fields)
                result = self._with_retry(tp, lambda: self._appender().append(topic, partition, records,
                                                                          **dataclasses.asdict(condition)))
                self._outcomes.append((tp, batch, condition, result, None))
        except KafkaException as exc:
            self._outcomes.append((tp, batch, condition, None, exc.error))
        self._handle_outcomes()

    def _handle_outcomes(self) -> None:
        while self._outcomes:
            self._completed(*self._outcomes.popleft())

    def _completed(self, tp: PartitionKey, batch: Batch, condition: Condition, result: AppendResult | None,
                   error: KafkaError | None) -> None:
        topic, partition = tp
        if error is None and result is not None:
            failpoint("producer.before_delivery")
            self._report(batch, topic, partition, result, None)
        elif error is not None and error.code() == ErrorCode.PARTITION_SEALED and not error.outcome_unknown():
            self._reroute_sealed(topic, batch, condition, error)
        elif error is not None:
            if error.fatal() and self._fatal is None:
                self._fatal = error
                self._queue.accepting = False  # every produce() takes the full path now, which raises it
                self._events.error(error)  # as librdkafka's error_cb hears of a fatal error
            self._report(batch, topic, partition, None, error)

    def _with_retry(self, tp: PartitionKey, send: Callable[[], T]) -> T:
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        while True:
            try:
                return send()
            except KafkaException as exc:
                if not exc.error.retriable() or time.monotonic() >= deadline:
                    raise
                self._events.log.info("retrying append to %s[%d] after %s", tp[0], tp[1], exc.error)
                self._events.error(exc.error, logged=True)
                time.sleep(_RETRY_BACKOFF_S)

    def _reroute_sealed(self, topic: str, batch: Batch, condition: Condition, error: KafkaError) -> None:
        """The stream scaled under us: records we routed go to the new epoch; pinned ones fail. If the stream cannot
        be looked up again (deleted, its catalog unreadable), they all fail with ``error``: none of them is written,
        and none may stay unreported (flush() would never return 0)."""
        try:
            self._stream(topic, refresh=True)
        except KafkaException as exc:
            self._events.log.warning("%s: records sealed out of their partition cannot be routed again: %s", topic, exc)
            self._report(batch, topic, None, None, error)
            return
        for i, fields in enumerate(batch.fields):
            callback, routed = batch.callbacks.get(i), i not in batch.pinned
            if routed and condition.unconditional:
                target = self._route(topic, fields[0])
                self._send_queued(self._queue.enqueue((topic, target), fields, callback, routed,
                                                      record_size(*fields[:3])))
            else:
                self._report(batch_of_one(fields, callback, routed), topic, None, None, error)

    def _report(
        self, batch: Batch, topic: str, partition: int | None, result: AppendResult | None,
        error: KafkaError | None,
    ) -> None:
        if result is not None and partition is not None:
            self._events.debug("%s[%d]: %d records appended at offset %d", topic, partition, len(batch),
                               result.base_offset)
            if self._events.collecting:
                self._count_delivered((topic, partition), batch)
        self._queue.in_flight -= len(batch) - len(batch.callbacks)  # records produced without a callback: counted out
        for i, callback in batch.callbacks.items():
            offset = None if result is None else result.offset_of(i)
            self._reports.append((callback, error, Message(topic, partition, offset, *batch.fields[i], error)))

    def _count_delivered(self, tp: PartitionKey, batch: Batch) -> None:
        counts = self._delivered.setdefault(tp, [0, 0])
        counts[0] += len(batch)
        counts[1] += sum(len(key or b"") + len(value or b"") for key, value, _, _ in batch.fields)

    def _statistics(self) -> dict[str, Any]:
        """librdkafka's producer statistics, for the figures the producer keeps (stats_cb)."""
        topics: dict[str, dict[str, Any]] = {}
        for tp in sorted(set(self._delivered) | set(self._batches)):
            delivered = self._delivered.get(tp, [0, 0])
            batch = self._batches.get(tp)
            topic = topics.setdefault(tp[0], {"topic": tp[0], "partitions": {}})
            topic["partitions"][str(tp[1])] = {
                "partition": tp[1], "msgq_cnt": len(batch) if batch else 0, "msgq_bytes": batch.size if batch
                else 0, "txmsgs": delivered[0], "txbytes": delivered[1], "rxmsgs": 0, "rxbytes": 0}
        return {"replyq": len(self._reports), "msg_cnt": self._queue.in_flight,
                "msg_size": sum(b.size for b in self._batches.values()), "msg_max":
                self._config.queue_buffering_max_messages,
                "txmsgs": sum(c[0] for c in self._delivered.values()),
                "txmsg_bytes": sum(c[1] for c in self._delivered.values()), "rxmsgs": 0, "rxmsg_bytes": 0,
                "topics": topics}

    def _serve_reports(self) -> int:
        served = 0
        while self._reports:
            callback, error, message = self._reports.popleft()
            self._queue.in_flight -= 1
            served += 1
            callback(error, message)
        return served
