"""Registry schemas as Spark columns: the Spark type an Avro, Protobuf or JSON Schema is read as, and how a value
that confluent-kafka's deserializer returns becomes a value of that type.

Avro, as Spark's own ``from_avro`` reads it: record -> struct, array -> array, map -> map, a union of null and one
type -> that type, nullable; a union of int and long -> bigint, of float and double -> double; any other union of
several non-null types -> a struct of fields ``member0``, ``member1``, ... (one per non-null type, in the union's
order, each nullable; the one the value has is set), nullable if the union has null; enum -> string, bytes and
fixed -> binary, int/long/float/double/boolean/string as themselves; logical types date -> date,
timestamp-millis/micros -> timestamp, local-timestamp-millis/micros -> timestamp_ntz, decimal -> decimal(precision,
scale), uuid -> string, time-millis -> int (milliseconds after midnight), time-micros -> bigint (microseconds).
Written back, a member struct is written as its set member's type (fastavro's tuple notation names the branch).
Avro's binary data does not keep which branch a value came from once fastavro has read it, so a value read goes in
the first member that holds it, trying the narrower of two that could first: a record whose fields are the dict's
keys before a map, an enum having the symbol before a string, a fixed of its size before bytes, an int in int's
range before a long, a float that a 32-bit float holds exactly before a double.

Protobuf: message -> struct, repeated -> array, map -> map, enum ->
its value's name, google.protobuf.Timestamp -> timestamp, unsigned 32-bit -> bigint, unsigned 64-bit ->
decimal(20, 0). JSON Schema: an object with properties -> struct, an array with items -> array, an object with
only ``additionalProperties`` -> map, string/integer/number/boolean -> string/bigint/double/boolean; anything else
(no type, several types, ``oneOf``, ``$ref``) -> its JSON text.

What Spark cannot hold (a recursive type: a record or message that contains itself, as Spark's ``from_avro``
refuses too) is INVALID_CONFIG naming the type and where it is, when the query is planned.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import struct as binary
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import fastavro
from google.protobuf import descriptor
from pyspark.sql import types as T

from onceflow.connector.errors import ErrorCode, fail

Convert = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class Column:
    """A Spark type, whether it may be null, how a deserialized value becomes its value (``convert``; None: as it
    is) and how the column's value becomes what the serializer takes back (``prepare``; None: as it is)."""

    type: T.DataType
    nullable: bool = False
    convert: Convert | None = None
    prepare: Convert | None = None

    def apply(self, value: Any) -> Any:
        return value if value is None or self.convert is None else self.convert(value)

    def prepared(self, value: Any) -> Any:
        return value if value is None or self.prepare is None else self.prepare(value)


def _unsupported(where: str, what: str) -> Column:
    fail(ErrorCode.INVALID_CONFIG, f"onceflow: {where or 'the schema'}: {what} has no Spark type")


def _struct(fields: Mapping[str, Column], nullable: bool = False, exact: bool = False) -> Column:
    """A struct of ``fields``, read from a dict: as it is when it holds exactly those fields and none needs
    converting; else (``exact``: it may lack some or hold others) rebuilt with exactly those fields."""
    spark = T.StructType([T.StructField(name, c.type, c.nullable) for name, c in fields.items()])
    preparing = {name: c for name, c in fields.items() if c.prepare is not None}
    prepare = None if not preparing else (
        lambda value: {**value, **{name: c.prepared(value.get(name)) for name, c in preparing.items()}})
    if not exact and all(c.convert is None for c in fields.values()):
        return Column(spark, nullable, prepare=prepare)

    def convert(value: Mapping[str, Any]) -> dict[str, Any]:
        return {name: c.apply(value.get(name)) for name, c in fields.items()}

    return Column(spark, nullable, convert, prepare)


def _array(items: Column, nullable: bool = False) -> Column:
    spark = T.ArrayType(items.type, items.nullable)
    return Column(spark, nullable, None if items.convert is None else (lambda v: [items.apply(i) for i in v]),
                  None if items.prepare is None else (lambda v: [items.prepared(i) for i in v]))


def _map(keys: Column, values: Column, nullable: bool = False) -> Column:
    spark = T.MapType(keys.type, values.type, values.nullable)
    prepare = None if values.prepare is None else (lambda v: {k: values.prepared(i) for k, i in v.items()})
    if keys.convert is None and values.convert is None:
        return Column(spark, nullable, prepare=prepare)
    return Column(spark, nullable, lambda v: {keys.apply(k): values.apply(i) for k, i in v.items()}, prepare)


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
            return _unsupported(where, f"the recursive type {schema!r} (it contains itself)")
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
    if (logical, kind) in _AVRO_TIMES:  # Spark's from_avro reads them as the numbers they are written as
        spark, unit = _AVRO_TIMES[logical, kind]
        return Column(spark, convert=lambda t: _since_midnight(t, unit))
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


_AVRO_TIMES: dict[tuple[str, str], tuple[T.DataType, int]] = {
    ("time-millis", "int"): (T.IntegerType(), 1000), ("time-micros", "long"): (T.LongType(), 1_000_000)}


def _since_midnight(value: Any, per_second: int) -> Any:
    """fastavro reads time-millis/micros as a time of day: Spark's column holds the number written."""
    if not isinstance(value, datetime.time):
        return value
    seconds = value.hour * 3600 + value.minute * 60 + value.second
    return seconds * per_second + value.microsecond * per_second // 1_000_000


def _remember(schema: Mapping[str, Any], named: dict[str, Any]) -> str:
    named.setdefault(schema["name"], schema)
    return str(schema["name"])


def _avro_union(branches: list[Any], named: dict[str, Any], visiting: frozenset[str], where: str) -> Column:
    others = [b for b in branches if b != "null"]
    nullable = len(others) < len(branches)
    if len(others) == 1:
        return dataclasses.replace(_avro(others[0], named, visiting, where), nullable=nullable)
    if not others:
        return Column(T.NullType(), True)
    kinds = {_kind(b, named) for b in others}
    if kinds in ({"int", "long"}, {"float", "double"}) and len(others) == 2:
        return Column(T.LongType() if "long" in kinds else T.DoubleType(), nullable)  # as Spark widens them
    return _members(others, named, visiting, where, nullable)


def _members(branches: list[Any], named: dict[str, Any], visiting: frozenset[str], where: str,
             nullable: bool) -> Column:
    """A union of several non-null types as Spark's ``from_avro`` reads it: a struct of ``member<i>`` fields, the
    one the value is set. Written back, the set member's value goes in its branch, named (fastavro's tuple
    notation), so a long member's small number is not written as the union's int, nor a double's as its float."""
    names = [f"member{i}" for i in range(len(branches))]
    members = [dataclasses.replace(_avro(b, named, visiting, f"{where}.{n}".lstrip(".")), nullable=True)
               for n, b in zip(names, branches, strict=True)]
    resolved = [_resolved(b, named) for b in branches]
    tags = [_branch_name(b) for b in resolved]
    order = sorted(range(len(branches)), key=lambda i: (_narrower_first(resolved[i]), i))
    tests = [(i, _holds(resolved[i])) for i in order]
    spark = T.StructType([T.StructField(n, m.type, True) for n, m in zip(names, members, strict=True)])

    def convert(value: Any) -> dict[str, Any]:
        index = next((i for i, holds in tests if holds(value)), None)
        if index is None:
            fail(ErrorCode.CORRUPT_MESSAGE, f"onceflow: {where or 'the value'}: {type(value).__name__} {value!r} is "
                 f"in none of the union's types")
        found = dict.fromkeys(names)
        found[names[index]] = members[index].apply(value)
        return found

    def prepare(value: Mapping[str, Any]) -> Any:
        for name, tag, member in zip(names, tags, members, strict=True):
            if value.get(name) is not None:
                return tag, member.prepared(value[name])
        return None  # no member set: the union's null (none: the serializer says the value does not fit)

    return Column(spark, nullable, convert, prepare)


def _resolved(schema: Any, named: Mapping[str, Any]) -> Any:
    return named.get(schema, schema) if isinstance(schema, str) else schema


def _kind(schema: Any, named: Mapping[str, Any]) -> str:
    """A branch's Avro type: a primitive's name, or ``logical:<name>`` for a logical type."""
    found = _resolved(schema, named)
    if isinstance(found, str):
        return found
    return f"logical:{found['logicalType']}" if "logicalType" in found else str(found["type"])


def _branch_name(schema: Any) -> str:
    """The name fastavro's tuple notation picks a union's branch by: a named type's full name, else its type."""
    if isinstance(schema, str):
        return schema
    return str(schema["name"] if schema["type"] in ("record", "enum", "fixed") else schema["type"])


def _narrower_first(schema: Any) -> int:
    """0 for a branch tried before the others that could hold its values, 1 for the wider (see the module)."""
    return 1 if (schema if isinstance(schema, str) else schema.get("type")) in ("long", "double", "string",
                                                                                "bytes", "map") else 0


def _holds(schema: Any) -> Callable[[Any], bool]:
    """Whether a value fastavro read could be of this branch."""
    kind = schema if isinstance(schema, str) else schema["type"]
    logical = None if isinstance(schema, str) else schema.get("logicalType")
    if logical in _LOGICAL_HOLDS:
        return _LOGICAL_HOLDS[logical]
    if kind == "record":
        fields = [f["name"] for f in schema["fields"]]
        return lambda v: isinstance(v, dict) and list(v) == fields
    if kind == "enum":
        symbols = frozenset(schema["symbols"])
        return lambda v: isinstance(v, str) and v in symbols
    if kind == "fixed":
        return lambda v: isinstance(v, bytes) and len(v) == schema["size"]
    return _PRIMITIVE_HOLDS.get(kind, lambda v: False)


def _float32(value: Any) -> bool:
    return isinstance(value, float) and (value != value or binary.unpack("f", binary.pack("f", value))[0] == value)


_PRIMITIVE_HOLDS: dict[str, Callable[[Any], bool]] = {
    "boolean": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31,
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": _float32, "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str), "bytes": lambda v: isinstance(v, bytes),
    "array": lambda v: isinstance(v, list), "map": lambda v: isinstance(v, dict),
}
_LOGICAL_HOLDS: dict[str, Callable[[Any], bool]] = {
    "date": lambda v: type(v) is datetime.date,
    **dict.fromkeys(("timestamp-millis", "timestamp-micros"),
                    lambda v: isinstance(v, datetime.datetime) and v.tzinfo is not None),
    **dict.fromkeys(("local-timestamp-millis", "local-timestamp-micros"),
                    lambda v: isinstance(v, datetime.datetime) and v.tzinfo is None),
    **dict.fromkeys(("time-millis", "time-micros"), lambda v: isinstance(v, datetime.time)),
    "decimal": lambda v: isinstance(v, decimal.Decimal), "uuid": lambda v: isinstance(v, uuid.UUID),
}


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
