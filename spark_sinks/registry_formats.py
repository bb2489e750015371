"""``value.format``/``key.format`` ``avro-registry``, ``protobuf-registry`` and ``json-registry``: Confluent's wire
format, written and read by confluent-kafka's own serializers and deserializers against a schema registry
(``schema.registry.url``; onceflow's own serves Confluent's API, docs/schemas.md).

The subject is named as confluent-kafka's ``topic_subject_name_strategy`` (default), ``record_subject_name_strategy``
or ``topic_record_subject_name_strategy`` name it (``value.subject.name.strategy``/``key.subject.name.strategy``
topic, record, topic-record). The schema is the one an option gives (``avro.schema``, ``json.schema``; the key's
``key.avro.schema``, ``key.json.schema``) or else the subject's latest version, looked up on the driver when the
query is planned. Protobuf's is always a registered one; ``protobuf.message`` (``key.protobuf.message``) names its
message, by default the file's first.

Writing follows the serializers' own settings: ``use.latest.version`` (the default when no schema option is
given) writes with the subject's latest version (as it is when the query is planned: confluent-kafka's client
too keeps the latest version it saw); ``auto.register.schemas`` (default false, as a careful producer)
registers the option's schema; otherwise the option's schema must already be registered under the subject. A row
that does not fit is INVALID_RECORD, and nothing of the task is published. Reading, the column has the Spark type
of the schema looked up on the driver (:mod:`spark_types`), which the deserializers read with (Avro's schema
resolution); a record whose schema id the registry does not know is ``_VALUE_DESERIALIZATION`` (the key's:
``_KEY_DESERIALIZATION``, confluent-kafka's codes for a failed deserializer) naming the record and the id.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import functools
import io
import json
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import fastavro
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
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
from pyspark.sql import types as T

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.message import Message
from onceflow.schemas.registry.errors import RegistryError
from onceflow.schemas.registry.protobuf import built_pool
from onceflow.spark_sinks import spark_types
from onceflow.spark_sinks.formats import REGISTRY_FORMATS

SCHEMA_TYPES = dict(zip(REGISTRY_FORMATS, ("AVRO", "JSON", "PROTOBUF"), strict=True))
STRATEGIES: dict[str, Callable[[SerializationContext | None, str | None], str | None]] = {
    "topic": topic_subject_name_strategy, "record": record_subject_name_strategy,
    "topic-record": topic_record_subject_name_strategy,
}
_SCHEMA_OPTIONS = {"avro-registry": "avro.schema", "json-registry": "json.schema"}
_BAD_ROW = (SerializationError, ValueError, TypeError, KeyError, AttributeError, json_format.ParseError)
_UNKNOWN_SCHEMA = 40403


@dataclasses.dataclass(frozen=True)
class RegistryFormat:
    """One side's (key or value) registry format, resolved on the driver; picklable, so Spark ships it to tasks."""

    name: str  # avro-registry, protobuf-registry or json-registry
    field: str  # "key" or "value"
    url: str
    subject: str
    schema: str  # read with: the option's schema, or the subject's latest version's (Protobuf: base64 descriptor)
    writer_schema: str  # Avro and JSON are written with: the latest version with use_latest, else the option's
    references: tuple[tuple[str, str], ...]  # Protobuf: (import name, base64 descriptor) for the schema's imports
    message: str | None  # Protobuf: the full name of the message written and read
    strategy: str
    auto_register: bool
    use_latest: bool

    whole_rows = True  # without a value column, the other columns make up the value (a struct)
    takes_rows = False  # structs come as dicts: from Arrow batches as they are, Spark's rows converted

    def column_type(self) -> T.DataType:
        return _column(self).type

    def to_bytes(self, value: Any, topic: str) -> bytes | None:
        """The record's bytes for a column's value (plain: structs as dicts); INVALID_RECORD if it does not fit
        the schema."""
        if value is None:
            return None
        try:
            return _serializer(self)(_prepared(self.name, value, self), _context(topic, self.field))
        except SchemaRegistryError as exc:
            _registry_failed(self, exc)
        except httpx.HTTPError as exc:
            fail(ErrorCode._TRANSPORT, f"schema registry {self.url}: {exc}", retriable=True)
        except _BAD_ROW as exc:
            fail(ErrorCode.INVALID_RECORD, f"{topic}: a {self.field} does not fit the {self.name} schema of subject "
                 f"{self.subject!r}: {type(exc).__name__}: {exc}")

    def to_column(self, data: bytes | None, message: Message) -> Any:
        """The column's value for a record's bytes, read with the schema resolved on the driver."""
        if data is None:
            return None
        try:
            decoded = _deserializer(self)(data, _context(message.topic() or "", self.field))
        except SchemaRegistryError as exc:
            if exc.error_code != _UNKNOWN_SCHEMA:
                _registry_failed(self, exc)
            code = ErrorCode._KEY_DESERIALIZATION if self.field == "key" else ErrorCode._VALUE_DESERIALIZATION
            fail(code, f"{message.topic()}[{message.partition()}]@{message.offset()}: the {self.field}'s schema id "
                 f"{_schema_id(data)} is not in the schema registry at {self.url} ({exc.error_message})")
        except httpx.HTTPError as exc:
            fail(ErrorCode._TRANSPORT, f"schema registry {self.url}: {exc}", retriable=True)
        except (SerializationError, *_BAD_ROW, EOFError, IndexError) as exc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{message.topic()}[{message.partition()}]@{message.offset()}: the "
                 f"{self.field} is not {self.name}: {type(exc).__name__}: {exc}")
        return _column(self).apply(decoded)


@functools.cache
def _context(topic: str, field: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.KEY if field == "key" else MessageField.VALUE)


def _schema_id(data: bytes) -> int | str:
    """The schema id a record names (confluent-kafka reads it), for the error that says it is unknown."""
    found = SchemaId("AVRO")
    try:
        found.from_bytes(io.BytesIO(data))
    except SerializationError:
        return "?"
    return found.id if found.id is not None else str(found.guid)


def _registry_failed(fmt: RegistryFormat, exc: SchemaRegistryError) -> NoReturn:
    if exc.http_status_code >= 500 or exc.http_status_code < 0:
        fail(ErrorCode._TRANSPORT, f"schema registry {fmt.url}: {exc}", retriable=True)
    fail(ErrorCode.INVALID_CONFIG, f"onceflow: {fmt.field}.format {fmt.name}, subject {fmt.subject!r} at "
         f"{fmt.url}: {exc.error_message} (registry code {exc.error_code})")


# -- per Python worker: a client per URL, serdes per format ------------------------------------------------------


@functools.cache
def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url})


@functools.cache
def _message_class(fmt: RegistryFormat) -> type[ProtoMessage]:
    try:
        proto, pool = built_pool(fmt.schema, dict(fmt.references))
    except RegistryError as exc:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {fmt.subject!r}: {exc}")
    name = fmt.message or (f"{proto.package}.{proto.message_type[0].name}".lstrip(".") if proto.message_type else "")
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {fmt.subject!r} has no message {name!r}")


@functools.cache
def _column(fmt: RegistryFormat) -> spark_types.Column:
    if fmt.name == "protobuf-registry":
        return spark_types.protobuf_column(_message_class(fmt).DESCRIPTOR)
    parsed = json.loads(fmt.schema)
    return spark_types.avro_column(parsed) if fmt.name == "avro-registry" else spark_types.json_column(parsed)


@functools.cache
def _serializer(fmt: RegistryFormat) -> Callable[[Any, SerializationContext], bytes | None]:
    """Avro and JSON: the latest version was resolved on the driver (``writer_schema``), so the serializer looks
    its id up once rather than the latest version (and its rules) for every record (twice as fast)."""
    conf = {"auto.register.schemas": fmt.auto_register, "use.latest.version": False,
            "subject.name.strategy": STRATEGIES[fmt.strategy]}
    client = _client(fmt.url)
    if fmt.name == "avro-registry":
        return AvroSerializer(client, fmt.writer_schema, conf=conf)  # type: ignore[no-any-return]
    if fmt.name == "json-registry":
        return JSONSerializer(fmt.writer_schema, client, conf=conf)  # type: ignore[no-any-return]
    conf["use.latest.version"] = fmt.use_latest  # its schema is the message class's, built from the registered one
    return ProtobufSerializer(_message_class(fmt), client, conf=conf)  # type: ignore[no-any-return]


@functools.cache
def _deserializer(fmt: RegistryFormat) -> Callable[[bytes, SerializationContext], Any]:
    client = _client(fmt.url)
    if fmt.name == "avro-registry":
        return AvroDeserializer(client, fmt.schema)  # type: ignore[no-any-return]
    if fmt.name == "json-registry":
        return JSONDeserializer(fmt.schema, schema_registry_client=client)  # type: ignore[no-any-return]
    return ProtobufDeserializer(_message_class(fmt), {}, schema_registry_client=client)  # type: ignore[no-any-return]


def _prepared(name: str, value: Any, fmt: RegistryFormat) -> Any:
    """What the serializer takes for a row's value: Avro a dict, JSON plain JSON values, Protobuf a message."""
    if name == "avro-registry":
        return value
    jsonable = _jsonable(value)
    if name == "json-registry":
        return jsonable
    return json_format.ParseDict(jsonable, _message_class(fmt)())


def _jsonable(value: Any) -> Any:
    """Spark's values as JSON's: datetimes as RFC 3339 text, decimals as text, bytes as base64 (Protobuf's JSON)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
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


# -- on the driver: the options resolved -------------------------------------------------------------------------


def registry_format(name: str, field: str, topic: str, given: Mapping[str, str]) -> RegistryFormat:
    """``field``'s format ``name`` from the options, its subject and schema looked up in the registry;
    INVALID_CONFIG naming the option (or the subject) for anything wrong."""
    url = given.get("schema.registry.url")
    if not url:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: {field}.format {name!r} needs option 'schema.registry.url'")
    strategy = given.get(f"{field}.subject.name.strategy", "topic").lower()
    if strategy not in STRATEGIES:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option '{field}.subject.name.strategy' must be one of "
             f"{sorted(STRATEGIES)}, got {strategy!r}")
    prefix = "key." if field == "key" else ""
    option = f"{prefix}{_SCHEMA_OPTIONS.get(name, 'protobuf.message')}"
    given_schema = given.get(option) if name != "protobuf-registry" else None
    message = given.get(option) if name == "protobuf-registry" else None
    auto_register = _flag(given, "auto.register.schemas", False)
    use_latest = _flag(given, "use.latest.version", given_schema is None)
    if use_latest and auto_register:
        fail(ErrorCode.INVALID_CONFIG, "onceflow: 'use.latest.version' and 'auto.register.schemas' cannot both be "
             "true (as confluent-kafka's serializers)")
    if given_schema is None and not use_latest and name != "protobuf-registry":
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: 'use.latest.version' false needs the schema in option {option!r}")
    subject = STRATEGIES[strategy](_context(topic, field), _record_name(name, given_schema, message, option))
    if subject is None:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: the {strategy} subject name strategy needs a record name: give "
             f"option {option!r}")
    client = _client(url)
    latest = _latest(client, url, subject, name) if use_latest or given_schema is None else None
    schema, references = (given_schema, ()) if given_schema is not None else latest or ("", ())
    writer_schema = latest[0] if latest and use_latest else schema
    chosen = RegistryFormat(name, field, url, subject, schema, writer_schema, references, message, strategy,
                            auto_register, use_latest)
    if name == "protobuf-registry":
        _message_class(chosen)  # a missing message fails here, on the driver
    return chosen


def _flag(given: Mapping[str, str], option: str, default: bool) -> bool:
    raw = given.get(option)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option {option!r} must be true or false, got {raw!r}")
    return raw.lower() == "true"


def _record_name(name: str, schema: str | None, message: str | None, option: str) -> str | None:
    """The name the record strategies name a subject by: Avro's full record name, JSON Schema's title, the
    Protobuf message's full name (as confluent-kafka's serializers take them)."""
    if name == "protobuf-registry":
        return message
    if schema is None:
        return None
    try:
        parsed = json.loads(schema)
        if name == "avro-registry":
            parsed = fastavro.parse_schema(parsed)
            return parsed.get("name") if isinstance(parsed, dict) else None
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option {option!r} is not a valid schema: {exc}")
    return parsed.get("title") if isinstance(parsed, dict) else None


def _latest(client: SchemaRegistryClient, url: str, subject: str, name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The subject's latest schema and (Protobuf) its imports; INVALID_CONFIG if it has none or another type."""
    try:
        latest = client.get_latest_version(subject, fmt="serialized" if name == "protobuf-registry" else None)
        references = tuple(_imports(client, latest.schema)) if name == "protobuf-registry" else ()
    except SchemaRegistryError as exc:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {subject!r} at {url}: {exc.error_message} (register a "
             f"schema first, or give it in an option with auto.register.schemas=true)")
    except httpx.HTTPError as exc:
        fail(ErrorCode._TRANSPORT, f"schema registry {url}: {exc}", retriable=True)
    if (latest.schema.schema_type or "AVRO") != SCHEMA_TYPES[name]:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: subject {subject!r} holds a {latest.schema.schema_type} schema, "
             f"not one for {name}")
    return latest.schema.schema_str or "", references


def _imports(client: SchemaRegistryClient, schema: Schema) -> list[tuple[str, str]]:
    """A Protobuf schema's references, and theirs, as (import name, base64 descriptor)."""
    found = []
    for reference in schema.references or []:
        version = client.get_version(reference.subject or "", reference.version or "latest", fmt="serialized")
        found += [(reference.name or "", version.schema.schema_str or ""), *_imports(client, version.schema)]
    return found
