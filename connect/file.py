"""The file connectors, under Kafka's class names and keys: ``FileStreamSource`` turns a file's lines into records
(``file``, ``topic``, ``batch.size``), ``FileStreamSink`` writes records' values as lines (``file``, ``topics``;
standard output without a file, as Kafka's; the source needs a file: standard input cannot be resumed).

A source record's offset is the byte position after its line, so a task resumes exactly after the last committed
line (exactly-once with the worker's transactions); a line is read only once its newline was written. The sink
appends to its file and flushes and fsyncs it before the consumed offsets commit: a crash between the two
writes a batch again (at-least-once; the copy into a stream, ``StreamSink``, is exactly-once).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, ConfigValue, Importance, Type, at_least, non_empty
from onceflow.connect.connector import ExactlyOnceSupport, SameConfig, SinkConnector, SourceConnector
from onceflow.connect.records import STRING_SCHEMA, SinkRecord, SourceRecord
from onceflow.connect.task import SinkTask, SourceTask
from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.topic import TopicPartition

FILENAME_FIELD, POSITION_FIELD = "filename", "position"
_IDLE_WAIT_S = 0.05


def _source_def() -> ConfigDef:
    return (ConfigDef()
            .define("file", Type.STRING, None, None, Importance.HIGH, "Source filename (onceflow needs one: standard "
                    "input cannot be resumed)")
            .define("topic", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                    documentation="The topic to publish data to")
            .define("batch.size", Type.INT, "2000", at_least(1), Importance.LOW, "The maximum number of records the "
                    "source task can read from the file each time it is polled"))


class FileStreamSourceConnector(SameConfig, SourceConnector):
    """One task reading ``file`` line by line into ``topic``."""

    one_task = True

    def config(self) -> ConfigDef:
        return _source_def()

    def validate(self, props: Mapping[str, str]) -> dict[str, ConfigValue]:
        values = super().validate(props)
        if not values["file"].errors and not values["file"].value:
            values["file"].errors.append("onceflow's FileStreamSource needs a file: standard input cannot be resumed "
                                         "after a restart")
        return values

    def task_class(self) -> type[FileStreamSourceTask]:
        return FileStreamSourceTask

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport:
        return ExactlyOnceSupport.SUPPORTED if props.get("file") else ExactlyOnceSupport.UNSUPPORTED

    def alter_offsets(self, props: Mapping[str, str], offsets: Mapping[str, Any]) -> bool:
        """Kafka's checks: each partition names the file, each offset is a position >= 0 (or null to reset)."""
        for partition, offset in offsets.items():
            if offset is None:
                continue
            position = offset.get(POSITION_FIELD) if isinstance(offset, dict) else None
            if not isinstance(position, int) or isinstance(position, bool) or position < 0:
                fail(ErrorCode.INVALID_REQUEST, f"The value for the '{POSITION_FIELD}' key in the offset of "
                     f"partition {partition} is expected to be a non-negative integer, got {position!r}")
        return True


class FileStreamSourceTask(SourceTask):
    """Reads complete lines from the committed position on."""

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._file: IO[bytes] | None = None

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        values = _source_def().parse(props)
        self._filename, self._topic, self._batch = values["file"], values["topic"], values["batch.size"]
        self._partition = {FILENAME_FIELD: self._filename}
        committed = self.context.offset_storage_reader().offset(self._partition)
        self._position = int(committed.get(POSITION_FIELD, 0)) if committed else 0

    def poll(self) -> list[SourceRecord] | None:
        handle = self._open()
        records: list[SourceRecord] = []
        if handle is not None:
            handle.seek(self._position)
            while len(records) < self._batch:
                line = handle.readline()
                if not line.endswith(b"\n"):
                    break  # the end, or a line still being written: read it whole next time
                self._position += len(line)
                records.append(SourceRecord(
                    source_partition=self._partition, source_offset={POSITION_FIELD: self._position},
                    topic=self._topic, value_schema=STRING_SCHEMA,
                    value=line.rstrip(b"\r\n").decode("utf-8", errors="replace")))
        if not records:
            self._stopped.wait(_IDLE_WAIT_S)
        return records

    def _open(self) -> IO[bytes] | None:
        if self._file is None:
            try:
                self._file = open(self._filename, "rb")  # noqa: SIM115 - held open across polls, closed in stop
            except FileNotFoundError:
                return None  # as Kafka's task: wait for the file to appear
        return self._file

    def stop(self) -> None:
        self._stopped.set()
        if self._file is not None:
            self._file.close()
            self._file = None


def _sink_def() -> ConfigDef:
    return ConfigDef().define("file", Type.STRING, None, None, Importance.HIGH, "Destination filename. If not "
                              "specified, the standard output will be used")


class FileStreamSinkConnector(SameConfig, SinkConnector):
    """One task appending each record's value as a line of ``file``."""

    one_task = True

    def config(self) -> ConfigDef:
        return _sink_def()

    def task_class(self) -> type[FileStreamSinkTask]:
        return FileStreamSinkTask


class FileStreamSinkTask(SinkTask):
    """Appends to its file (or writes to the worker's standard output, without a file)."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._owned = False

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        filename = _sink_def().parse(props)["file"]
        self._owned = bool(filename)
        self._file = open(filename, "ab") if filename else sys.stdout.buffer  # noqa: SIM115 - closed in stop

    def put(self, records: Sequence[SinkRecord]) -> None:
        handle = self._handle()
        for record in records:
            value = record.value
            data = value if isinstance(value, bytes) else str(value).encode() if value is not None else b"null"
            handle.write(data + b"\n")

    def flush(self, current_offsets: Mapping[TopicPartition, int]) -> None:
        handle = self._handle()
        handle.flush()
        if self._owned:
            os.fsync(handle.fileno())

    def _handle(self) -> IO[bytes]:
        if self._file is None:
            fail(ErrorCode._STATE, "FileStreamSinkTask: not started")
        return self._file

    def stop(self) -> None:
        if self._file is not None and self._owned:
            self._file.close()
        self._file = None
