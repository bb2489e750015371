"""The options of ``format("onceflow")``: Spark hands them over as strings; they are checked here, once, with
errors that name the option (INVALID_CONFIG)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from onceflow.connector.config import DEFAULT_STORE_URL
from onceflow.connector.errors import ErrorCode, fail
from onceflow.spark_sinks.formats import FORMATS, REGISTRY_FORMATS, Format, RawKey, ValueFormat, value_format
from onceflow.spark_sinks.registry_formats import registry_format

_KNOWN = {
    "store.url", "topic", "sink.id", "job.id", "transaction.group", "transaction.timeout.ms", "key.column",
    "value.column", "headers.column", "partition.column", "value.format", "avro.schema", "avro.schema.path",
    "max.records.per.batch", "path", "key.format", "schema.registry.url", "value.subject.name.strategy",
    "key.subject.name.strategy", "auto.register.schemas", "use.latest.version", "json.schema", "protobuf.message",
    "key.avro.schema", "key.json.schema", "key.protobuf.message",
}
KEY_FORMATS = ("bytes", "string", *REGISTRY_FORMATS)
_SPARKS_OWN = {"checkpointlocation", "queryname", "paths"}  # Spark passes these to every data source


@dataclasses.dataclass(frozen=True)
class OnceflowOptions:
    """What the sink and the source need, typed."""

    store_url: str
    topic: str
    sink_id: str | None
    job_id: str | None
    transaction_group: str | None
    transaction_timeout_ms: int
    key_column: str
    value_column: str
    headers_column: str
    partition_column: str
    value_format: Format
    key_format: Format
    max_records_per_batch: int | None

    @property
    def group_name(self) -> str:
        """The transaction group the sink's transactions run in (by default one per sink id or topic)."""
        return self.transaction_group or f"spark-{self.sink_id or self.topic.replace('.', '_')}"


def parse(options: Mapping[str, str]) -> OnceflowOptions:
    """Check and type the options; INVALID_CONFIG naming the option for anything wrong."""
    given = {k.lower(): v for k, v in options.items()}
    unknown = sorted(k for k in set(given) - _KNOWN - _SPARKS_OWN if not k.startswith("spark."))
    if unknown:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: unknown option(s) {unknown}; known: {sorted(_KNOWN)}")
    topic = given.get("topic") or given.get("path")
    if not topic:
        fail(ErrorCode.INVALID_CONFIG, "onceflow: option 'topic' is required (the stream to write or read)")
    return OnceflowOptions(
        store_url=given.get("store.url", DEFAULT_STORE_URL),
        topic=topic,
        sink_id=given.get("sink.id") or None,
        job_id=given.get("job.id") or None,
        transaction_group=given.get("transaction.group") or None,
        transaction_timeout_ms=_positive_int(given, "transaction.timeout.ms", None) or 3_600_000,
        key_column=given.get("key.column", "key"),
        value_column=given.get("value.column", "value"),
        headers_column=given.get("headers.column", "headers"),
        partition_column=given.get("partition.column", "partition"),
        value_format=_value_format(given, topic),
        key_format=_key_format(given, topic),
        max_records_per_batch=_positive_int(given, "max.records.per.batch", None),
    )


def _value_format(given: Mapping[str, str], topic: str) -> Format:
    name, avro_schema = given.get("value.format", "bytes").lower(), _avro_schema(given)
    if name in REGISTRY_FORMATS:  # avro.schema.path read as avro.schema
        return registry_format(name, "value", topic, {**given, **({"avro.schema": avro_schema} if avro_schema else {})})
    return value_format(name, avro_schema)


def _key_format(given: Mapping[str, str], topic: str) -> Format:
    name = given.get("key.format", "bytes").lower()
    if name not in KEY_FORMATS:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: key.format must be one of {list(KEY_FORMATS)}, got {name!r}")
    if name in REGISTRY_FORMATS:
        return registry_format(name, "key", topic, given)
    return RawKey() if name == "bytes" else ValueFormat("string")


def _positive_int(given: Mapping[str, str], name: str, default: None) -> int | None:
    raw = given.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option {name!r} must be a whole number, got {raw!r}")
    if value <= 0:
        fail(ErrorCode.INVALID_CONFIG, f"onceflow: option {name!r} must be positive, got {value}")
    return value


def _avro_schema(given: Mapping[str, str]) -> str | None:
    inline, path = given.get("avro.schema"), given.get("avro.schema.path")
    if inline and path:
        fail(ErrorCode.INVALID_CONFIG, "onceflow: give 'avro.schema' or 'avro.schema.path', not both")
    if path:
        try:
            return Path(path).read_text()
        except OSError as exc:
            fail(ErrorCode.INVALID_CONFIG, f"onceflow: option 'avro.schema.path': cannot read {path!r}: {exc}")
    if given.get("value.format", "bytes").lower() == "avro" and not inline:
        fail(ErrorCode.INVALID_CONFIG, "onceflow: value.format 'avro' needs 'avro.schema' (inline JSON) or "
             f"'avro.schema.path'; formats: {sorted(FORMATS + REGISTRY_FORMATS)}")
    return inline
