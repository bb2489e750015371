"""Converters: between a record's key or value as connectors see it (Python data, optional :class:`Schema`) and
the bytes a stream stores. Kafka Connect's built-in converters, under their Kafka class names so worker and
connector configs carry over: ``StringConverter``, ``ByteArrayConverter``, ``JsonConverter`` (with or without
the ``{"schema": ..., "payload": ...}`` envelope, ``schemas.enable``); and :class:`RegistryConverter`, what
Confluent's schema registry converters (``AvroConverter``, ``ProtobufConverter``, ``JsonSchemaConverter``: modules
``avro``, ``protobuf``, ``json_schema``) share: confluent-kafka's serdes through :mod:`onceflow.schemas.serdes`, the
code the Spark registry formats use too.

A value a converter cannot handle raises _KEY_SERIALIZATION / _VALUE_SERIALIZATION (to bytes) or
_KEY_DESERIALIZATION / _VALUE_DESERIALIZATION (from bytes), which ``errors.tolerance`` applies to.
"""

from __future__ import annotations

import abc
import base64
import codecs
import contextlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

from confluent_kafka.serialization import SerializationContext

from onceflow.connect.config_def import ConfigDef, Importance, Type, Width, non_empty, one_of
from onceflow.connect.records import OPTIONAL_BYTES_SCHEMA, OPTIONAL_STRING_SCHEMA, Field, Schema
from onceflow.connector.errors import ErrorCode, fail
from onceflow.schemas import serdes

SchemaAndValue = tuple[Schema | None, Any]


class Converter(abc.ABC):
    """Turns connector data into bytes and back, for keys (``is_key``) or values."""

    is_key = False
    settings: dict[str, Any]
    """The parsed config (:meth:`configure` sets it)."""

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        """``configs``: the converter's own keys (a worker's ``value.converter.schemas.enable`` arrives as
        ``schemas.enable``)."""
        self.is_key = is_key
        self.settings = self.config().parse(configs)

    def config(self) -> ConfigDef:
        return ConfigDef()

    @abc.abstractmethod
    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None: ...

    @abc.abstractmethod
    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue: ...

    def cannot_serialize(self, topic: str, why: str) -> NoReturn:
        code = ErrorCode._KEY_SERIALIZATION if self.is_key else ErrorCode._VALUE_SERIALIZATION
        fail(code, f"{type(self).__name__} ({'key' if self.is_key else 'value'}, topic {topic}): {why}")

    def cannot_deserialize(self, topic: str, why: str) -> NoReturn:
        code = ErrorCode._KEY_DESERIALIZATION if self.is_key else ErrorCode._VALUE_DESERIALIZATION
        fail(code, f"{type(self).__name__} ({'key' if self.is_key else 'value'}, topic {topic}): {why}")


class StringConverter(Converter):
    """Any value as its text (``str``), encoded with ``converter.encoding`` (UTF-8); bytes come back as str."""

    encoding = "utf-8"

    def config(self) -> ConfigDef:
        return ConfigDef().define("converter.encoding", Type.STRING, "UTF8", None, Importance.HIGH,
                                  "The name of the character encoding used for the data")

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        name = self.settings["converter.encoding"]
        try:
            self.encoding = codecs.lookup(name).name
        except LookupError:
            fail(ErrorCode.INVALID_CONFIG, f"converter.encoding: unknown encoding {name!r}")

    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None:
        if value is None:
            return None
        text = value.decode(self.encoding) if isinstance(value, bytes) else str(value)
        return text.encode(self.encoding)

    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue:
        if data is None:
            return OPTIONAL_STRING_SCHEMA, None
        try:
            return OPTIONAL_STRING_SCHEMA, data.decode(self.encoding)
        except UnicodeDecodeError as exc:
            self.cannot_deserialize(topic, f"not {self.encoding}: {exc}")


class ByteArrayConverter(Converter):
    """Bytes as they are: a value must be bytes (or None)."""

    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None:
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        self.cannot_serialize(topic, f"expected bytes, got {type(value).__name__}")

    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue:
        return OPTIONAL_BYTES_SCHEMA, data


class JsonConverter(Converter):
    """JSON; with ``schemas.enable`` (the default, as Kafka's) each value is ``{"schema": ..., "payload": ...}``."""

    schemas_enable = True

    def config(self) -> ConfigDef:
        return (ConfigDef()
                .define("schemas.enable", Type.BOOLEAN, "true", None, Importance.HIGH,
                        "Include schemas within each of the serialized values and keys.", group="Schemas",
                        order_in_group=1, width=Width.MEDIUM, display_name="Enable Schemas")
                .define("schemas.cache.size", Type.INT, "1000", None, Importance.HIGH,
                        "The maximum number of schemas that can be cached in this converter instance.")
                .define("decimal.format", Type.STRING, "BASE64", one_of("BASE64", "NUMERIC"), Importance.LOW,
                        "How decimals are written (accepted for compatibility; Python data has no Decimal schema)")
                .define("replace.null.with.default", Type.BOOLEAN, "true", None, Importance.LOW,
                        "Write a null field as its schema's default")
                .define("converter.type", Type.STRING, "value", one_of("key", "value", "header"), Importance.LOW,
                        "Set by the worker: key, value or header"))

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        self.schemas_enable = self.settings["schemas.enable"]

    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None:
        if value is None and not self.schemas_enable:
            return None
        payload = _to_json(value, schema, topic, self)
        document = {"schema": schema_to_json(schema), "payload": payload} if self.schemas_enable else payload
        return json.dumps(document, separators=(",", ":")).encode()

    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue:
        if data is None:
            return None, None
        try:
            document = json.loads(data)
        except ValueError as exc:
            self.cannot_deserialize(topic, f"Converting byte[] to Kafka Connect data failed due to serialization "
                                            f"error: {exc}")
        if not self.schemas_enable:
            return None, document
        if not isinstance(document, dict) or set(document) != {"schema", "payload"}:
            self.cannot_deserialize(topic, 'JsonConverter with schemas.enable requires "schema" and "payload" '
                                            "fields and may not contain additional fields. If you are trying to "
                                            "deserialize plain JSON data, set schemas.enable=false in your "
                                            "converter configuration.")
        schema = schema_from_json(document["schema"], topic, self)
        return schema, _from_json(document["payload"], schema, topic, self)


def schema_to_json(schema: Schema | None) -> dict[str, Any] | None:
    """Kafka's JSON form of a schema (as JsonConverter writes it)."""
    if schema is None:
        return None
    out: dict[str, Any] = {"type": schema.type, "optional": schema.optional}
    if schema.type == "struct":
        out["fields"] = [{**(schema_to_json(f.schema) or {}), "field": f.name} for f in schema.fields]
    elif schema.type == "array":
        out["items"] = schema_to_json(schema.value_schema)
    elif schema.type == "map":
        out["keys"], out["values"] = schema_to_json(schema.key_schema), schema_to_json(schema.value_schema)
    for name in ("name", "version", "doc", "default"):
        if getattr(schema, name) is not None:
            out[name] = getattr(schema, name)
    if schema.parameters:
        out["parameters"] = dict(schema.parameters)
    return out


def schema_from_json(document: Any, topic: str, converter: Converter) -> Schema | None:
    """The schema a JSON envelope names (None for ``"schema": null``)."""
    if document is None:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("type"), str):
        converter.cannot_deserialize(topic, f"Schema must contain 'type' field: {document!r}")
    try:
        kind = document["type"]
        parts: dict[str, Any] = {}
        if kind == "struct":
            parts["fields"] = tuple(Field(f["field"], schema_from_json(f, topic, converter))  # type: ignore[arg-type]
                                    for f in document.get("fields", []))
        elif kind == "array":
            parts["value_schema"] = schema_from_json(document.get("items"), topic, converter)
        elif kind == "map":
            parts["key_schema"] = schema_from_json(document.get("keys"), topic, converter)
            parts["value_schema"] = schema_from_json(document.get("values"), topic, converter)
        return Schema(kind, optional=bool(document.get("optional", False)), name=document.get("name"),
                      version=document.get("version"), doc=document.get("doc"), default=document.get("default"),
                      parameters=document.get("parameters"), **parts)
    except (KeyError, TypeError) as exc:
        converter.cannot_deserialize(topic, f"invalid schema {document!r}: {exc!r}")


def _to_json(value: Any, schema: Schema | None, topic: str, converter: Converter) -> Any:
    """A connector value as JSON data (bytes as base64, as Kafka writes them)."""
    if value is None:
        if schema is not None and not schema.optional and schema.default is None:
            converter.cannot_serialize(topic, f"null value for a required {schema.type} schema")
        return None
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        fields = {f.name: f.schema for f in schema.fields} if schema is not None and schema.type == "struct" else {}
        inner = schema.value_schema if schema is not None and schema.type == "map" else None
        return {str(k): _to_json(v, fields.get(str(k), inner), topic, converter) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = schema.value_schema if schema is not None else None
        return [_to_json(v, items, topic, converter) for v in value]
    if isinstance(value, str | int | float | bool):
        return value
    converter.cannot_serialize(topic, f"cannot write a {type(value).__name__} as JSON")


def _from_json(payload: Any, schema: Schema | None, topic: str, converter: Converter) -> Any:
    """JSON data as the connector value ``schema`` says (bytes from base64, structs as dicts)."""
    if payload is None or schema is None:
        return payload if payload is not None or schema is None else schema.default
    if schema.type == "bytes":
        try:
            return base64.b64decode(payload, validate=True)
        except (ValueError, TypeError):
            converter.cannot_deserialize(topic, f"bytes field is not base64: {payload!r}")
    if schema.type == "struct" and isinstance(payload, dict):
        return {f.name: _from_json(payload.get(f.name), f.schema, topic, converter) for f in schema.fields}
    if schema.type == "array" and isinstance(payload, list):
        return [_from_json(v, schema.value_schema, topic, converter) for v in payload]
    if schema.type == "map" and isinstance(payload, dict):
        return {k: _from_json(v, schema.value_schema, topic, converter) for k, v in payload.items()}
    return payload


class RegistryConverter(Converter):
    """A converter to and from Confluent's wire format against a schema registry (``schema.registry.url``),
    configured with the keys of Confluent's converters: ``auto.register.schemas`` (default true, as theirs),
    ``use.latest.version`` and ``key.subject.name.strategy`` / ``value.subject.name.strategy`` (Confluent's class
    names, e.g. ``io.confluent.kafka.serializers.subject.RecordNameStrategy``, or topic, record, topic-record).

    Writing, a record's Connect schema (inferred for a value without one) becomes a schema of the subclass's type
    (:meth:`schema_text`), and confluent-kafka's serializer for it (:meth:`new_writer`, one per distinct schema)
    registers it or looks it up under the strategy's subject and writes the record. Reading, confluent-kafka's
    deserializer reads the record with its writer's schema (:meth:`read`), which also gives the Connect schema. A
    value that does not fit, or a schema the registry refuses, is _KEY_SERIALIZATION/_VALUE_SERIALIZATION; bytes
    that are not the format, or name a schema id the registry does not know, _KEY_DESERIALIZATION/
    _VALUE_DESERIALIZATION; an unreachable registry _TRANSPORT (retriable).
    """

    schema_type: ClassVar[str]

    def config(self) -> ConfigDef:
        strategy = "io.confluent.kafka.serializers.subject.TopicNameStrategy"
        return (ConfigDef()
                .define("schema.registry.url", Type.LIST, validator=_urls, importance=Importance.HIGH,
                        documentation="The schema registry's URL (the first of a list is used)")
                .define("auto.register.schemas", Type.BOOLEAN, "true", None, Importance.MEDIUM,
                        "Register a record's schema under its subject when it is not there yet")
                .define("use.latest.version", Type.BOOLEAN, "false", None, Importance.LOW,
                        "Write with the subject's latest version (needs auto.register.schemas=false)")
                .define("key.subject.name.strategy", Type.STRING, strategy, None, Importance.MEDIUM,
                        "How a key's subject is named: Topic-, Record- or TopicRecordNameStrategy")
                .define("value.subject.name.strategy", Type.STRING, strategy, None, Importance.MEDIUM,
                        "How a value's subject is named (as key.subject.name.strategy)"))

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        side = "key" if is_key else "value"
        option = f"{side}.subject.name.strategy"
        conf = serdes.WriteConf(serdes.strategy_name(self.settings[option], option),
                                self.settings["auto.register.schemas"], self.settings["use.latest.version"])
        if conf.auto_register and conf.use_latest:
            fail(ErrorCode.INVALID_CONFIG, f"{type(self).__name__}: use.latest.version=true needs "
                 "auto.register.schemas=false (as confluent-kafka's serializers)")
        self.write_conf = conf
        self.registry = serdes.client(self.settings["schema.registry.url"][0])
        read_code = ErrorCode._KEY_DESERIALIZATION if is_key else ErrorCode._VALUE_DESERIALIZATION
        write_code = ErrorCode._KEY_SERIALIZATION if is_key else ErrorCode._VALUE_SERIALIZATION
        self._write_codes = serdes.Codes(bad_value=write_code, refused=write_code, corrupt=read_code)
        self._read_codes = serdes.Codes(bad_value=read_code, refused=read_code, corrupt=read_code)
        self._writers: dict[str, serdes.Serialize] = {}
        self._by_schema: dict[Schema, serdes.Serialize] = {}

    @abc.abstractmethod
    def schema_text(self, schema: Schema) -> str:
        """The registry schema (its text) a Connect schema is written with."""

    @abc.abstractmethod
    def new_writer(self, text: str) -> serdes.Serialize:
        """A writer of connector values with the registry schema ``text`` (confluent-kafka's serializer)."""

    @abc.abstractmethod
    def read(self, data: bytes, ctx: SerializationContext) -> SchemaAndValue:
        """A record's Connect schema and value, read by confluent-kafka's deserializer."""

    def from_connect_data(self, topic: str, schema: Schema | None, value: Any) -> bytes | None:
        if value is None:
            return None
        write = self._writer(schema if schema is not None else inferred_schema(value), topic)
        return serdes.serialize(write, value, serdes.context(topic, self.is_key), self._write_codes,
                                lambda: self._about(topic))

    def to_connect_data(self, topic: str, data: bytes | None) -> SchemaAndValue:
        if data is None:
            return None, None
        if not data or data[0] not in (0, 1):
            self.cannot_deserialize(topic, "Unknown magic byte!")
        read: SchemaAndValue = serdes.deserialize(self.read, data, serdes.context(topic, self.is_key),
                                                  self._read_codes, lambda: self._about(topic))
        return read

    def _writer(self, schema: Schema, topic: str) -> serdes.Serialize:
        """The writer of ``schema``'s values: one per distinct registry schema, found by the Connect schema
        itself when it is hashable (no dict ``parameters`` or ``default``)."""
        try:
            return self._by_schema[schema]
        except (KeyError, TypeError):
            pass
        try:
            text = self.schema_text(schema)
        except (ValueError, TypeError, KeyError) as exc:
            self.cannot_serialize(topic, f"its schema has no {self.schema_type} form: {exc}")
        write = self._writers.get(text)
        if write is None:
            write = self._writers[text] = self.new_writer(text)
        with contextlib.suppress(TypeError):
            self._by_schema[schema] = write
        return write

    def _about(self, topic: str) -> str:
        return f"{type(self).__name__} ({'key' if self.is_key else 'value'}, topic {topic})"


def inferred_schema(value: Any) -> Schema:
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
        return Schema("struct", True, fields=tuple(Field(k, inferred_schema(v)) for k, v in value.items()))
    return Schema("string", True)


def _urls(name: str, value: list[str]) -> None:
    non_empty(name, ",".join(value or []))
