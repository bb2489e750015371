"""A Spark row as a record and back, by the column mapping of the options (key, value, headers, partition).

Writing, a row needs a value column unless the value format takes whole rows (json, avro and the registry formats):
then, without one, every column that is not the key, headers or partition column makes up the value (a struct).
The key and the value are written and read in their formats (``key.format``, ``value.format``).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Row

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.message import Message
from onceflow.connector.store import Record
from onceflow.spark_sinks.formats import Format, RawKey, plain
from onceflow.spark_sinks.options import OnceflowOptions

READ_COLUMNS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")
_item = tuple.__getitem__


@dataclasses.dataclass(frozen=True)
class RowMapping:
    """Which columns of the written DataFrame go where; checked once against its schema."""

    options: OnceflowOptions
    key: str | None
    value: str | None
    headers: str | None
    partition: str | None
    rest: tuple[str, ...]  # the value's fields when there is no value column
    binary: bool = False  # a value column, perhaps a key column, both in format bytes, no headers or partition
    # column: record() takes rows whose key and value are bytes or None as they are (set by of())
    names: list[str] = dataclasses.field(default_factory=list)  # the columns, in order: a Spark Row's __fields__
    key_at: int | None = None  # where the key and value columns are in a row of those columns
    value_at: int = -1  # -1: no value column

    @classmethod
    def of(cls, options: OnceflowOptions, columns: Sequence[str]) -> RowMapping:
        def present(name: str) -> str | None:
            return name if name in columns else None

        key, value = present(options.key_column), present(options.value_column)
        headers, partition = present(options.headers_column), present(options.partition_column)
        rest = tuple(c for c in columns if c not in (key, headers, partition))
        if value is None and not options.value_format.whole_rows:
            fail(ErrorCode.INVALID_CONFIG, f"onceflow: no value column {options.value_column!r} among {list(columns)}"
                 f" (set value.column, or a value.format that writes whole rows: json, avro, *-registry)")
        binary = (value is not None and headers is None and partition is None and isinstance(options.key_format, RawKey)
                  and options.value_format.name == "bytes")
        names = list(columns)
        return cls(options, key, value, headers, partition, rest, binary, names,
                   names.index(key) if key else None, names.index(value) if value else -1)

    def record(self, row: Any) -> tuple[Record, int]:
        """The record a row becomes, and its partition (-1: by key)."""
        if self.binary:  # binary columns as they are: 1.4 us a row, where the formats' way takes 2.0
            if row.__class__ is Row and getattr(row, "__fields__", None) == self.names:
                # By position, as a tuple: a Row's own __getitem__ looks a name up in Python, ~0.4 us a column
                key = _item(row, self.key_at) if self.key_at is not None else None
                value = _item(row, self.value_at)
            else:
                key, value = row[self.key] if self.key else None, row[self.value]
            if (key is None or key.__class__ is bytes) and (value is None or value.__class__ is bytes):
                return Record(key, value), -1
        value = row[self.value] if self.value else {name: row[name] for name in self.rest}
        partition = row[self.partition] if self.partition else None
        if partition is not None and (not isinstance(partition, int) or partition < 0):
            fail(ErrorCode.INVALID_RECORD, f"column {self.partition!r} must be a partition number >= 0, got "
                 f"{partition!r}")
        topic, spark_row = self.options.topic, isinstance(row, Row)
        key = _to_bytes(self.options.key_format, row[self.key], topic, spark_row) if self.key else None
        return Record(key, _to_bytes(self.options.value_format, value, topic, spark_row),
                      _headers(row[self.headers]) if self.headers else None), (-1 if partition is None else partition)


def _to_bytes(fmt: Format, value: Any, topic: str, spark_row: bool) -> bytes | None:
    """A Spark row's structs become dicts here for the formats that take plain values (rows from Arrow batches
    are plain already, and walking them again would cost as much as serializing them)."""
    return fmt.to_bytes(plain(value) if spark_row and not fmt.takes_rows else value, topic)


def _headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    """From a map<string, string|binary> or an array<struct<key, value>> column."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else [(h["key"], h["value"]) for h in headers]
    return [(str(k), v.encode() if isinstance(v, str) else (bytes(v) if v is not None else None))
            for k, v in items] or None


def read_row(message: Message, options: OnceflowOptions) -> tuple[Any, ...]:
    """The columns of :data:`READ_COLUMNS` for a record read from the stream."""
    timestamp = message.timestamp()[1]
    return (options.key_format.to_column(message.key(), message),
            options.value_format.to_column(message.value(), message), message.headers() or [], options.topic,
            message.partition(), message.offset(), None if timestamp < 0 else _datetime(timestamp))


def _datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
