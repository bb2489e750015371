"""Runs a source task: poll, transform, convert, write, and commit the source offsets with the records.

Exactly-once (``exactly.once.source.support=enabled``, KIP-618): the task's producer has the transactional.id
``<prefix>-<connector>-<task>``, so a new instance of the task fences every older one (a zombie cannot commit).
A transaction holds the records of one or more polls and the source offsets they reached, written to the
offsets stream in the same transaction: after a crash the task resumes from the offsets of the last committed
transaction, whose records are exactly the ones visible. Where a transaction ends is ``transaction.boundary``:
``poll`` (each batch), ``interval`` (``transaction.boundary.interval.ms``) or ``connector`` (the task's
:class:`TransactionContext`).

Without exactly-once, records are written as they come and the offsets they reached are stored every
``offset.flush.interval.ms`` once the records are acknowledged (at-least-once: a crash repeats the records since
the last offsets).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

from onceflow.connect.chain import TransformationChain
from onceflow.connect.error_handling import SKIPPED, ErrorHandler, Failure
from onceflow.connect.offsets import Deliveries, Offsets, canonical, entry_key, entry_value
from onceflow.connect.records import SourceRecord
from onceflow.connect.task import (
    OffsetStorageReader,
    RecordMetadata,
    SourceTask,
    SourceTaskContext,
    TransactionContext,
)
from onceflow.connect.task_runner import TaskRunner
from onceflow.connector.errors import KafkaException
from onceflow.connector.producer import Producer

_TRANSACTION_TIMEOUT_MARGIN_MS = 60_000


class _OffsetReader(OffsetStorageReader):
    def __init__(self, runner: SourceTaskRunner) -> None:
        self._runner = runner

    def offset(self, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._runner.worker.offsets.offsets(self._runner.id.connector).get(canonical(partition))


class _Transactions(TransactionContext):
    """Boundaries a task asks for: after a record, or (record None) after the current batch."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, SourceRecord | None]] = []

    def commit_transaction(self, record: SourceRecord | None = None) -> None:
        self.requests.append(("commit", record))

    def abort_transaction(self, record: SourceRecord | None = None) -> None:
        self.requests.append(("abort", record))

    def take(self, record: SourceRecord | None) -> str | None:
        """The boundary asked for after ``record`` (None: after the batch), if any."""
        for i, (kind, target) in enumerate(self.requests):
            if target is record:
                del self.requests[i]
                return kind
        return None


class _Context(SourceTaskContext):
    def __init__(self, runner: SourceTaskRunner) -> None:
        self._runner = runner
        self._reader = _OffsetReader(runner)

    def configs(self) -> dict[str, str]:
        return dict(self._runner.task_config)

    def offset_storage_reader(self) -> OffsetStorageReader:
        return self._reader

    def transaction_context(self) -> TransactionContext | None:
        return self._runner.transactions


class SourceTaskRunner(TaskRunner):
    """A source task in its thread; see the module docstring."""

    task: SourceTask

    def execute(self) -> None:
        worker, config = self.worker, self.config
        self.transactional_id = worker.transactional_id(self.id, config)
        self.exactly_once = self.transactional_id is not None
        self.boundary = config.get("transaction.boundary") if self.exactly_once else "interval"
        interval = config.get("transaction.boundary.interval.ms") if self.exactly_once else None
        self.interval_s = (interval if interval is not None else worker.config["offset.flush.interval.ms"]) / 1000
        self.transactions = _Transactions() if self.exactly_once and self.boundary == "connector" else None
        self.key_converter = worker.converter(config, "key")
        self.value_converter = worker.converter(config, "value")
        self.errors = ErrorHandler(config, self.id, self._stopping)
        self.tolerate_all = config.get("errors.tolerance") == "all"
        self.deliveries = Deliveries()
        self.in_transaction = False
        self.pending: Offsets = {}  # source offsets reached since the last commit
        self.dispatched: list[tuple[SourceRecord, RecordMetadata | None]] = []
        self.last_commit = time.monotonic()
        with contextlib.ExitStack() as cleanup:
            self.chain = TransformationChain(worker.plugins, config)
            cleanup.callback(self.chain.close)
            self.producer = Producer(self._producer_conf())
            cleanup.callback(self.producer.close)
            if self.exactly_once:
                self.producer.init_transactions()  # fences older instances: from here on, offsets are final
            self.task.initialize(_Context(self))
            self.task.start(self.task_config)
            cleanup.callback(self.task.stop)
            self.running()
            try:
                self._loop()
            except BaseException:
                self._abort_quietly()
                raise

    def _producer_conf(self) -> dict[str, Any]:
        conf = self.worker.client_conf("producer")
        if self.transactional_id is not None:
            conf["transactional.id"] = self.transactional_id
            conf["transaction.timeout.ms"] = int(self.interval_s * 1000) + _TRANSACTION_TIMEOUT_MARGIN_MS
        return conf

    def _loop(self) -> None:
        while self.wait_while_paused():
            records = self.errors.retrying(self.task.poll) or []
            for record in records:
                self._dispatch(record)
                if self.transactions is not None:
                    self._connector_boundary(self.transactions.take(record))
            self.producer.poll(0)  # send batches that are due, serve delivery reports
            self._check_deliveries()
            if self.transactions is not None:
                self._connector_boundary(self.transactions.take(None))
            elif (self.boundary == "poll" and records) or time.monotonic() - self.last_commit >= self.interval_s:
                self.commit()
        if self.boundary != "connector":
            self.commit()  # a graceful stop commits what was dispatched
        else:  # the connector did not end it: dropped now, as closing Kafka's producer aborts it (not at timeout)
            self._abort_quietly()

    def on_pause(self) -> None:
        if self.boundary != "connector":
            self.commit()

    def _connector_boundary(self, kind: str | None) -> None:
        if kind == "commit":
            self.commit()
        elif kind == "abort":
            self.abort()

    def _dispatch(self, record: SourceRecord) -> None:
        """Transform, convert and write one record; its offset is pending from now on, even if it was dropped."""
        if record.source_partition is not None and record.source_offset is not None:
            self.pending[canonical(record.source_partition)] = dict(record.source_offset)
        out = self.chain.apply(record, self.errors)
        if out is None:
            self.dispatched.append((record, None))
            return
        key = self.errors.run("KEY_CONVERTER", type(self.key_converter).__name__,
                              lambda: self.key_converter.from_connect_data(out.topic, out.key_schema, out.key), record)
        value = self.errors.run("VALUE_CONVERTER", type(self.value_converter).__name__,
                                lambda: self.value_converter.from_connect_data(out.topic, out.value_schema,
                                                                               out.value), record)
        if key is SKIPPED or value is SKIPPED:
            self.dispatched.append((record, None))
            return
        self.ensure_topic(out.topic)
        self.used_topic(out.topic)
        self._begin()
        self.producer.produce(out.topic, value, key=key,  # type: ignore[arg-type]
                              partition=-1 if out.kafka_partition is None else out.kafka_partition,
                              headers=list(out.headers) or None, timestamp=out.timestamp or 0,
                              on_delivery=None if self.exactly_once else self.deliveries)  # a commit reports its own
        self.dispatched.append((record, RecordMetadata(out.topic, out.kafka_partition or 0, None)))

    def _begin(self) -> None:
        if self.exactly_once and not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True

    def commit(self) -> None:
        """Commit the dispatched records and the offsets they reached (in one transaction with exactly-once),
        then tell the task."""
        self.last_commit = time.monotonic()
        if not self.pending and not self.dispatched:
            return
        if self.exactly_once:
            self._begin()
            for partition, offset in self.pending.items():
                self.producer.produce(self.worker.offsets.stream or "", entry_value(offset),
                                      key=entry_key(self.id.connector, json.loads(partition)))
            self.producer.commit_transaction()
            self.in_transaction = False
            self.worker.offsets.maintain()  # an entry per transaction: compacted now and then
        else:
            self.producer.flush()
            self._check_deliveries()
            self.worker.offsets.write(self.id.connector, self.pending)
        dispatched, self.dispatched, self.pending = self.dispatched, [], {}
        for record, metadata in dispatched:
            self.task.commit_record(record, metadata)
        self.task.commit()

    def _check_deliveries(self) -> None:
        """Records the store refused (a deleted topic, ...): under ``errors.tolerance=all`` logged and skipped, as
        Kafka Connect does (KIP-779), else the task fails before the offsets they reached are stored, so a restart
        sends them again (at-least-once)."""
        if self.tolerate_all:
            failed, self.deliveries.failed = self.deliveries.failed, []
            for error, message in failed:
                self.errors.report(Failure("KAFKA_PRODUCE", type(self.producer).__name__, KafkaException(error),
                                           message))
        self.deliveries.check(f"source task {self.id} (the source offsets since its last commit are not stored)")

    def abort(self) -> None:
        """Drop the open transaction: its records are never visible and its offsets never stored."""
        if self.in_transaction:
            self.producer.abort_transaction()
            self.in_transaction = False
        self.dispatched, self.pending = [], {}

    def _abort_quietly(self) -> None:
        with contextlib.suppress(KafkaException):  # the task failed already; the timeout aborts the transaction
            self.abort()
