"""``JsonSchemaConverter``: Confluent's JSON Schema converter (``io.confluent.connect.json.JsonSchemaConverter``).

Bytes are Confluent's wire format (a zero byte, the schema's 4-byte id, then the JSON text), written and read by
confluent-kafka's ``JSONSerializer`` (which validates each value against the schema) and ``JSONDeserializer``
through :class:`~onceflow.connect.converters.RegistryConverter` (``schema.registry.url``, ``auto.register.schemas``,
``use.latest.version``, the subject name strategies). Reading takes the writer's schema by the record's id.

Schemas map as Confluent's converter maps them, its ``connect.type`` annotations keeping what JSON does not tell
apart: a struct is an object with ``properties`` (``title`` its name, non-optional fields ``required``), int8 ...
int64 are integers and float32/float64 numbers (``connect.type`` names which), bytes a base64 string
(``connect.type`` bytes), an array an array, a map with string keys an object of ``additionalProperties``
(``connect.type`` map), and an optional schema ``{"oneOf": [{"type": "null"}, ...]}``. Reading a schema written
elsewhere: integer -> int64, number -> float64, a property not ``required`` -> optional; what has no Connect form
(several types, ``$ref``, no type) reads as a value without a schema.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from confluent_kafka.serialization import SerializationContext, SerializationError

from onceflow.connect.converters import RegistryConverter, SchemaAndValue
from onceflow.connect.records import Field, Schema
from onceflow.schemas import serdes

_INTEGERS = ("int8", "int16", "int32", "int64")
_NUMBERS = ("float32", "float64")


def to_json_schema(schema: Schema) -> dict[str, Any]:
    """The JSON Schema of a Connect schema; ValueError for a map whose keys are not strings."""
    out: dict[str, Any]
    if schema.type in _INTEGERS or schema.type in _NUMBERS:
        out = {"type": "integer" if schema.type in _INTEGERS else "number", "connect.type": schema.type}
    elif schema.type == "bytes":
        out = {"type": "string", "connect.type": "bytes"}
    elif schema.type in ("boolean", "string"):
        out = {"type": schema.type}
    elif schema.type == "array":
        out = {"type": "array", "items": to_json_schema(_part(schema.value_schema, schema))}
    elif schema.type == "map":
        if schema.key_schema is not None and schema.key_schema.type != "string":
            raise ValueError(f"a map with {schema.key_schema.type} keys has no JSON Schema form")
        out = {"type": "object", "additionalProperties": to_json_schema(_part(schema.value_schema, schema)),
               "connect.type": "map"}
    else:
        out = {"type": "object", **({"title": schema.name} if schema.name else {}),
               "properties": {f.name: to_json_schema(f.schema) for f in schema.fields},
               "required": [f.name for f in schema.fields if not f.schema.optional]}
    return {"oneOf": [{"type": "null"}, out]} if schema.optional else out


def _part(schema: Schema | None, whole: Schema) -> Schema:
    if schema is None:
        raise ValueError(f"an {whole.type} schema needs its value schema")
    return schema


def from_json_schema(document: Any, optional: bool = False) -> Schema | None:
    """The Connect schema of a JSON Schema (None where it has none)."""
    if not isinstance(document, dict):
        return None
    branches = document.get("oneOf", document.get("anyOf"))
    if isinstance(branches, list):
        others = [b for b in branches if b != {"type": "null"}]
        return from_json_schema(others[0], True) if len(others) == 1 and len(others) < len(branches) else None
    kind, connect = document.get("type"), document.get("connect.type")
    if isinstance(kind, list):
        named = [k for k in kind if k != "null"]
        return (from_json_schema({**document, "type": named[0]}, optional or len(named) < len(kind))
                if len(named) == 1 else None)
    if kind == "integer":
        return Schema(connect if connect in _INTEGERS else "int64", optional)
    if kind == "number":
        return Schema(connect if connect in _NUMBERS else "float64", optional)
    if kind == "string":
        return Schema("bytes" if connect == "bytes" else "string", optional)
    if kind == "boolean":
        return Schema("boolean", optional)
    if kind == "array":
        items = from_json_schema(document.get("items"))
        return Schema("array", optional, value_schema=items) if items is not None else None
    if kind == "object" and isinstance(document.get("properties"), dict):
        return _struct(document, optional)
    if kind == "object" and isinstance(document.get("additionalProperties"), dict):
        values = from_json_schema(document["additionalProperties"])
        return Schema("map", optional, key_schema=Schema("string"), value_schema=values) if values else None
    return None


def _struct(document: Mapping[str, Any], optional: bool) -> Schema | None:
    required = set(document.get("required") or ())
    fields = []
    for name, part in document["properties"].items():
        schema = from_json_schema(part, name not in required)
        if schema is None:
            return None
        fields.append(Field(name, schema))
    return Schema("struct", optional, document.get("title"), fields=tuple(fields))


def from_json(value: Any, schema: Schema | None) -> Any:
    """A JSON value as the connector value ``schema`` says (bytes from base64, floats for numbers)."""
    if value is None or schema is None:
        return value
    if schema.type == "bytes":
        return base64.b64decode(value, validate=True)
    if schema.type in _NUMBERS:
        return float(value)
    if schema.type == "struct":
        return {f.name: from_json(value.get(f.name), f.schema) for f in schema.fields}
    if schema.type == "array":
        return [from_json(v, schema.value_schema) for v in value]
    if schema.type == "map":
        return {k: from_json(v, schema.value_schema) for k, v in value.items()}
    return value


class JsonSchemaConverter(RegistryConverter):
    """See the module docstring."""

    schema_type = serdes.JSON

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        self._deserialize = serdes.deserializer(serdes.JSON, self.registry)
        self._schemas: dict[int, Schema | None] = {}

    def schema_text(self, schema: Schema) -> str:
        return json.dumps(to_json_schema(schema))

    def new_writer(self, text: str) -> serdes.Serialize:
        serialize = serdes.serializer(serdes.JSON, self.registry, text, self.write_conf)

        def write(value: Any, ctx: SerializationContext) -> bytes | None:
            return serialize(serdes.jsonable(value), ctx)

        return write

    def read(self, data: bytes, ctx: SerializationContext) -> SchemaAndValue:
        value = self._deserialize(data, ctx)
        schema_id = serdes.framed_id(data)[0]
        if not isinstance(schema_id, int):
            raise SerializationError(f"schema guid {schema_id}: only schema ids are read")
        if schema_id not in self._schemas:
            writer = json.loads(self.registry.get_schema(schema_id).schema_str or "null")
            self._schemas[schema_id] = from_json_schema(writer)
        schema = self._schemas[schema_id]
        return schema, from_json(value, schema)
