"""Records as connectors see them: ``SourceRecord`` (with its source partition and offset) and ``SinkRecord``
(with its Kafka offset), plus the optional ``Schema`` of a key or value, as in Kafka Connect's data API.

Keys and values are Python data (str, int, float, bool, bytes, lists, dicts, None); converters turn them into
the bytes stored in a stream and back. A schema is optional: without one, converters infer what they need.
Header values are bytes (or None), as a stream stores them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from onceflow.connector.errors import ErrorCode, fail

Headers = tuple[tuple[str, bytes | None], ...]

PRIMITIVE_TYPES = ("int8", "int16", "int32", "int64", "float32", "float64", "boolean", "string", "bytes")
SCHEMA_TYPES = (*PRIMITIVE_TYPES, "array", "map", "struct")


@dataclasses.dataclass(frozen=True)
class Field:
    """A named field of a struct schema."""

    name: str
    schema: Schema


@dataclasses.dataclass(frozen=True)
class Schema:
    """Kafka Connect's schema: a type, whether null is allowed, an optional name, and for the nested types their
    parts (``fields`` of a struct, ``value_schema`` of an array, ``key_schema`` and ``value_schema`` of a map)."""

    type: str
    optional: bool = False
    name: str | None = None
    version: int | None = None
    doc: str | None = None
    default: Any = None
    fields: tuple[Field, ...] = ()
    key_schema: Schema | None = None
    value_schema: Schema | None = None
    parameters: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.type not in SCHEMA_TYPES:
            fail(ErrorCode.INVALID_CONFIG, f"schema type {self.type!r}: expected one of {list(SCHEMA_TYPES)}")

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


STRING_SCHEMA = Schema("string")
OPTIONAL_STRING_SCHEMA = Schema("string", optional=True)
BYTES_SCHEMA = Schema("bytes")
OPTIONAL_BYTES_SCHEMA = Schema("bytes", optional=True)
INT64_SCHEMA = Schema("int64")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectRecord:
    """What source and sink records share: where the record goes (or came from) and its data."""

    topic: str
    kafka_partition: int | None = None
    key_schema: Schema | None = None
    key: Any = None
    value_schema: Schema | None = None
    value: Any = None
    timestamp: int | None = None
    headers: Headers = ()

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None if it has none)."""
        return next((v for k, v in reversed(self.headers) if k == name), None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceRecord(ConnectRecord):
    """A record a source task read, with where in its source it was read (``source_partition``, e.g.
    ``{"filename": ...}``) and how far (``source_offset``, e.g. ``{"position": 120}``). Both are JSON objects;
    the worker stores the offset with the record, in one transaction."""

    source_partition: Mapping[str, Any] | None = None
    source_offset: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SinkRecord(ConnectRecord):
    """A record consumed for a sink task, with its position in its stream."""

    kafka_offset: int = -1


def replaced(record: ConnectRecord, **changes: Any) -> Any:
    """A copy of ``record`` with some fields changed (Kafka's ``newRecord``), of the same record type."""
    return dataclasses.replace(record, **changes)
