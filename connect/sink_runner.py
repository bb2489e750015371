"""Runs a sink task: consume, convert, transform, ``put``, and commit the consumed offsets in one transaction with
whatever the batch wrote to streams.

Each batch is one transaction of the task's producer (transactional.id ``<prefix>-<connector>-<task>``): the
records the task sent through :meth:`SinkTaskContext.send`, the dead letter queue's records and the consumer
group's next offsets (``send_offsets_to_transaction``) become visible together or not at all, so a sink into
streams is exactly-once. A sink into an outside system is flushed (``pre_commit``, which calls ``flush``) before
the offsets commit: at-least-once, unless the task keeps its offsets in that system and returns none from
``pre_commit``. The consumer group is ``connect-<connector>``, as in Kafka Connect.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Mapping
from typing import Any

from onceflow.connect.chain import TransformationChain
from onceflow.connect.error_handling import SKIPPED, ErrorHandler, Failure
from onceflow.connect.records import ConnectRecord, SinkRecord
from onceflow.connect.task import ErrantRecordReporter, SinkTask, SinkTaskContext
from onceflow.connect.task_runner import TaskRunner
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.topic import OFFSET_BEGINNING, OFFSET_END, TopicPartition

MAX_POLL_RECORDS = 500
_POLL_TIMEOUT_S = 0.1
DLQ_HEADER_PREFIX = "__connect.errors."

log = logging.getLogger(__name__)


def sink_group(connector: str) -> str:
    """The consumer group of a sink connector's tasks."""
    return f"connect-{connector}"


class _Reporter(ErrantRecordReporter):
    def __init__(self, runner: SinkTaskRunner) -> None:
        self._runner = runner

    def report(self, record: SinkRecord, error: Exception) -> None:
        message = self._runner.consumed.get((record.topic, record.kafka_partition or 0, record.kafka_offset))
        self._runner.errors_handler.report(Failure("TASK_PUT", type(self._runner.task).__name__, error,
                                                   message or record))


class _Context(SinkTaskContext):
    def __init__(self, runner: SinkTaskRunner) -> None:
        self._runner = runner
        self._reporter = _Reporter(runner)

    def configs(self) -> dict[str, str]:
        return dict(self._runner.task_config)

    def offset(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._runner.rewinds.update({(tp.topic, tp.partition): offset for tp, offset in offsets.items()})

    def assignment(self) -> list[TopicPartition]:
        return self._runner.consumer.assignment()

    def pause(self, *partitions: TopicPartition) -> None:
        self._runner.consumer.pause(list(partitions))

    def resume(self, *partitions: TopicPartition) -> None:
        self._runner.consumer.resume(list(partitions))

    def request_commit(self) -> None:
        """Every batch commits already."""

    def errant_record_reporter(self) -> ErrantRecordReporter | None:
        return self._reporter

    def send(self, record: ConnectRecord) -> None:
        self._runner.send(record)


class SinkTaskRunner(TaskRunner):
    """A sink task in its thread; see the module docstring."""

    task: SinkTask

    def execute(self) -> None:
        worker, config = self.worker, self.config
        self.key_converter = worker.converter(config, "key")
        self.value_converter = worker.converter(config, "value")
        self.dlq_topic = config.get("errors.deadletterqueue.topic.name") or None
        self.dlq_headers = bool(config.get("errors.deadletterqueue.context.headers.enable"))
        self.errors_handler = ErrorHandler(config, self.id, self._stopping, self._dead_letter)
        self.consumed: dict[tuple[str, int, int], Message] = {}
        self.rewinds: dict[tuple[str, int], int] = {}
        self.in_transaction = False
        self.max_records = int(worker.config.client_props("consumer").get("max.poll.records", MAX_POLL_RECORDS))
        with contextlib.ExitStack() as cleanup:
            self.chain = TransformationChain(worker.plugins, config)
            cleanup.callback(self.chain.close)
            self.producer = Producer({**worker.client_conf("producer"),
                                      "transactional.id": worker.transactional_id(self.id, config)})
            cleanup.callback(self.producer.close)
            self.producer.init_transactions()
            self.consumer = Consumer(self._consumer_conf())
            cleanup.callback(self.consumer.close)
            self.task.initialize(_Context(self))
            self.task.start(self.task_config)
            cleanup.callback(self.task.stop)
            topics = config.get("topics") or [f"^{config.get('topics.regex')}"]
            self.consumer.subscribe(topics, on_assign=self._assigned, on_revoke=self._revoked,
                                    on_lost=self._revoked)
            self.running()
            try:
                while self.wait_while_paused():
                    self._batch(self.consumer.consume(self.max_records, _POLL_TIMEOUT_S))
            except BaseException:
                self._abort_quietly()
                raise

    def _consumer_conf(self) -> dict[str, Any]:
        extra = {k: v for k, v in self.worker.client_conf("consumer").items() if k != "max.poll.records"}
        return {**extra, "group.id": sink_group(self.id.connector), "enable.auto.commit": "false",
                "auto.offset.reset": extra.get("auto.offset.reset", "earliest")}

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for partition in partitions:
            self.used_topic(partition.topic)
        self.task.open(partitions)
        for partition in partitions:  # where the task asked, in open(), these partitions to start (as Connect)
            offset = self.rewinds.pop((partition.topic, partition.partition), None)
            if offset is not None:
                partition.offset = offset

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.task.close(partitions)

    def on_pause(self) -> None:
        """Keep the group membership alive without taking records: whatever a poll returns is put back."""
        self.consumer.pause(self.consumer.assignment())
        for message in self.consumer.consume(self.max_records, 0):
            self.consumer.seek(TopicPartition(message.topic() or "", message.partition() or 0, message.offset() or 0))
        self.consumer.resume(self.consumer.assignment())

    def _batch(self, messages: list[Message]) -> None:
        """One transaction: the converted records put, what the task sent, the offsets after them."""
        if not messages:
            return
        self.consumed = {(m.topic() or "", m.partition() or 0, m.offset() or 0): m for m in messages}
        current = {TopicPartition(m.topic() or "", m.partition() or 0): (m.offset() or 0) + 1 for m in messages}
        self.errors_handler.retrying(lambda: self._put(messages))
        offsets = self.task.pre_commit(current)
        if offsets:
            self.producer.send_offsets_to_transaction([TopicPartition(tp.topic, tp.partition, o)
                                                       for tp, o in offsets.items()],
                                                      self.consumer.consumer_group_metadata())
        try:
            self.producer.commit_transaction()
        except KafkaException as exc:
            if exc.code not in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                raise
            self._lost_batch(exc)
            return
        self.in_transaction = False
        self._rewind()

    def _lost_batch(self, refused: KafkaException) -> None:
        """The group moved some of the batch's partitions on while this task stalled: its transaction is aborted
        (another task reads them from the committed offsets), and the partitions it still owns start again from
        theirs, as a Kafka Connect task carries on after a rebalance."""
        log.warning("task %s: batch not committed, its partitions moved on (%s); reading again from the committed "
                    "offsets", self.id, refused.error.str())
        self._abort_quietly()
        reset = OFFSET_BEGINNING if self._consumer_conf()["auto.offset.reset"] == "earliest" else OFFSET_END
        for partition in self.consumer.committed(self.consumer.assignment()):
            self.consumer.seek(TopicPartition(partition.topic, partition.partition,
                                              partition.offset if partition.offset >= 0 else reset))

    def _put(self, messages: list[Message]) -> None:
        """One attempt at the batch, in the batch's transaction: a retriable failure aborts it, so that what the
        task (and the dead letter queue) sent before it failed is not committed next to what the retry sends."""
        self._begin()
        try:
            self.task.put([r for r in (self._convert(m) for m in messages) if r is not None])
        except KafkaException as exc:
            if exc.error.retriable():
                self.producer.abort_transaction()
                self.in_transaction = False
            raise

    def _convert(self, message: Message) -> SinkRecord | None:
        error = message.error()
        if error is not None:
            raise KafkaException(error)
        topic = message.topic() or ""
        key = self.errors_handler.run("KEY_CONVERTER", type(self.key_converter).__name__,
                                      lambda: self.key_converter.to_connect_data(topic, message.key()), message)
        value = self.errors_handler.run("VALUE_CONVERTER", type(self.value_converter).__name__,
                                        lambda: self.value_converter.to_connect_data(topic, message.value()), message)
        if key is SKIPPED or value is SKIPPED:
            return None
        kind, when = message.timestamp()
        record = SinkRecord(topic=topic, kafka_partition=message.partition(), key_schema=key[0],  # type: ignore[index]
                            key=key[1], value_schema=value[0], value=value[1],  # type: ignore[index]
                            timestamp=when if kind else None, headers=tuple(message.headers() or ()),
                            kafka_offset=message.offset() or 0)
        return self.chain.apply(record, self.errors_handler)

    def _begin(self) -> None:
        if not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True

    def send(self, record: ConnectRecord) -> None:
        """A record the task writes to a stream, in the batch's transaction."""
        if not self.in_transaction:
            fail(ErrorCode.INVALID_TXN_STATE, f"task {self.id}: send() works only inside put()")
        key = self.key_converter.from_connect_data(record.topic, record.key_schema, record.key)
        value = self.value_converter.from_connect_data(record.topic, record.value_schema, record.value)
        self.ensure_topic(record.topic)
        self.producer.produce(record.topic, value, key=key,
                              partition=-1 if record.kafka_partition is None else record.kafka_partition,
                              headers=list(record.headers) or None, timestamp=record.timestamp or 0)

    def _rewind(self) -> None:
        for (topic, partition), offset in self.rewinds.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))
        self.rewinds.clear()

    def _dead_letter(self, failure: Failure) -> None:
        """A tolerated failure's original record goes to the dead letter queue, in the batch's transaction."""
        message = failure.record
        if self.dlq_topic is None or not isinstance(message, Message):
            return
        headers = list(message.headers() or [])
        if self.dlq_headers:
            headers += self._context_headers(failure, message)
        self.ensure_topic(self.dlq_topic)
        self._begin()
        self.producer.produce(self.dlq_topic, message.value(), key=message.key(), headers=headers or None)

    def _context_headers(self, failure: Failure, message: Message) -> list[tuple[str, bytes | None]]:
        """Kafka Connect's ``__connect.errors.*`` headers: where the record was and why it failed."""
        error = failure.error
        context = {"topic": message.topic(), "partition": message.partition(), "offset": message.offset(),
                   "connector.name": self.id.connector, "task.id": self.id.task, "stage": failure.stage,
                   "class.name": failure.plugin, "exception.class.name": type(error).__qualname__,
                   "exception.message": str(error),
                   "exception.stacktrace": "".join(traceback.format_exception(error))}
        return [(DLQ_HEADER_PREFIX + name, str(value).encode()) for name, value in context.items()]

    def _abort_quietly(self) -> None:
        if self.in_transaction:
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction()
            self.in_transaction = False

