"""Tasks move the data: a ``SourceTask`` polls records from an outside system, a ``SinkTask`` is handed records
consumed from streams. Mirrors Kafka Connect's task API, with snake_case names.

Exactly-once is the worker's job, not the task's: a source task's records and their source offsets are committed
in one onceflow transaction, and a sink task's consumed offsets commit with what it wrote to streams through
:meth:`SinkTaskContext.send`, or (for an outside system) after :meth:`SinkTask.flush` returned.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from onceflow.connect.records import ConnectRecord, SinkRecord, SourceRecord
from onceflow.connector.topic import TopicPartition


class Task(abc.ABC):
    """What every task has."""

    @abc.abstractmethod
    def version(self) -> str: ...

    @abc.abstractmethod
    def start(self, props: Mapping[str, str]) -> None:
        """Start with the task config its connector made."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release what ``start`` took; called from the task's thread after its last ``poll`` or ``put``."""


class OffsetStorageReader(abc.ABC):
    """The committed source offsets of this task's connector."""

    @abc.abstractmethod
    def offset(self, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last committed offset of a source partition, or None."""

    def offsets(self, partitions: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], dict[str, Any] | None]]:
        return [(partition, self.offset(partition)) for partition in partitions]


class TransactionContext(abc.ABC):
    """Connector-defined transaction boundaries (``transaction.boundary=connector``)."""

    @abc.abstractmethod
    def commit_transaction(self, record: SourceRecord | None = None) -> None:
        """Commit after ``record`` is dispatched (or after the current batch without one)."""

    @abc.abstractmethod
    def abort_transaction(self, record: SourceRecord | None = None) -> None:
        """Abort after ``record`` is dispatched (or the current batch): its records and offsets are dropped."""


class SourceTaskContext(abc.ABC):
    @abc.abstractmethod
    def configs(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def offset_storage_reader(self) -> OffsetStorageReader: ...

    @abc.abstractmethod
    def transaction_context(self) -> TransactionContext | None:
        """Set only with ``transaction.boundary=connector`` on an exactly-once worker."""


class SourceTask(Task):
    """Reads from an outside system; subclasses implement ``poll``."""

    context: SourceTaskContext

    def initialize(self, context: SourceTaskContext) -> None:
        self.context = context

    @abc.abstractmethod
    def poll(self) -> list[SourceRecord] | None:
        """The next records (None or [] if there are none now; wait a little rather than spin)."""

    def commit(self) -> None:
        """The offsets of every record returned so far are committed (acknowledge them upstream here)."""

    def commit_record(self, record: SourceRecord, metadata: RecordMetadata | None) -> None:
        """``record`` was committed (metadata: where it landed), or dropped by a transform or error tolerance
        (metadata None)."""


class RecordMetadata:
    """Where a committed source record landed."""

    __slots__ = ("offset", "partition", "topic")

    def __init__(self, topic: str, partition: int, offset: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset


class ErrantRecordReporter(abc.ABC):
    """Report a record a sink task could not handle: the worker applies ``errors.tolerance`` and the dead letter
    queue to it, as to the worker's own failures."""

    @abc.abstractmethod
    def report(self, record: SinkRecord, error: Exception) -> None: ...


class SinkTaskContext(abc.ABC):
    @abc.abstractmethod
    def configs(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def offset(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Rewind (or skip) consumption: the next records of these partitions come from these offsets."""

    @abc.abstractmethod
    def assignment(self) -> list[TopicPartition]: ...

    @abc.abstractmethod
    def pause(self, *partitions: TopicPartition) -> None: ...

    @abc.abstractmethod
    def resume(self, *partitions: TopicPartition) -> None: ...

    @abc.abstractmethod
    def request_commit(self) -> None:
        """Commit consumed offsets after the current ``put`` rather than when the interval says."""

    @abc.abstractmethod
    def errant_record_reporter(self) -> ErrantRecordReporter | None: ...

    @abc.abstractmethod
    def send(self, record: ConnectRecord) -> None:
        """Write ``record`` to a stream of the worker's store (onceflow's own): it becomes visible exactly when
        the consumed offsets of this batch commit, in one transaction. Key and value go through the
        connector's converters."""


class SinkTask(Task):
    """Writes consumed records to an outside system; subclasses implement ``put``."""

    context: SinkTaskContext

    def initialize(self, context: SinkTaskContext) -> None:
        self.context = context

    @abc.abstractmethod
    def put(self, records: Sequence[SinkRecord]) -> None:
        """Hand over consumed records (write them, or buffer them until ``flush``)."""

    def flush(self, current_offsets: Mapping[TopicPartition, int]) -> None:
        """Make everything ``put`` so far durable: its offsets are committed next."""

    def pre_commit(self, current_offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The next offsets safe to commit; by default flush and return ``current_offsets``."""
        self.flush(current_offsets)
        return dict(current_offsets)

    def open(self, partitions: Sequence[TopicPartition]) -> None:
        """These partitions were assigned to this task (a rebalance, or the start)."""

    def close(self, partitions: Sequence[TopicPartition]) -> None:
        """These partitions leave this task (after their offsets were committed)."""
