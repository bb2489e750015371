"""``AvroConverter``: Confluent's Avro converter (``io.confluent.connect.avro.AvroConverter``).

Bytes are Confluent's wire format (a zero byte, the schema's 4-byte id in a schema registry, then the Avro
binary), written and read by confluent-kafka's ``AvroSerializer`` and ``AvroDeserializer`` through
:class:`~onceflow.connect.converters.RegistryConverter` (``schema.registry.url``: Confluent's registry, or onceflow's
own ``onceflow schema-registry``; ``auto.register.schemas``, ``use.latest.version``, the subject name strategies).
Writing registers the record's schema under ``<topic>-key`` / ``<topic>-value`` (TopicNameStrategy, the default);
reading takes the writer's schema by its id. So what it writes, confluent-kafka's ``AvroDeserializer`` (and Kafka
Connect's AvroConverter) read, and the other way round.

Schemas map as Confluent's converter maps them: struct <-> record, int8/int16/int32 <-> int, int64 <-> long,
float32 <-> float, float64 <-> double, boolean, string, bytes, array, map (string keys); an optional schema is a
union with null (default null).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import fastavro
from confluent_kafka.serialization import SerializationContext, SerializationError

from onceflow.connect.converters import RegistryConverter, SchemaAndValue
from onceflow.connect.records import Field, Schema
from onceflow.schemas import serdes

_PRIMITIVES = {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
               "float64": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}
_FROM_AVRO = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "boolean": "boolean",
              "string": "string", "bytes": "bytes"}


def to_avro(schema: Schema, names: dict[str, int] | None = None) -> Any:
    """The Avro schema of a Connect schema (records get unique names: ConnectDefault, ConnectDefault2, ...)."""
    names = {} if names is None else names
    if schema.type in _PRIMITIVES:
        avro: Any = _PRIMITIVES[schema.type]
    elif schema.type == "array":
        avro = {"type": "array", "items": to_avro(_part(schema.value_schema, schema), names)}
    elif schema.type == "map":
        avro = {"type": "map", "values": to_avro(_part(schema.value_schema, schema), names)}
    else:
        base = schema.name or "ConnectDefault"
        names[base] = names.get(base, 0) + 1
        name = base if names[base] == 1 else f"{base}{names[base]}"
        avro = {"type": "record", "name": name, "fields": [_avro_field(f, names) for f in schema.fields]}
    return ["null", avro] if schema.optional else avro


def _avro_field(field: Field, names: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": field.name, "type": to_avro(field.schema, names)}
    if field.schema.optional:
        out["default"] = None
    return out


def _part(schema: Schema | None, whole: Schema) -> Schema:
    if schema is None:
        raise ValueError(f"an {whole.type} schema needs its value schema")
    return schema


def from_avro(avro: Any) -> Schema:
    """The Connect schema of an Avro schema (a union with null is an optional schema)."""
    if isinstance(avro, list):
        rest = [a for a in avro if a != "null"]
        if len(rest) != 1:
            raise SerializationError(f"Avro union {avro} has no Connect schema (only [null, T] has)")
        inner = from_avro(rest[0])
        return Schema(inner.type, True, inner.name, fields=inner.fields, key_schema=inner.key_schema,
                      value_schema=inner.value_schema)
    if isinstance(avro, str):
        return Schema(_FROM_AVRO.get(avro, "string"))
    kind = avro.get("type")
    if kind == "record":
        return Schema("struct", name=avro.get("name"),
                      fields=tuple(Field(f["name"], from_avro(f["type"])) for f in avro["fields"]))
    if kind == "array":
        return Schema("array", value_schema=from_avro(avro["items"]))
    if kind == "map":
        return Schema("map", key_schema=Schema("string"), value_schema=from_avro(avro["values"]))
    if kind == "enum":
        return Schema("string")
    return from_avro(kind)


class AvroConverter(RegistryConverter):
    """See the module docstring."""

    schema_type = serdes.AVRO

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        self._deserialize = serdes.deserializer(serdes.AVRO, self.registry)
        self._schemas: dict[int, Schema] = {}

    def schema_text(self, schema: Schema) -> str:
        return json.dumps(to_avro(schema))

    def new_writer(self, text: str) -> serdes.Serialize:
        return serdes.serializer(serdes.AVRO, self.registry, text, self.write_conf)

    def read(self, data: bytes, ctx: SerializationContext) -> SchemaAndValue:
        value = self._deserialize(data, ctx)
        return self._connect_schema(data), value

    def _connect_schema(self, data: bytes) -> Schema:
        """The Connect schema of the record's writer schema (the client has it cached: the deserializer read it)."""
        schema_id = serdes.framed_id(data)[0]
        if not isinstance(schema_id, int):
            raise SerializationError(f"schema guid {schema_id}: only schema ids are read")
        known = self._schemas.get(schema_id)
        if known is None:
            writer = self.registry.get_schema(schema_id).schema_str or ""
            known = self._schemas[schema_id] = from_avro(_plain(fastavro.parse_schema(json.loads(writer))))
        return known


def _plain(parsed: Any) -> Any:
    """A parsed fastavro schema back in plain JSON form (parsing adds fastavro's own keys)."""
    if isinstance(parsed, dict):
        return {k: _plain(v) for k, v in parsed.items() if not k.startswith("__")}
    if isinstance(parsed, list):
        return [_plain(v) for v in parsed]
    return parsed
