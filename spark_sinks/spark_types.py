"""Registry schemas as Spark columns: the Spark type an Avro, Protobuf or JSON Schema is read as, and how a value
that confluent-kafka's deserializer returns becomes a value of that type.

Avro: record -> struct, array -> array, map -> map, a union of null and one type -> that type, nullable; enum ->
string, bytes and fixed -> binary, int/long/float/double/boolean/string as themselves; logical types date ->
date, timestamp-millis/micros -> timestamp, local-timestamp-millis/micros -> timestamp_ntz, decimal ->
decimal(precision, scale), uuid -> string. Protobuf: message -> struct, repeated -> array, map -> map, enum ->
its value's name, google.protobuf.Timestamp -> timestamp, unsigned 32-bit -> bigint, unsigned 64-bit ->
decimal(20, 0). JSON Schema: an object with properties -> struct, an array with items -> array, an object with
only ``additionalProperties`` -> map, string/integer/number/boolean -> string/bigint/double/boolean; anything else
(no type, several types, ``oneOf``, ``$ref``) -> its JSON text.

What Spark cannot hold (a recursive type, an Avro union of several non-null types, Avro's time-* types) is
INVALID_CONFIG naming where it is, when the query is planned.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
from collections.abc import Callable, Mapping
from typing import Any

import fastavro
from google.protobuf import descriptor
from pyspark.sql import types as T

from onceflow.connector.errors import ErrorCode, fail

Convert = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Column:
    """A Spark type, whether it may be null, and how a deserialized value becomes its value (None: as it is)."""

    type: T.DataType
    nullable: bool = False
    convert: Convert | None = None

    def apply(self, value: Any) -> Any:
        return value if value is None or self.convert is None else self.convert(value)


def _unsupported(where: str, what: str) -> Column:
    fail(ErrorCode.INVALID_CONFIG, f"onceflow: {where or 'the schema'}: {what} has no Spark type")


def _struct(fields: Mapping[str, Column], nullable: bool = False, exact: bool = False) -> Column:
    """A struct of ``fields``, read from a dict: as it is when it holds exactly those fields and none needs
    converting; else (``exact``: it may lack some or hold others) rebuilt with exactly those fields."""
    spark = T.StructType([T.StructField(name, c.type, c.nullable) for name, c in fields.items()])
    if not exact and all(c.convert is None for c in fields.values()):
        return Column(spark, nullable)

    def convert(value: Mapping[str, Any]) -> dict[str, Any]:
        return {name: c.apply(value.get(name)) for name, c in fields.items()}

    return Column(spark, nullable, convert)


def _array(items: Column, nullable: bool = False) -> Column:
    spark = T.ArrayType(items.type, items.nullable)
    return Column(spark, nullable, None if items.convert is None else (lambda v: [items.apply(i) for i in v]))


def _map(keys: Column, values: Column, nullable: bool = False) -> Column:
    spark = T.MapType(keys.type, values.type, values.nullable)
    if keys.convert is None and values.convert is None:
        return Column(spark, nullable)
    return Column(spark, nullable, lambda v: {keys.apply(k): values.apply(i) for k, i in v.items()})


# -- Avro ------------------------------------------------------------------------------------------------------

_AVRO_PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(), "int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(),
    "double": T.DoubleType(), "string": T.StringType(), "bytes": T.BinaryType(), "null": T.NullType(),
}
_AVRO_LOGICAL: dict[str, T.DataType] = {
    "date": T.DateType(), "timestamp-millis": T.TimestampType(), "timestamp-micros": T.TimestampType(),
    "local-timestamp-millis": T.TimestampNTZType(), "local-timestamp-micros": T.TimestampNTZType(),
}


def avro_column(schema: Any) -> Column:
    """The column an Avro schema (parsed JSON) is read as."""
    try:  # fastavro qualifies every name with its namespace, as references to it are written
        qualified = fastavro.parse_schema(schema, _write_hint=False, _force=True)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: not a valid Avro schema: {exc}")
    return _avro(qualified, {}, frozenset(), "")


def _avro(schema: Any, named: dict[str, Any], visiting: frozenset[str], where: str) -> Column:
    if isinstance(schema, list):
        return _avro_union(schema, named, visiting, where)
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return Column(_AVRO_PRIMITIVES[schema], schema == "null")
        if schema in visiting:
            return _unsupported(where, f"the recursive type {schema!r}")
        if schema not in named:
            return _unsupported(where, f"the undefined type {schema!r}")
        return _avro(named[schema], named, visiting, where)
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical in _AVRO_LOGICAL:
        return Column(_AVRO_LOGICAL[logical])
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if kind == "fixed":
            _remember(schema, named)
        return Column(T.DecimalType(int(schema["precision"]), int(schema.get("scale", 0))))
    if logical in ("time-millis", "time-micros"):
        return _unsupported(where, f"Avro's {logical}")
    if logical == "uuid":
        return Column(T.StringType(), convert=str)
    if kind == "record":
        full = _remember(schema, named)
        inside = visiting | {full}
        return _struct({f["name"]: _avro(f["type"], named, inside, f"{where}.{f['name']}".lstrip("."))
                        for f in schema["fields"]})
    if kind == "enum":
        _remember(schema, named)
        return Column(T.StringType())
    if kind == "fixed":
        _remember(schema, named)
        return Column(T.BinaryType())
    if kind == "array":
        return _array(_avro(schema["items"], named, visiting, f"{where}[]"))
    if kind == "map":
        return _map(Column(T.StringType()), _avro(schema["values"], named, visiting, f"{where}{{}}"))
    return _avro(kind, named, visiting, where)


def _remember(schema: Mapping[str, Any], named: dict[str, Any]) -> str:
    named.setdefault(schema["name"], schema)
    return str(schema["name"])


def _avro_union(branches: list[Any], named: dict[str, Any], visiting: frozenset[str], where: str) -> Column:
    others = [b for b in branches if b != "null"]
    if len(others) != 1:
        return _unsupported(where, f"a union of {len(others)} non-null types")
    return dataclasses.replace(_avro(others[0], named, visiting, where), nullable=len(others) < len(branches))


# -- Protobuf --------------------------------------------------------------------------------------------------

_FD = descriptor.FieldDescriptor
_PROTO_SCALARS: dict[int, T.DataType] = {
    _FD.TYPE_DOUBLE: T.DoubleType(), _FD.TYPE_FLOAT: T.FloatType(), _FD.TYPE_BOOL: T.BooleanType(),
    _FD.TYPE_STRING: T.StringType(), _FD.TYPE_BYTES: T.BinaryType(),
    **dict.fromkeys((_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32), T.IntegerType()),
    **dict.fromkeys((_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64, _FD.TYPE_UINT32, _FD.TYPE_FIXED32),
                    T.LongType()),
}
_TIMESTAMP = "google.protobuf.Timestamp"


def protobuf_column(message: Any) -> Column:
    """The column a Protobuf message is read as (a message instance in, a dict out)."""
    return _message(message, frozenset(), "")


def _message(message: descriptor.Descriptor, visiting: frozenset[str], where: str) -> Column:
    if message.full_name in visiting:
        return _unsupported(where, f"the recursive message {message.full_name!r}")
    inside = visiting | {message.full_name}
    fields = {f.name: _proto_field(f, inside, f"{where}.{f.name}".lstrip(".")) for f in message.fields}
    struct = T.StructType([T.StructField(name, c.type, c.nullable) for name, c in fields.items()])
    present = {f.name for f in message.fields if f.has_presence}

    def convert(value: Any) -> dict[str, Any]:
        return {name: (None if name in present and not value.HasField(name) else c.apply(getattr(value, name)))
                for name, c in fields.items()}

    return Column(struct, convert=convert)


def _proto_field(field: descriptor.FieldDescriptor, visiting: frozenset[str], where: str) -> Column:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        keys, values = _proto_single(key, visiting, where), _proto_single(value, visiting, where)
        return Column(T.MapType(keys.type, values.type, False),
                      convert=lambda v: {keys.apply(k): values.apply(i) for k, i in v.items()})
    single = _proto_single(field, visiting, where)
    if field.is_repeated:  # protobuf's containers are not lists: always copied
        return Column(T.ArrayType(single.type, False), convert=lambda v: [single.apply(i) for i in v])
    return dataclasses.replace(single, nullable=field.has_presence)


def _proto_single(field: descriptor.FieldDescriptor, visiting: frozenset[str], where: str) -> Column:
    if field.type in _PROTO_SCALARS:
        return Column(_PROTO_SCALARS[field.type])
    if field.type in (_FD.TYPE_UINT64, _FD.TYPE_FIXED64):
        return Column(T.DecimalType(20, 0), convert=decimal.Decimal)  # a bigint cannot hold 2**64 - 1
    if field.enum_type is not None:
        names = {v.number: v.name for v in field.enum_type.values}
        return Column(T.StringType(), convert=lambda v: names.get(v, str(v)))
    message = field.message_type
    if message is None:
        return _unsupported(where, f"the Protobuf field type {field.type}")
    if message.full_name == _TIMESTAMP:
        return Column(T.TimestampType(), convert=lambda v: v.ToDatetime(tzinfo=datetime.UTC))
    return _message(message, visiting, where)


# -- JSON Schema -----------------------------------------------------------------------------------------------

_JSON_SCALARS: dict[str, tuple[T.DataType, Convert | None]] = {
    "string": (T.StringType(), None), "integer": (T.LongType(), int), "number": (T.DoubleType(), float),
    "boolean": (T.BooleanType(), None),
}


def json_column(schema: Any) -> Column:
    """The column a JSON Schema (parsed) is read as: a struct where it gives an object's properties, else (at the
    top as inside) JSON text."""
    return _json(schema)


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json(schema: Any) -> Column:
    text = Column(T.StringType(), True, _json_text)
    if not isinstance(schema, dict) or any(k in schema for k in ("$ref", "oneOf", "anyOf", "allOf")):
        return text
    types = schema.get("type")
    named = [t for t in (types if isinstance(types, list) else [types]) if t != "null"]
    if len(named) != 1:
        return text
    kind = named[0]
    if kind in _JSON_SCALARS:
        spark, convert = _JSON_SCALARS[kind]
        return Column(spark, True, convert)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return _array(_json(schema["items"]), nullable=True)
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return _struct({name: _json(p) for name, p in schema["properties"].items()}, nullable=True, exact=True)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return _map(Column(T.StringType()), _json(schema["additionalProperties"]), nullable=True)
    return text
