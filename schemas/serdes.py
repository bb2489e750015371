"""Confluent's wire format where onceflow itself serializes: the Spark formats ``avro-registry``,
``protobuf-registry``, ``json-registry`` and the Connect converters (``AvroConverter``, ``ProtobufConverter``,
``JsonSchemaConverter``) both go through this module, which hands the bytes to confluent-kafka's own serializers
and deserializers (``AvroSerializer``/``AvroDeserializer``, ``ProtobufSerializer``/``ProtobufDeserializer``,
``JSONSerializer``/``JSONDeserializer``) against a schema registry (Confluent's, or onceflow's own,
docs/schemas.md). Nothing here writes the wire format by hand.

What it adds around them: one ``SchemaRegistryClient`` per URL and process (its caches shared by every serde),
the subject name strategies under their short and Confluent's class names, Protobuf message classes built from a
registered schema, plain values made into what each serializer takes, and one translation of their failures into
onceflow's typed errors:

- a registry that cannot be reached, or answers 5xx: ``_TRANSPORT``, retriable;
- a record whose schema id the registry does not know: ``_KEY_DESERIALIZATION``/``_VALUE_DESERIALIZATION``
  (confluent-kafka's codes for a failed deserializer) naming the id;
- the rest with the codes the caller passes (:class:`Codes`): a value that does not fit the schema, a registry
  that refuses (a subject not found, a schema not registered), bytes that are not the format.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import functools
import io
import json
import struct
from collections.abc import Callable
from typing import Any, NoReturn

import fastavro
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    prefix_schema_id_serializer,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common._httpx_compat import httpx  # the HTTP client the serdes use
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.schema_registry.serde import SchemaId
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message as ProtoMessage

from onceflow.connector.errors import ErrorCode, fail
from onceflow.schemas.registry.errors import RegistryError
from onceflow.schemas.registry.protobuf import built_pool

try:  # fastavro's compiled writer, see _avro_payload
    from fastavro import _write as _fastavro_write
except ImportError:  # pragma: no cover - a pure-Python fastavro
    _fastavro_write = None  # type: ignore[assignment]

AVRO, PROTOBUF, JSON = "AVRO", "PROTOBUF", "JSON"
Strategy = Callable[[SerializationContext | None, str | None], str | None]
STRATEGIES: dict[str, Strategy] = {
    "topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
    "topic-record": topic_record_subject_name_strategy,
}
_CONFLUENT_STRATEGIES = {f"io.confluent.kafka.serializers.subject.{java}": short for java, short in (
    ("TopicNameStrategy", "topic"), ("RecordNameStrategy", "record"), ("TopicRecordNameStrategy", "topic-record"))}
UNKNOWN_SCHEMA = 40403  # the registry's "Schema not found"
BAD_VALUE = (SerializationError, ValueError, TypeError, KeyError, AttributeError, json_format.ParseError)
_BAD_BYTES = (*BAD_VALUE, EOFError, IndexError)

Serialize = Callable[[Any, SerializationContext], "bytes | None"]
Deserialize = Callable[[bytes, SerializationContext], Any]
Imports = tuple[tuple[str, str], ...]  # Protobuf: (import name, base64 descriptor) of a schema's imports


@dataclasses.dataclass(frozen=True)
class Codes:
    """The error codes a caller wants for the failures that depend on who serializes: a value that does not fit
    its schema (``bad_value``), a registry refusing a request (``refused``), bytes that are not the format
    (``corrupt``)."""

    bad_value: ErrorCode
    refused: ErrorCode
    corrupt: ErrorCode


@dataclasses.dataclass(frozen=True)
class WriteConf:
    """How a serializer picks the schema it writes with, as confluent-kafka's serializers' settings:
    ``auto.register.schemas``, ``use.latest.version`` and the subject name strategy (topic, record, topic-record)."""

    strategy: str = "topic"
    auto_register: bool = False
    use_latest: bool = False

    def conf(self) -> dict[str, Any]:
        return {"auto.register.schemas": self.auto_register, "use.latest.version": self.use_latest,
                "subject.name.strategy": STRATEGIES[self.strategy], "schema.id.serializer": _framed}


_FRAMES: dict[tuple[int, tuple[int, ...] | None], bytes] = {}


def _framed(payload: bytes, ctx: SerializationContext | None, schema_id: SchemaId) -> bytes:
    """confluent-kafka's ``prefix_schema_id_serializer`` (the schema id, and Protobuf's message indexes, before
    the payload), with the prefix it makes for an id kept rather than made again for every record."""
    if schema_id.id is None:
        return prefix_schema_id_serializer(payload, ctx, schema_id)
    indexes = schema_id.message_indexes
    key = (schema_id.id, None if indexes is None else tuple(indexes))
    prefix = _FRAMES.get(key)
    if prefix is None:
        prefix = _FRAMES[key] = prefix_schema_id_serializer(b"", ctx, schema_id)
    return prefix + payload


def strategy_name(given: str, option: str) -> str:
    """The short name (topic, record, topic-record) of a strategy given by it or by Confluent's class name;
    INVALID_CONFIG naming ``option`` otherwise."""
    name = _CONFLUENT_STRATEGIES.get(given, given.lower())
    if name not in STRATEGIES:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option {option!r} must be one of {sorted(STRATEGIES)} (or "
             f"Confluent's {', '.join(sorted(_CONFLUENT_STRATEGIES))}), got {given!r}")
    return name


# -- shared per process ------------------------------------------------------------------------------------------


@functools.cache
def client(url: str) -> SchemaRegistryClient:
    """The process's client of the registry at ``url``: every serde of the process shares its caches."""
    return SchemaRegistryClient({"url": url})


@functools.cache
def context(topic: str, is_key: bool) -> SerializationContext:
    return SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)


def serializer(schema_type: str, registry: SchemaRegistryClient, schema: Any, conf: WriteConf) -> Serialize:
    """confluent-kafka's serializer of ``schema_type``: ``schema`` is the Avro or JSON Schema text to write with
    (None with ``use_latest``: the subject's latest version), or the Protobuf message class."""
    if schema_type == AVRO:
        return AvroSerializer(registry, schema, conf=conf.conf())  # type: ignore[no-any-return]
    if schema_type == JSON:
        return JSONSerializer(schema, registry, conf=conf.conf())  # type: ignore[no-any-return]
    return ProtobufSerializer(schema, registry, conf=conf.conf())  # type: ignore[no-any-return]


def avro_records(serialize_with: Serialize, schema: str) -> Serialize:
    """confluent-kafka's ``AvroSerializer`` (``serialize_with``, made by :func:`serializer` with ``schema`` and
    without ``use_latest``) for the first record of each topic and field, the rest written as it writes them after
    that, for a fraction of its cost a record: fastavro's ``schemaless_writer`` (which it calls) with the same
    schema, after the framing (magic byte, schema id) its first output began with. A serializer without
    ``use_latest`` resolves the schema id once, by the first record, and runs no rules for the ones after (no
    rules, no conversion, no inline validation by default), so the bytes are the same; for the Spark sink, which
    writes every row of a batch this way (``bench/spark_registry_formats.py``). The first record's bytes are
    compared with the serializer's: unless they end with what fastavro wrote, it keeps writing them all."""
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(json.loads(schema), named)
    if parsed == "bytes" or (isinstance(parsed, dict) and parsed.get("type") == "bytes"):
        return serialize_with  # AvroSerializer writes a bytes schema's value as it is, not as Avro
    prefixes: dict[tuple[str, str], bytes] = {}
    payload = _avro_payload(parsed, named)

    def write(value: Any, ctx: SerializationContext) -> bytes | None:
        prefix = prefixes.get((ctx.topic, ctx.field))
        if prefix is not None:
            return prefix + payload(value)
        data = serialize_with(value, ctx)
        try:
            body = payload(value)
        except (TypeError, AttributeError):  # a fastavro whose compiled writer is called otherwise: it writes them
            return data
        if data is not None and data.endswith(body):  # else (framing after the payload?) it keeps writing them
            prefixes[ctx.topic, ctx.field] = data[:len(data) - len(body)]
        return data

    return write


_SCHEMALESS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}


def _avro_payload(parsed: Any, named: dict[str, Any]) -> Callable[[Any], bytes]:
    """A value's schemaless Avro bytes as ``schemaless_writer(out, parsed, value)`` writes them with its defaults.
    With fastavro's compiled writer, what that does inside: its ``write_data`` into a new bytearray, with the
    named types ``parse_schema`` found once, rather than parsing again and copying through a file every record
    (a third of the cost of a small record)."""
    write_data = getattr(_fastavro_write, "write_data", None)
    if write_data is not None:
        def compiled(value: Any) -> bytes:
            out = bytearray()
            write_data(out, value, parsed, named, "", _SCHEMALESS)
            return bytes(out)

        return compiled

    def through_file(value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        return out.getvalue()

    return through_file


def deserializer(schema_type: str, registry: SchemaRegistryClient | None, schema: Any = None) -> Deserialize:
    """confluent-kafka's deserializer of ``schema_type``: ``schema`` is the Avro or JSON Schema text to read with
    (None: the writer's), or the Protobuf message class to parse into (without a ``registry``, Protobuf's parses
    the bytes after the framing into it as they are)."""
    if schema_type == AVRO:
        return AvroDeserializer(registry, schema)  # type: ignore[no-any-return]
    if schema_type == JSON:
        return JSONDeserializer(schema, schema_registry_client=registry)  # type: ignore[no-any-return]
    return ProtobufDeserializer(schema, {}, schema_registry_client=registry)  # type: ignore[no-any-return]


# -- calls, their failures typed ---------------------------------------------------------------------------------


def serialize(serialize_with: Serialize, value: Any, ctx: SerializationContext, codes: Codes,
              about: Callable[[], str]) -> bytes | None:
    """``serialize_with(value, ctx)``, its failures as onceflow's errors; ``about()`` says what was written (the
    start of the message)."""
    try:
        return serialize_with(value, ctx)
    except SchemaRegistryError as exc:
        refused(exc, codes.refused, about())
    except httpx.HTTPError as exc:
        fail(ErrorCode._TRANSPORT, f"{about()}: schema registry: {exc}", retriable=True)
    except BAD_VALUE as exc:
        fail(codes.bad_value, f"{about()}: the {ctx.field} does not fit its schema: {type(exc).__name__}: {exc}")


def deserialize(deserialize_with: Deserialize, data: bytes, ctx: SerializationContext, codes: Codes,
                about: Callable[[], str]) -> Any:
    """``deserialize_with(data, ctx)``, its failures as onceflow's errors (see the module docstring); ``about()``
    names the record read."""
    try:
        return deserialize_with(data, ctx)
    except SchemaRegistryError as exc:
        unknown_schema(exc, data, ctx, codes, about())
    except httpx.HTTPError as exc:
        fail(ErrorCode._TRANSPORT, f"{about()}: schema registry: {exc}", retriable=True)
    except (SerializationError, *_BAD_BYTES) as exc:
        fail(codes.corrupt, f"{about()}: the {ctx.field} cannot be read: {type(exc).__name__}: {exc}")


def unknown_schema(exc: SchemaRegistryError, data: bytes, ctx: SerializationContext, codes: Codes,
                   about: str) -> NoReturn:
    """A registry error met reading ``data``: an unknown schema id is the deserialization error naming it."""
    if exc.error_code != UNKNOWN_SCHEMA:
        refused(exc, codes.refused, about)
    code = ErrorCode._KEY_DESERIALIZATION if ctx.field == MessageField.KEY else ErrorCode._VALUE_DESERIALIZATION
    fail(code, f"{about}: the {ctx.field}'s schema id {framed_id(data)[0]} is not in the schema registry "
         f"({exc.error_message})")


def refused(exc: SchemaRegistryError, code: ErrorCode, about: str) -> NoReturn:
    """A registry's refusal as ``code``; one that failed on its side (5xx) or was not reached as _TRANSPORT."""
    if exc.http_status_code >= 500 or exc.http_status_code < 0:
        fail(ErrorCode._TRANSPORT, f"{about}: schema registry: {exc}", retriable=True)
    fail(code, f"{about}: {exc.error_message} (registry code {exc.error_code})")


def framed_id(data: bytes, schema_type: str = AVRO) -> tuple[int | str, list[int]]:
    """The schema id (or guid) a record names and, ``schema_type`` PROTOBUF, its message indexes (confluent-kafka
    reads them); ("?", []) for bytes that are not framed so."""
    found = SchemaId(schema_type)
    try:
        found.from_bytes(io.BytesIO(data))
    except (SerializationError, EOFError, IndexError, ValueError, struct.error):
        return "?", []
    shown: int | str = found.id if found.id is not None else str(found.guid)
    return shown, list(found.message_indexes or [])


# -- Protobuf message classes from registered schemas ------------------------------------------------------------


@functools.cache
def message_class(schema: str, imports: Imports, name: str | None, where: str) -> type[ProtoMessage]:
    """The class of message ``name`` (default: the file's first) of a registered Protobuf schema (base64
    descriptor, its imports resolved); INVALID_CONFIG starting with ``where`` if it does not build or has no such
    message."""
    try:
        proto, pool = built_pool(schema, dict(imports))
    except RegistryError as exc:
        fail(ErrorCode.INVALID_CONFIG, f"{where}: {exc}")
    name = name or (f"{proto.package}.{proto.message_type[0].name}".lstrip(".") if proto.message_type else "")
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        fail(ErrorCode.INVALID_CONFIG, f"{where} has no message {name!r}")


def imports(registry: SchemaRegistryClient, schema: Schema) -> Imports:
    """A Protobuf schema's references, and theirs, as (import name, base64 descriptor)."""
    found: list[tuple[str, str]] = []
    for reference in schema.references or []:
        version = registry.get_version(reference.subject or "", reference.version or "latest", fmt="serialized")
        found += [(reference.name or "", version.schema.schema_str or ""), *imports(registry, version.schema)]
    return tuple(found)


def writer_message_class(registry: SchemaRegistryClient, schema_id: int, indexes: list[int]) -> type[ProtoMessage]:
    """The class of the message a Protobuf record was written with: schema ``schema_id``'s message at the
    record's message ``indexes`` (confluent-kafka's framing: [0] is the file's first message)."""
    schema = registry.get_schema(schema_id, fmt="serialized")
    return _indexed_class(schema.schema_str or "", imports(registry, schema), tuple(indexes or [0]), schema_id)


@functools.cache
def _indexed_class(schema: str, found: Imports, indexes: tuple[int, ...], schema_id: int) -> type[ProtoMessage]:
    try:
        proto, pool = built_pool(schema, dict(found))
    except RegistryError as exc:
        raise SerializationError(f"schema id {schema_id} does not build: {exc}") from None
    messages, name = proto.message_type, proto.package
    for index in indexes:
        if not 0 <= index < len(messages):
            raise SerializationError(f"schema id {schema_id} has no message at indexes {list(indexes)}")
        name = f"{name}.{messages[index].name}".lstrip(".")
        messages = messages[index].nested_type
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


# -- values as each serializer takes them ------------------------------------------------------------------------


def protobuf_message(cls: type[ProtoMessage], value: Any) -> ProtoMessage:
    """A plain value (a dict, datetimes, decimals, bytes) as a message of ``cls``, through Protobuf's JSON
    mapping; ParseError if it does not fit."""
    return json_format.ParseDict(jsonable(value), cls())


def jsonable(value: Any) -> Any:
    """Plain values as JSON's: datetimes as RFC 3339 text, decimals as text, bytes as base64 (Protobuf's JSON);
    fields holding None are left out."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return aware.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    return value


# -- schemas looked up and named ---------------------------------------------------------------------------------


def latest(registry: SchemaRegistryClient, url: str, subject: str, schema_type: str) -> tuple[str, Imports]:
    """The subject's latest schema and (Protobuf) its imports; INVALID_CONFIG if it has none or another type."""
    try:
        found = registry.get_latest_version(subject, fmt="serialized" if schema_type == PROTOBUF else None)
        references = imports(registry, found.schema) if schema_type == PROTOBUF else ()
    except SchemaRegistryError as exc:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {subject!r} at {url}: {exc.error_message} (register a "
             f"schema first, or give it in an option with auto.register.schemas=true)")
    except httpx.HTTPError as exc:
        fail(ErrorCode._TRANSPORT, f"schema registry {url}: {exc}", retriable=True)
    if (found.schema.schema_type or AVRO) != schema_type:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {subject!r} holds a {found.schema.schema_type} schema, "
             f"not a {schema_type} one")
    return found.schema.schema_str or "", references


def record_name(schema_type: str, schema: str | None, where: str) -> str | None:
    """The name the record strategies name a subject by, as confluent-kafka's serializers take it: Avro's full
    record name, JSON Schema's title (Protobuf's is its message's full name); INVALID_CONFIG starting with
    ``where`` for a schema that does not parse."""
    if schema is None:
        return None
    try:
        parsed = json.loads(schema)
        if schema_type == AVRO:
            parsed = fastavro.parse_schema(parsed)
            return parsed.get("name") if isinstance(parsed, dict) else None
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        fail(ErrorCode.INVALID_CONFIG, f"{where} is not a valid schema: {exc}")
    return parsed.get("title") if isinstance(parsed, dict) else None
