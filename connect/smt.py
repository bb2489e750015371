"""Kafka Connect's single message transforms and predicates, under their Kafka class names and keys.

``InsertField$Key|$Value`` (``topic.field``, ``partition.field``, ``offset.field``, ``timestamp.field``,
``static.field``/``static.value``), ``ReplaceField$Key|$Value`` (``exclude``, ``include``, ``renames``),
``Cast$Key|$Value`` (``spec``: ``int32`` for the whole key or value, or ``field:type,...``), ``TimestampRouter``
(``topic.format``, ``timestamp.format``), ``RegexRouter`` (``regex``, ``replacement``), ``Filter`` (drops every
record it is applied to: give it a predicate), and the predicates ``HasHeaderKey`` (``name``),
``TopicNameMatches`` (``pattern``), ``RecordIsTombstone``.

Structs are dicts; a transform that changes a struct's fields changes its schema alike (a schemaless value keeps
no schema). A value a transform cannot handle (a field transform given a string) raises INVALID_RECORD, which
``errors.tolerance`` applies to.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, TypeVar

from onceflow.connect.config_def import ConfigDef, Importance, Type, invalid, non_empty, regex
from onceflow.connect.records import ConnectRecord, Field, Schema, SinkRecord, replaced
from onceflow.connect.transform import Predicate, Transformation
from onceflow.connector.errors import ErrorCode, fail

R = TypeVar("R", bound=ConnectRecord)
CASTS = ("int8", "int16", "int32", "int64", "float32", "float64", "boolean", "string")


class _Part(Transformation):
    """A transform of the key (``$Key``) or the value (``$Value``) of a record."""

    of_key = False

    def part(self, record: ConnectRecord) -> tuple[Schema | None, Any]:
        return (record.key_schema, record.key) if self.of_key else (record.value_schema, record.value)

    def with_part(self, record: R, schema: Schema | None, value: Any) -> R:
        if self.of_key:
            return replaced(record, key_schema=schema, key=value)  # type: ignore[no-any-return]
        return replaced(record, value_schema=schema, value=value)  # type: ignore[no-any-return]

    def struct(self, record: ConnectRecord) -> tuple[Schema | None, dict[str, Any] | None]:
        """The part as a struct (a dict); None for a tombstone; INVALID_RECORD for anything else."""
        schema, value = self.part(record)
        if value is None:
            return schema, None
        if not isinstance(value, dict):
            fail(ErrorCode.INVALID_RECORD, f"{type(self).__name__}: the record's {'key' if self.of_key else 'value'} "
                 f"is a {type(value).__name__}, not a struct or map (topic {record.topic})")
        return schema, value


def _with_fields(schema: Schema | None, fields: list[Field]) -> Schema | None:
    return None if schema is None else dataclasses.replace(schema, fields=tuple(fields))


class InsertField(_Part):
    """Adds the record's topic, partition, offset (sinks), timestamp or a static value as fields."""

    def config(self) -> ConfigDef:
        d = ConfigDef()
        for name, what in (("topic", "topic"), ("partition", "partition"), ("offset", "offset (sink records)"),
                           ("timestamp", "timestamp")):
            d.define(f"{name}.field", Type.STRING, None, None, Importance.MEDIUM,
                     f"Field name for the record's {what}; suffix with ! to make it required, ? optional (default)")
        d.define("static.field", Type.STRING, None, None, Importance.MEDIUM, "Field name for a static value")
        d.define("static.value", Type.STRING, None, None, Importance.MEDIUM, "The static field's value")
        return d

    def apply(self, record: R) -> R | None:
        schema, value = self.struct(record)
        if value is None:
            return record
        additions = {
            "topic.field": (record.topic, "string"), "partition.field": (record.kafka_partition, "int32"),
            "offset.field": (record.kafka_offset if isinstance(record, SinkRecord) else None, "int64"),
            "timestamp.field": (record.timestamp, "int64"), "static.field": (self.settings["static.value"], "string"),
        }
        out, fields = dict(value), list(schema.fields) if schema is not None else []
        for key, (inserted, kind) in additions.items():
            spec = self.settings[key]
            if spec:
                name = spec.rstrip("!?")
                out[name] = inserted
                fields.append(Field(name, Schema(kind, optional=not spec.endswith("!"))))
        return self.with_part(record, _with_fields(schema, fields), out)


def _renames(name: str, value: list[str]) -> None:
    bad = [r for r in value if len(r.split(":")) != 2 or not all(r.split(":"))]
    if bad:
        raise invalid(name, value, f"Invalid rename mapping: {bad[0]}")


class ReplaceField(_Part):
    """Drops (``exclude``), keeps only (``include``) and renames (``renames``: ``old:new,...``) fields."""

    def config(self) -> ConfigDef:
        return (ConfigDef()
                .define("exclude", Type.LIST, "", None, Importance.MEDIUM, "Fields to exclude")
                .define("include", Type.LIST, "", None, Importance.MEDIUM, "Fields to include (all if empty)")
                .define("renames", Type.LIST, "", _renames, Importance.MEDIUM, "Field rename mappings (old:new)"))

    def configure(self, props: Any) -> None:
        super().configure(props)
        self._renames = dict(r.split(":", 1) for r in self.settings["renames"])

    def _kept(self, name: str) -> bool:
        include = self.settings["include"]
        return name not in self.settings["exclude"] and (not include or name in include)

    def apply(self, record: R) -> R | None:
        schema, value = self.struct(record)
        if value is None:
            return record
        out = {self._renames.get(k, k): v for k, v in value.items() if self._kept(k)}
        fields = [Field(self._renames.get(f.name, f.name), f.schema) for f in (schema.fields if schema else ())
                  if self._kept(f.name)]
        return self.with_part(record, _with_fields(schema, fields), out)


def _cast(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "string":
        return str(value).lower() if isinstance(value, bool) else str(value)
    if kind == "boolean":
        return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1")
    number = float(value) if kind.startswith("float") else int(float(value)) if isinstance(value, str) else int(value)
    return number


def _cast_spec(name: str, value: list[str]) -> None:
    """A type for the whole value, or field:type pairs, of the types Cast knows."""
    if not value:
        raise invalid(name, value, "Must specify at least one field to cast.")
    whole = len(value) == 1 and ":" not in value[0]
    kinds = value if whole else [s.split(":", 1)[1] if ":" in s else s for s in value]
    bad = [k for k in kinds if k not in CASTS] + [s for s in value if not whole and ":" not in s]
    if bad:
        raise invalid(name, value, f"Cast transformations only support the types {', '.join(CASTS)} ({bad[0]!r})")


class Cast(_Part):
    """Casts the whole key or value (``spec=int64``) or some fields (``spec=id:int64,price:float64``)."""

    def config(self) -> ConfigDef:
        return ConfigDef().define("spec", Type.LIST, validator=_cast_spec, importance=Importance.HIGH,
                                  documentation="List of fields and the type to cast them to of the form "
                                                "field1:type,field2:type to cast fields of Maps or Structs. A "
                                                "single type to cast the entire value.")

    def configure(self, props: Any) -> None:
        super().configure(props)
        spec = self.settings["spec"]
        self._whole = spec[0] if len(spec) == 1 and ":" not in spec[0] else None
        self._fields = {} if self._whole else dict(s.split(":", 1) for s in spec)

    def apply(self, record: R) -> R | None:
        try:
            if self._whole is not None:
                return self.with_part(record, Schema(self._whole, optional=True), _cast(self.part(record)[1],
                                                                                         self._whole))
            struct_schema, struct = self.struct(record)
            if struct is None:
                return record
            out = {k: _cast(v, self._fields[k]) if k in self._fields else v for k, v in struct.items()}
        except (ValueError, TypeError) as exc:
            fail(ErrorCode.INVALID_RECORD, f"Cast: {exc} (topic {record.topic})")
        fields = [Field(f.name, Schema(self._fields[f.name], f.schema.optional)) if f.name in self._fields else f
                  for f in (struct_schema.fields if struct_schema else ())]
        return self.with_part(record, _with_fields(struct_schema, fields), out)


_JAVA_DATE = [("yyyy", "%Y"), ("yy", "%y"), ("MM", "%m"), ("dd", "%d"), ("HH", "%H"), ("mm", "%M"), ("ss", "%S")]


def java_date(pattern: str, when: datetime.datetime) -> str:
    """``when`` as a SimpleDateFormat pattern of the common letters (yyyy yy MM dd HH mm ss SSS) writes it."""
    out = pattern.replace("%", "%%").replace("SSS", f"{when.microsecond // 1000:03d}")
    for java, python in _JAVA_DATE:
        out = out.replace(java, python)
    return when.strftime(out)


class TimestampRouter(Transformation):
    """Routes a record to a topic named from its topic and timestamp (``${topic}-${timestamp}``)."""

    def config(self) -> ConfigDef:
        return (ConfigDef()
                .define("topic.format", Type.STRING, "${topic}-${timestamp}", non_empty, Importance.HIGH,
                        "Format string which can contain ${topic} and ${timestamp}")
                .define("timestamp.format", Type.STRING, "yyyyMMdd", non_empty, Importance.HIGH,
                        "Format string for the timestamp (SimpleDateFormat's yyyy MM dd HH mm ss SSS)"))

    def apply(self, record: R) -> R | None:
        if record.timestamp is None:
            fail(ErrorCode.INVALID_RECORD, f"Timestamp missing on record: topic {record.topic}")
        when = datetime.datetime.fromtimestamp(record.timestamp / 1000, tz=datetime.UTC)
        stamp = java_date(self.settings["timestamp.format"], when)
        topic = self.settings["topic.format"].replace("${topic}", record.topic).replace("${timestamp}", stamp)
        return replaced(record, topic=topic)  # type: ignore[no-any-return]


class RegexRouter(Transformation):
    """Renames the topic when it matches ``regex`` wholly; ``replacement`` may use ``$1``, ... (Java's)."""

    def config(self) -> ConfigDef:
        return (ConfigDef()
                .define("regex", Type.STRING, validator=regex, importance=Importance.HIGH,
                        documentation="Regular expression to use for matching.")
                .define("replacement", Type.STRING, importance=Importance.HIGH, documentation="Replacement string."))

    def configure(self, props: Any) -> None:
        super().configure(props)
        self._pattern = re.compile(self.settings["regex"])
        self._replacement = re.sub(r"\$(\d+)", r"\\g<\1>", self.settings["replacement"])

    def apply(self, record: R) -> R | None:
        if not self._pattern.fullmatch(record.topic):
            return record
        return replaced(record, topic=self._pattern.sub(self._replacement, record.topic, count=1))  # type: ignore[no-any-return]


class Filter(Transformation):
    """Drops every record it applies to (with a predicate: the records the predicate matches)."""

    def config(self) -> ConfigDef:
        return ConfigDef()

    def apply(self, record: R) -> R | None:
        return None


class HasHeaderKey(Predicate):
    """True for records with at least one header named ``name``."""

    def config(self) -> ConfigDef:
        return ConfigDef().define("name", Type.STRING, validator=non_empty, importance=Importance.MEDIUM,
                                  documentation="The header name.")

    def test(self, record: ConnectRecord) -> bool:
        return any(key == self.settings["name"] for key, _ in record.headers)


class TopicNameMatches(Predicate):
    """True for records whose topic matches ``pattern`` wholly."""

    def config(self) -> ConfigDef:
        return ConfigDef().define("pattern", Type.STRING, validator=regex, importance=Importance.MEDIUM,
                                  documentation="A Java regular expression for matching against the name of a "
                                                "record's topic.")

    def test(self, record: ConnectRecord) -> bool:
        return re.fullmatch(self.settings["pattern"], record.topic) is not None


class RecordIsTombstone(Predicate):
    """True for records whose value is null."""

    def config(self) -> ConfigDef:
        return ConfigDef()

    def test(self, record: ConnectRecord) -> bool:
        return record.value is None


class InsertFieldKey(InsertField):
    of_key = True


class InsertFieldValue(InsertField):
    pass


class ReplaceFieldKey(ReplaceField):
    of_key = True


class ReplaceFieldValue(ReplaceField):
    pass


class CastKey(Cast):
    of_key = True


class CastValue(Cast):
    pass
