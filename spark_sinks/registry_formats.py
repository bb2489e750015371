"""``value.format``/``key.format`` ``avro-registry``, ``protobuf-registry`` and ``json-registry``: Confluent's wire
format, written and read by confluent-kafka's own serializers and deserializers against a schema registry
(``schema.registry.url``; onceflow's own serves Confluent's API, docs/schemas.md), through
:mod:`onceflow.schemas.serdes`, which the Connect converters use too.

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

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import Message as ProtoMessage
from pyspark.sql import types as T

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.message import Message
from onceflow.schemas import serdes
from onceflow.spark_sinks import spark_types
from onceflow.spark_sinks.formats import REGISTRY_FORMATS

SCHEMA_TYPES = dict(zip(REGISTRY_FORMATS, (serdes.AVRO, serdes.JSON, serdes.PROTOBUF), strict=True))
_SCHEMA_OPTIONS = {"avro-registry": "avro.schema", "json-registry": "json.schema"}
_CODES = serdes.Codes(bad_value=ErrorCode.INVALID_RECORD, refused=ErrorCode.INVALID_CONFIG,
                      corrupt=ErrorCode.CORRUPT_MESSAGE)


@dataclasses.dataclass(frozen=True)
class RegistryFormat:
    """One side's (key or value) registry format, resolved on the driver; picklable, so Spark ships it to tasks."""

    name: str  # avro-registry, protobuf-registry or json-registry
    field: str  # "key" or "value"
    url: str
    subject: str
    schema: str  # read with: the option's schema, or the subject's latest version's (Protobuf: base64 descriptor)
    writer_schema: str  # Avro and JSON are written with: the latest version with use_latest, else the option's
    references: serdes.Imports  # Protobuf: (import name, base64 descriptor) for the schema's imports
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
        return None if value is None else self._write(value, topic)

    @functools.cached_property
    def _write(self) -> Callable[[Any, str], bytes | None]:
        """What ``to_bytes`` does with a value, made once per copy of the format (looking the serializer up by
        the format for every row hashed the format's eleven fields each time)."""
        serialize, prepare, key = _serializer(self), _preparer(self), self.field == "key"
        about = f"{self.field}.format {self.name}, subject {self.subject!r} at {self.url}"

        def write(value: Any, topic: str) -> bytes | None:
            return serdes.serialize(serialize, prepare(value), serdes.context(topic, key), _CODES,
                                    lambda: f"{topic}: {about}")

        return write

    def __getstate__(self) -> dict[str, Any]:
        """The fields alone: what ``_write`` made stays in the process that made it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_column(self, data: bytes | None, message: Message) -> Any:
        """The column's value for a record's bytes, read with the schema resolved on the driver."""
        if data is None:
            return None
        decoded = serdes.deserialize(_deserializer(self), data, serdes.context(message.topic() or "",
                                                                               self.field == "key"), _CODES,
                                     lambda: f"{message.topic()}[{message.partition()}]@{message.offset()}")
        return _column(self).apply(decoded)


# -- per Python worker: serdes per format (the registry client per URL is serdes') -------------------------------


@functools.cache
def _message_class(fmt: RegistryFormat) -> type[ProtoMessage]:
    return serdes.message_class(fmt.schema, fmt.references, fmt.message, f"onceflow: subject {fmt.subject!r}")


@functools.cache
def _column(fmt: RegistryFormat) -> spark_types.Column:
    if fmt.name == "protobuf-registry":
        return spark_types.protobuf_column(_message_class(fmt).DESCRIPTOR)
    parsed = json.loads(fmt.schema)
    return spark_types.avro_column(parsed) if fmt.name == "avro-registry" else spark_types.json_column(parsed)


@functools.cache
def _serializer(fmt: RegistryFormat) -> serdes.Serialize:
    """Avro and JSON: the latest version was resolved on the driver (``writer_schema``), so the serializer looks
    its id up once rather than the latest version (and its rules) for every record (twice as fast); Avro's
    records after the first are written as its serializer writes them, without its per-record machinery
    (:func:`serdes.avro_records`)."""
    conf = serdes.WriteConf(fmt.strategy, fmt.auto_register, use_latest=False)
    if fmt.name == "protobuf-registry":  # its schema is the message class's, built from the registered one
        return serdes.serializer(serdes.PROTOBUF, serdes.client(fmt.url), _message_class(fmt),
                                 dataclasses.replace(conf, use_latest=fmt.use_latest))
    serialize = serdes.serializer(SCHEMA_TYPES[fmt.name], serdes.client(fmt.url), fmt.writer_schema, conf)
    return serdes.avro_records(serialize, fmt.writer_schema) if fmt.name == "avro-registry" else serialize


@functools.cache
def _deserializer(fmt: RegistryFormat) -> serdes.Deserialize:
    schema = _message_class(fmt) if fmt.name == "protobuf-registry" else fmt.schema
    return serdes.deserializer(SCHEMA_TYPES[fmt.name], serdes.client(fmt.url), schema)


def _preparer(fmt: RegistryFormat) -> Callable[[Any], Any]:
    """What the serializer takes for a row's value: Avro the dict (a union's member struct as the branch its set
    member names), JSON plain JSON values, Protobuf a message."""
    if fmt.name == "avro-registry":
        prepare = _column(fmt).prepare  # None unless the schema has a union of several non-null types
        return prepare if prepare is not None else (lambda value: value)
    if fmt.name == "json-registry":
        return serdes.jsonable
    cls = _message_class(fmt)

    def message(value: Any) -> Any:
        try:
            return serdes.protobuf_message(cls, value)
        except serdes.BAD_VALUE as exc:
            fail(ErrorCode.INVALID_RECORD, f"a {fmt.field} does not fit the {fmt.name} schema of subject "
                 f"{fmt.subject!r}: {type(exc).__name__}: {exc}")

    return message


# -- on the driver: the options resolved -------------------------------------------------------------------------


def registry_format(name: str, field: str, topic: str, given: Mapping[str, str]) -> RegistryFormat:
    """``field``'s format ``name`` from the options, its subject and schema looked up in the registry;
    INVALID_CONFIG naming the option (or the subject) for anything wrong."""
    url = given.get("schema.registry.url")
    if not url:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: {field}.format {name!r} needs option 'schema.registry.url'")
    strategy = serdes.strategy_name(given.get(f"{field}.subject.name.strategy", "topic"),
                                    f"{field}.subject.name.strategy")
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
    record = message or serdes.record_name(SCHEMA_TYPES[name], given_schema, f"onceflow: option {option!r}")
    subject = serdes.STRATEGIES[strategy](serdes.context(topic, field == "key"), record)
    if subject is None:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: the {strategy} subject name strategy needs a record name: give "
             f"option {option!r}")
    found = (serdes.latest(serdes.client(url), url, subject, SCHEMA_TYPES[name])
             if use_latest or given_schema is None else None)
    schema, references = (given_schema, ()) if given_schema is not None else found or ("", ())
    writer_schema = found[0] if found and use_latest else schema
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
