"""How a row's value (or key) becomes a record's bytes and back: ``value.format`` bytes, string, json or avro, and
the :class:`Format` every format is used through (the schema registry's are in :mod:`registry_formats`).

Avro values are schemaless Avro binary (fastavro) of the schema given inline (``avro.schema``) or as a file
(``avro.schema.path``); a struct column is written as an Avro record. A value that does not fit its format is
INVALID_RECORD, naming what was wrong, and nothing of the task is published. Read back, bytes are binary,
string text, and json and avro JSON text (parse it with ``from_json``).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import json
from typing import Any, Protocol

import fastavro
from pyspark.sql import Row
from pyspark.sql import types as T

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.message import Message

FORMATS = ("avro", "bytes", "json", "string")
REGISTRY_FORMATS = ("avro-registry", "json-registry", "protobuf-registry")  # see registry_formats


class Format(Protocol):
    """A key's or value's format, as the sink and the source use it."""

    @property
    def name(self) -> str: ...

    @property
    def whole_rows(self) -> bool:
        """Whether, without a value column, the row's other columns make up the value (a struct)."""

    @property
    def takes_rows(self) -> bool:
        """Whether :meth:`to_bytes` takes Spark's rows as they are (else structs come as dicts)."""

    def column_type(self) -> T.DataType:
        """The Spark type of the column the source reads."""

    def to_bytes(self, value: Any, topic: str) -> bytes | None:
        """The bytes a column's value is written as."""

    def to_column(self, data: bytes | None, message: Message) -> Any:
        """The column's value for a record's bytes (``message`` says where they were read)."""


@dataclasses.dataclass(frozen=True)
class RawKey:
    """``key.format`` bytes (the default): binary keys as they are, any other value as the text of it."""

    name: str = "bytes"
    whole_rows: bool = False
    takes_rows: bool = True

    def column_type(self) -> T.DataType:
        return T.BinaryType()

    def to_bytes(self, value: Any, topic: str) -> bytes | None:
        if value is None or isinstance(value, bytes):
            return value
        return bytes(value) if isinstance(value, bytearray) else str(value).encode()

    def to_column(self, data: bytes | None, message: Message) -> Any:
        return data


@dataclasses.dataclass(frozen=True)
class ValueFormat:
    """One value format; picklable, so Spark ships it to the tasks."""

    name: str
    avro_schema: str | None = None

    takes_rows = True

    @property
    def whole_rows(self) -> bool:
        return self.name in ("json", "avro")

    def column_type(self) -> T.DataType:
        return T.BinaryType() if self.name == "bytes" else T.StringType()

    def to_bytes(self, value: Any, topic: str) -> bytes | None:
        return self.encode(value)

    def to_column(self, data: bytes | None, message: Message) -> Any:
        decoded = self.decode(data)
        if self.name == "avro" and decoded is not None:
            return json.dumps(decoded, default=str)
        return data.decode() if self.name == "json" and data is not None else decoded

    def encode(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if self.name == "bytes":
            if isinstance(value, bytes | bytearray):
                return bytes(value)
            fail(ErrorCode.INVALID_RECORD, f"value.format 'bytes' needs a binary value column, got "
                 f"{type(value).__name__} (use value.format 'string' or 'json', or cast the column)")
        if self.name == "string":
            return str(value).encode()
        converted = plain(value)
        if self.name == "json":
            try:
                return json.dumps(converted, separators=(",", ":"), default=_json_default).encode()
            except (TypeError, ValueError) as exc:
                fail(ErrorCode.INVALID_RECORD, f"value is not JSON serializable: {exc}")
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self._parsed(), converted)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            fail(ErrorCode.INVALID_RECORD, f"value does not fit the Avro schema: {exc}")
        return buffer.getvalue()

    def decode(self, data: bytes | None) -> Any:
        if data is None or self.name == "bytes":
            return data
        try:
            if self.name == "string":
                return data.decode()
            if self.name == "json":
                return json.loads(data)
            return fastavro.schemaless_reader(io.BytesIO(data), self._parsed(), None)
        except (ValueError, EOFError, IndexError, TypeError, RecursionError, OverflowError) as exc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"a record's value is not {self.name}: {type(exc).__name__}: {exc}")

    def _parsed(self) -> Any:
        try:
            return _parse_avro(self.avro_schema or "")
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
            fail(ErrorCode.INVALID_CONFIG, f"avro.schema is not a valid Avro schema: {exc}")


_AVRO_SCHEMAS: dict[str, Any] = {}


def _parse_avro(text: str) -> Any:
    if text not in _AVRO_SCHEMAS:
        parsed = fastavro.parse_schema(json.loads(text))
        _refuse_unbounded_arrays(parsed, {})
        _AVRO_SCHEMAS[text] = parsed
    return _AVRO_SCHEMAS[text]


def _refuse_unbounded_arrays(schema: Any, named: dict[str, Any]) -> None:
    """An array of items that take no bytes (null, a record of such fields, a fixed of size 0) has a length
    the data cannot bound: a few damaged bytes would decode to billions of items. Such schemas are refused."""
    if isinstance(schema, list):
        for branch in schema:
            _refuse_unbounded_arrays(branch, named)
    elif isinstance(schema, dict):
        if "name" in schema:
            if schema["name"] in named:
                return
            named[schema["name"]] = schema
        kind = schema.get("type")
        if kind == "array":
            if _takes_no_bytes(schema["items"], named, set()):
                raise ValueError("an array's items take no bytes, so its length cannot be bounded when decoding")
            _refuse_unbounded_arrays(schema["items"], named)
        elif kind == "map":
            _refuse_unbounded_arrays(schema["values"], named)
        elif kind == "record":
            for field in schema["fields"]:
                _refuse_unbounded_arrays(field["type"], named)
        elif isinstance(kind, dict | list):
            _refuse_unbounded_arrays(kind, named)


def _takes_no_bytes(schema: Any, named: dict[str, Any], visiting: set[str]) -> bool:
    if isinstance(schema, str):
        if schema in named and schema not in visiting:
            return _takes_no_bytes(named[schema], named, {*visiting, schema})
        return schema == "null"
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            inner = {*visiting, schema.get("name", "")}
            return all(_takes_no_bytes(f["type"], named, inner) for f in schema["fields"])
        if kind == "fixed":
            return int(schema.get("size", 0)) == 0
        if isinstance(kind, str) and kind not in ("array", "map", "enum"):
            return _takes_no_bytes(kind, named, visiting)
    return False  # unions, arrays, maps and enums always take at least one byte


def value_format(name: str, avro_schema: str | None) -> ValueFormat:
    """The format named by ``value.format``; INVALID_CONFIG for an unknown one or a bad Avro schema."""
    lowered = name.lower()
    if lowered not in FORMATS:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: value.format must be one of {list(FORMATS + REGISTRY_FORMATS)}, "
             f"got {name!r}")
    chosen = ValueFormat(lowered, avro_schema if lowered == "avro" else None)
    if lowered == "avro":
        chosen._parsed()  # a bad schema fails here, on the driver, before any task runs
    return chosen


def plain(value: Any) -> Any:
    """A Spark Row (struct) as a dict, recursively; other values unchanged."""
    if isinstance(value, str | int | float | bytes):  # most values: first, as this runs for every one of a row
        return value
    if isinstance(value, Row):
        return {k: plain(v) for k, v in zip(value.__fields__, value, strict=True)}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
