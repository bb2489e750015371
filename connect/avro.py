"""``AvroConverter``: Confluent's Avro converter (``io.confluent.connect.avro.AvroConverter``) through fastavro.

Bytes are Confluent's wire format: a zero byte, the schema's 4-byte id in a schema registry
(``schema.registry.url``: Confluent's, or onceflow's own ``onceflow schema-registry``), then the Avro binary. Writing
registers the record's schema under ``<topic>-key`` / ``<topic>-value`` (TopicNameStrategy) and caches its id;
reading fetches a schema by its id once. So what it writes, confluent-kafka's ``AvroDeserializer`` (and Kafka
Connect's AvroConverter) read, and the other way round.

Schemas map as Confluent's converter maps them: struct <-> record, int8/int16/int32 <-> int, int64 <-> long,
float32 <-> float, float64 <-> double, boolean, string, bytes, array, map (string keys); an optional schema is a
union with null (default null).
"""

from __future__ import annotations

import io
import json
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import fastavro

from onceflow.connect.config_def import ConfigDef, Importance, Type, non_empty
from onceflow.connect.converters import Converter, SchemaAndValue
from onceflow.connect.records import Field, Schema
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException

MAGIC = 0
_HEADER = struct.Struct(">bI")
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
        raise KafkaException(KafkaError(ErrorCode.INVALID_RECORD, f"an {whole.type} schema needs its value schema"))
    return schema


def from_avro(avro: Any) -> Schema:
    """The Connect schema of an Avro schema (a union with null is an optional schema)."""
    if isinstance(avro, list):
        rest = [a for a in avro if a != "null"]
        if len(rest) != 1:
            raise KafkaException(KafkaError(ErrorCode._VALUE_DESERIALIZATION, f"Avro union {avro} has no Connect "
                                                                               "schema (only [null, T] has)"))
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


def _infer(value: Any) -> Schema:
    """A schema for a value written without one (Kafka Connect refuses those; here they still round-trip)."""
    if isinstance(value, bool):
        return Schema("boolean", True)
    if isinstance(value, int):
        return Schema("int64", True)
    if isinstance(value, float):
        return Schema("float64", True)
    if isinstance(value, bytes):
        return Schema("bytes", True)
    if isinstance(value, dict):
        return Schema("struct", True, fields=tuple(Field(k, _infer(v)) for k, v in value.items()))
    return Schema("string", True)


class _Registry:
    """The few calls of a schema registry's REST API the converter makes, with their answers cached."""

    def __init__(self, url: str) -> None:
        self._url = url.rstrip("/")
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, Any] = {}
        self._lock = threading.Lock()

    def register(self, subject: str, schema: Any) -> int:
        text = json.dumps(schema, sort_keys=True)
        with self._lock:
            known = self._ids.get((subject, text))
        if known is None:
            known = int(self._call("POST", f"/subjects/{subject}/versions", {"schema": text})["id"])
            with self._lock:
                self._ids[(subject, text)] = known
                self._schemas[known] = fastavro.parse_schema(schema)
        return known

    def schema(self, schema_id: int) -> Any:
        with self._lock:
            known = self._schemas.get(schema_id)
        if known is None:
            known = fastavro.parse_schema(json.loads(self._call("GET", f"/schemas/ids/{schema_id}")["schema"]))
            with self._lock:
                self._schemas[schema_id] = known
        return known

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(self._url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise KafkaException(KafkaError(ErrorCode.INVALID_RECORD, f"schema registry {self._url}{path}: "
                                            f"{exc.code} {exc.read().decode(errors='replace')}")) from None
        except OSError as exc:
            raise KafkaException(KafkaError(ErrorCode._TRANSPORT, f"schema registry {self._url}: {exc}",
                                            retriable=True)) from None


class AvroConverter(Converter):
    """See the module docstring."""

    def config(self) -> ConfigDef:
        return ConfigDef().define("schema.registry.url", Type.LIST, validator=_urls, importance=Importance.HIGH,
                                  documentation="The schema registry's URL (the first of a list is used)")

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        self._registry = _Registry(self.settings["schema.registry.url"][0])

    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None:
        if value is None:
            return None
        avro_schema = to_avro(schema if schema is not None else _infer(value))
        schema_id = self._registry.register(f"{topic}-{'key' if self.is_key else 'value'}", avro_schema)
        out = io.BytesIO()
        out.write(_HEADER.pack(MAGIC, schema_id))
        try:
            fastavro.schemaless_writer(out, self._registry.schema(schema_id), value)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.cannot_serialize(topic, f"the value does not fit its Avro schema: {exc}")
        return out.getvalue()

    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue:
        if data is None:
            return None, None
        if len(data) < _HEADER.size or data[0] != MAGIC:
            self.cannot_deserialize(topic, "Unknown magic byte!")
        schema_id = _HEADER.unpack_from(data)[1]
        writer = self._registry.schema(schema_id)
        try:
            value = fastavro.schemaless_reader(io.BytesIO(data[_HEADER.size:]), writer, None)
        except (ValueError, EOFError, IndexError, struct.error) as exc:
            self.cannot_deserialize(topic, f"not Avro of schema id {schema_id}: {exc}")
        return from_avro(_plain(writer)), value


def _plain(parsed: Any) -> Any:
    """A parsed fastavro schema back in plain JSON form (parsing adds fastavro's own keys)."""
    if isinstance(parsed, dict):
        return {k: _plain(v) for k, v in parsed.items() if not k.startswith("__")}
    if isinstance(parsed, list):
        return [_plain(v) for v in parsed]
    return parsed


def _urls(name: str, value: list[str]) -> None:
    non_empty(name, ",".join(value or []))
