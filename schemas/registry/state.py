"""A registry's content, rebuilt by replaying the records of its stream: every subject's versions and every schema
by id, the compatibility levels. Replaying is deterministic, so every registry process reading the same stream
holds the same ids and versions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import fastavro

from onceflow.schemas.registry import json_schema, protobuf
from onceflow.schemas.registry.errors import RegistryError, subject_not_found

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
DEFAULT_COMPATIBILITY = "BACKWARD"  # Confluent's default
MODES = ("READWRITE", "READONLY")


@dataclasses.dataclass(frozen=True)
class SchemaText:
    """A schema as stored: its type, its canonical text (compact JSON) and the references it names."""

    schema_type: str
    schema: str
    references: tuple[tuple[str, str, int], ...] = ()  # (name, subject, version)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self.schema}
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in self.references]
        return out


@dataclasses.dataclass
class Version:
    version: int
    schema_id: int
    deleted: bool = False


def canonical(schema_type: str, text: str, references: tuple[tuple[str, str, int], ...],
              imports: Mapping[str, str]) -> SchemaText:
    """The stored form of a schema (``imports``: its references' schemas by name); RegistryError 42201 if it is
    not one (nothing is stored then)."""
    if schema_type not in SCHEMA_TYPES:
        raise RegistryError(42201, f"Invalid schema type {schema_type!r}: this registry knows {list(SCHEMA_TYPES)}")
    if schema_type == "PROTOBUF":
        return SchemaText(schema_type, protobuf.canonical(text, imports), references)
    try:
        parsed = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise RegistryError(42201, f"Invalid schema: not JSON ({exc})") from exc
    if schema_type == "AVRO" and not references:
        try:
            fastavro.parse_schema(parsed, _write_hint=False)
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise RegistryError(42201, f"Invalid schema: {exc}") from exc
    elif schema_type == "JSON":
        json_schema.check_schema(parsed)
    return SchemaText(schema_type, json.dumps(parsed, separators=(",", ":")), references)


class RegistryState:
    """Subjects, versions, schemas and compatibility levels, as the records applied so far say."""

    def __init__(self) -> None:
        self.schemas: dict[int, SchemaText] = {}
        self.subjects: dict[str, list[Version]] = {}
        self.compatibility: dict[str | None, str] = {}  # None: the registry's own level
        self.modes: dict[str | None, str] = {}  # None: the registry's own mode

    def apply(self, record: dict[str, Any]) -> None:
        op = record["op"]
        if op == "register":
            text = SchemaText(record["schemaType"], record["schema"],
                              tuple((n, s, v) for n, s, v in record.get("references", ())))
            self.schemas.setdefault(record["id"], text)
            self.subjects.setdefault(record["subject"], []).append(Version(record["version"], record["id"]))
        elif op == "delete":
            versions = self.subjects.get(record["subject"], [])
            chosen = [v for v in versions if record.get("version") in (None, v.version)]
            if record["permanent"]:
                self.subjects[record["subject"]] = [v for v in versions if v not in chosen]
            for v in chosen:
                v.deleted = True
        elif op == "config":
            self.compatibility[record["subject"]] = record["compatibility"]
        elif op == "mode":
            self.modes[record["subject"]] = record["mode"]

    def id_of(self, text: SchemaText) -> int | None:
        return next((i for i, s in self.schemas.items() if s == text), None)

    def next_id(self) -> int:
        return max(self.schemas, default=0) + 1

    def live_versions(self, subject: str, deleted: bool = False) -> list[Version]:
        """A subject's versions (soft-deleted ones too with ``deleted``); 40401 if it has none."""
        versions = [v for v in self.subjects.get(subject, []) if deleted or not v.deleted]
        if not versions:
            raise subject_not_found(subject)
        return versions

    def version(self, subject: str, version: str | int) -> Version:
        """``version`` of ``subject``: a number, or ``latest`` / -1; 40402 or 42202 if there is none such."""
        versions = self.live_versions(subject)
        if version in ("latest", "-1", -1):
            return versions[-1]
        try:
            number = int(version)
        except ValueError:
            raise RegistryError(42202, f"The specified version '{version}' is not a valid version id. Allowed "
                                "values are between [1, 2^31-1] and the string \"latest\"") from None
        if number < 1:
            raise RegistryError(42202, f"The specified version '{version}' is not a valid version id.")
        found = next((v for v in versions if v.version == number), None)
        if found is None:
            raise RegistryError(40402, f"Version {number} not found.")
        return found

    def level(self, subject: str | None) -> str:
        """The compatibility level that applies to ``subject`` (its own, else the registry's)."""
        return self.compatibility.get(subject) or self.compatibility.get(None) or DEFAULT_COMPATIBILITY

    def mode(self, subject: str | None) -> str:
        """The mode that applies to ``subject`` (its own, else the registry's)."""
        return self.modes.get(subject) or self.modes.get(None) or MODES[0]

    def schema(self, schema_id: int) -> SchemaText:
        found = self.schemas.get(schema_id)
        if found is None:
            raise RegistryError(40403, f"Schema {schema_id} not found")
        return found
