"""The ``onceflow`` Python Data Source: an exactly-once streaming and batch sink, and a streaming and batch source.

Writing (see :mod:`onceflow.txn.sink`): each task stages its rows in a transaction of its own, named by writer id
(sink, batch, partition, attempt); the driver's ``commit(messages, batchId)`` commits the batch with one COMMIT
joining exactly the tasks whose messages it got, conditional on the sink's last committed batch being
``batchId - 1``. A batch write does the same once per ``job.id``. Reading: per-partition offsets that Spark
checkpoints; a scaled stream is followed into its new epoch once the sealed partitions are read to their end.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.store import Store, read_range
from onceflow.spark_sinks.options import OnceflowOptions, parse
from onceflow.spark_sinks.registry_formats import RegistryFormat
from onceflow.spark_sinks.rows import READ_COLUMNS, RowMapping, read_row
from onceflow.spark_sinks.tasks import commit_parts, sink_of, stage_rows, store_of
from onceflow.txn.sink import StagedPart


@dataclasses.dataclass
class SinkCommitMessage(WriterCommitMessage):
    """A task's answer to the driver: what it staged (None if it had no rows) and which query it ran for."""

    part: StagedPart | None
    query_id: str


class OnceflowDataSource(DataSource):
    """``format("onceflow")``; options in :mod:`onceflow.spark_sinks.options`."""

    @classmethod
    def name(cls) -> str:
        return "onceflow"

    def schema(self) -> StructType:
        options = parse(self.options)
        return StructType([StructField("key", options.key_format.column_type()),
                           StructField("value", options.value_format.column_type()), *_FIXED_COLUMNS])

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse(self.options)
        if options.sink_id is None:
            fail(ErrorCode.INVALID_CONFIG, "onceflow: a streaming write needs option 'sink.id' (it names the sink's "
                 "progress, so a restarted query continues where it committed)")
        writer = ArrowStreamWriter if _arrow(options) else StreamWriter
        return writer(options, RowMapping.of(options, schema.fieldNames()))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = parse(self.options)
        if options.job_id is None:
            fail(ErrorCode.INVALID_CONFIG, "onceflow: a batch write needs option 'job.id' (a re-run of the same job "
                 "id publishes nothing)")
        if overwrite:
            fail(ErrorCode.INVALID_CONFIG, "onceflow: streams are append-only; use mode('append')")
        writer = ArrowBatchWriter if _arrow(options) else BatchWriter
        return writer(options, RowMapping.of(options, schema.fieldNames()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(parse(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse(self.options))


def _arrow(options: OnceflowOptions) -> bool:
    """Whether the sink takes Arrow batches: with a registry format (the schemaless ones keep Spark's rows, whose
    naive local timestamps their output depends on)."""
    return any(isinstance(f, RegistryFormat) for f in (options.key_format, options.value_format))


_FIXED_COLUMNS = (
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
    StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
)


# -- writing -------------------------------------------------------------------------------------------------


def _commit(options: OnceflowOptions, sink_id: str, batch_id: int, messages: Sequence[WriterCommitMessage | None],
            query_id: str | None = None) -> None:
    answers = [m for m in messages if isinstance(m, SinkCommitMessage)]
    commit_parts(options, sink_id, batch_id, [m.part for m in answers],
                 query_id or next((m.query_id for m in answers if m.query_id), None))


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: OnceflowOptions, mapping: RowMapping) -> None:
        assert options.sink_id is not None
        self._options, self._mapping, self._sink_id = options, mapping, options.sink_id

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if batch is None:
            fail(ErrorCode.INVALID_CONFIG, "onceflow: a streaming write ran outside a micro-batch")
        return SinkCommitMessage(*stage_rows(self._options, self._mapping, self._sink_id, int(batch), iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self._options, self._sink_id, batchId, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sink_of(self._options, self._sink_id).abort_batch(batchId)


_SLICE = 256  # rows made into Python values at a time, see _rows


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    """Arrow record batches as rows of plain values (structs and maps as dicts), as the serializers take them.
    A few hundred rows at a time: Spark's batches hold 10,000, and that many dicts alive at once made Python's
    garbage collector pass over them again and again (as much time as converting and serializing them)."""
    for batch in batches:
        for start in range(0, batch.num_rows, _SLICE):
            part = batch.slice(start, _SLICE)
            yield from _values(pa.StructArray.from_arrays(part.columns, names=part.schema.names))


def _values(array: pa.Array) -> list[Any]:
    """An Arrow array's values as Python's, maps as dicts. Without a map in its type, pyarrow's ``to_pylist`` at
    once (structs as dicts): asked for maps as dicts, it makes every value a scalar first, for any type, several
    times slower (this runs for every row the sink writes). With one, a struct's values are zipped from its
    fields' columns, so that only the columns holding a map take that path."""
    if not _has_map(array.type):
        return list(array.to_pylist())
    if not pa.types.is_struct(array.type):
        return list(array.to_pylist(maps_as_pydicts="strict"))
    rows = list(map(dict, map(functools.partial(zip, [f.name for f in array.type]),
                              zip(*map(_values, array.flatten()), strict=True))))
    if array.null_count:
        return [row if valid else None for row, valid in zip(rows, array.is_valid().to_pylist(), strict=True)]
    return rows


def _has_map(kind: pa.DataType) -> bool:
    return bool(pa.types.is_map(kind)) or any(_has_map(kind.field(i).type) for i in range(kind.num_fields))


class ArrowStreamWriter(StreamWriter, DataSourceStreamArrowWriter):
    """The registry formats' streaming writer: Spark hands it Arrow batches, which become plain rows far faster
    than Spark's own rows do (a struct column is a dict at once)."""

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return super().write(_rows(iterator))


def job_sink_id(options: OnceflowOptions) -> str:
    """A batch job's sink: one per (sink id or topic, job id), committed at most once."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{options.sink_id or options.topic}-job-{options.job_id}")[:90]


class BatchWriter(DataSourceWriter):
    def __init__(self, options: OnceflowOptions, mapping: RowMapping) -> None:
        self._options, self._mapping, self._sink_id = options, mapping, job_sink_id(options)

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return SinkCommitMessage(*stage_rows(self._options, self._mapping, self._sink_id, 0, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self._options, self._sink_id, 0, messages, query_id=f"job:{self._options.job_id}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        sink_of(self._options, self._sink_id).abort_batch(0)


class ArrowBatchWriter(BatchWriter, DataSourceArrowWriter):
    """The registry formats' batch writer (see :class:`ArrowStreamWriter`)."""

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return super().write(_rows(iterator))


# -- reading -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class OffsetRange(InputPartition):
    """One stream partition's records in [start, end)."""

    partition: int
    start: int
    end: int


def readable_ends(store: Store, topic: str, start: Mapping[str, int]) -> dict[str, int]:
    """Each partition's end, for the partitions a reader at ``start`` may read now: an epoch's partitions only
    once every earlier epoch is sealed and read to its end (per-key order across a scale)."""
    ends: dict[str, int] = {}
    for epoch in store.describe_stream(topic).epochs:
        states = {str(p): store.partition_state(topic, p) for p in epoch.partitions}
        ends.update({p: state.stable_end for p, state in states.items()})  # never past an undecided record
        finished = all(s.sealed and start.get(p, s.start_offset) >= s.end_offset for p, s in states.items())
        if not finished:
            break
    return ends


class StreamReader(DataSourceStreamReader):
    def __init__(self, options: OnceflowOptions) -> None:
        self._options = options

    def initialOffset(self) -> dict[str, int]:
        store = store_of(self._options.store_url)
        return {str(p): store.partition_state(self._options.topic, p).start_offset
                for p in store.describe_stream(self._options.topic).partitions}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_records_per_batch
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = readable_ends(store_of(self._options.store_url), self._options.topic, start)
        latest = {**start, **{p: max(end, start.get(p, 0)) for p, end in ends.items()}}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            for p in sorted(latest, key=int):
                take = min(latest[p] - start.get(p, 0), budget)
                latest[p] = start.get(p, 0) + take
                budget -= take
        return latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [OffsetRange(int(p), start.get(p, 0), e) for p, e in sorted(end.items(), key=lambda i: int(i[0]))
                if e > start.get(p, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_rows(self._options, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark checkpointed ``end``; nothing to do: offsets live in the query's checkpoint."""


class BatchReader(DataSourceReader):
    """Every committed record of the stream as it is when the job plans its read."""

    def __init__(self, options: OnceflowOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        store = store_of(self._options.store_url)
        states = {p: store.partition_state(self._options.topic, p)
                  for p in store.describe_stream(self._options.topic).partitions}
        return [OffsetRange(p, state.start_offset, state.stable_end) for p, state in states.items()
                if state.stable_end > state.start_offset]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_rows(self._options, partition)


def read_rows(options: OnceflowOptions, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
    assert isinstance(partition, OffsetRange)
    records = read_range(store_of(options.store_url), options.topic, partition.partition, partition.start,
                         partition.end)
    return (read_row(message, options) for message in records)


__all__ = ["READ_COLUMNS", "OnceflowDataSource"]
