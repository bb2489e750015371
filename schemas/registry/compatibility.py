"""Whether a new schema may follow a subject's earlier ones, per level: Avro's schema resolution rules here,
JSON Schema's and Protobuf's checks in their modules.

BACKWARD: the new schema reads data written with the latest one (``_TRANSITIVE``: with every earlier live
version); FORWARD: the earlier ones read data written with the new one; FULL: both; NONE: no check. Each
problem found is named (which field, which type, which symbol), as the registry's 409 message tells the user.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from onceflow.schemas.registry import json_schema, protobuf

LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
               ("float", "double"), ("string", "bytes"), ("bytes", "string")}  # (writer, reader)


def problems(level: str, schema_type: str, new: str, earlier: list[str]) -> list[str]:
    """What keeps schema ``new`` of ``schema_type`` from following ``earlier`` (oldest first, of the same type)
    at ``level``; [] if nothing."""
    if level == "NONE" or not earlier:
        return []
    check = _CHECKS[schema_type]
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    found: list[str] = []
    for old in against:
        if level.startswith(("BACKWARD", "FULL")):
            found += [f"reading data written with an earlier schema: {p}" for p in check(new, old)]
        if level.startswith(("FORWARD", "FULL")):
            found += [f"an earlier schema reading data written with this one: {p}" for p in check(old, new)]
        found += _EVOLUTION_CHECKS.get(schema_type, _none)(new, old)
    return found


def _none(new: str, old: str) -> list[str]:
    return []


def _avro(reader: str, writer: str) -> list[str]:
    return _Resolver().check(reader, writer)


class _Resolver:
    """Avro's schema resolution between a reader's and a writer's schema (the Avro specification's rules)."""

    def __init__(self) -> None:
        self._names: dict[str, dict[str, Any]] = {}
        self._in_progress: set[tuple[str, str]] = set()

    def check(self, reader: str, writer: str) -> list[str]:
        reader_schema, writer_schema = json.loads(reader), json.loads(writer)
        self._collect(reader_schema, "")
        self._collect(writer_schema, "")
        return self._problems(reader_schema, writer_schema, "")

    def _collect(self, schema: Any, namespace: str) -> None:
        """Remember every named type, so that a later mention by name resolves to it."""
        if isinstance(schema, list):
            for branch in schema:
                self._collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "error", "enum", "fixed"):
                namespace = schema.get("namespace", namespace)
                self._names.setdefault(_simple(schema["name"]), schema)
            for field in schema.get("fields", ()) if kind in ("record", "error") else ():
                self._collect(field["type"], namespace)
            for key in ("items", "values"):
                if key in schema:
                    self._collect(schema[key], namespace)
            if isinstance(kind, dict | list):
                self._collect(kind, namespace)

    def _resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return self._names.get(_simple(schema), schema)
        if isinstance(schema, dict) and (isinstance(schema.get("type"), dict | list) or
                                         schema.get("type") in _PRIMITIVES):
            return self._resolve(schema["type"])  # {"type": "int", "logicalType": ...} and nested type objects
        return schema

    def _problems(self, reader: Any, writer: Any, at: str) -> list[str]:
        reader, writer = self._resolve(reader), self._resolve(writer)
        if isinstance(writer, list):
            return [p for branch in writer for p in self._problems(reader, branch, at)]
        if isinstance(reader, list):
            if any(not self._problems(branch, writer, at) for branch in reader):
                return []
            return [f"{at or 'the value'}: the writer's {_kind(writer)} is in no branch of the reader's union"]
        reader_kind, writer_kind = _kind(reader), _kind(writer)
        if reader_kind != writer_kind:
            if (writer_kind, reader_kind) in _PROMOTIONS:
                return []
            return [f"{at or 'the value'}: the reader's type {reader_kind} cannot read the writer's {writer_kind}"]
        if reader_kind in ("record", "error"):
            return self._records(reader, writer, at)
        if reader_kind == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return [f"{at or reader['name']}: the reader's enum {reader['name']} lacks the symbols {missing}"]
        if reader_kind == "fixed" and reader.get("size") != writer.get("size"):
            return [f"{at or reader['name']}: fixed sizes differ ({writer.get('size')} written, "
                    f"{reader.get('size')} read)"]
        if reader_kind in ("array", "map"):
            key = "items" if reader_kind == "array" else "values"
            return self._problems(reader[key], writer[key], f"{at}[]" if at else "[]")
        return []

    def _records(self, reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
        if _simple(reader["name"]) != _simple(writer["name"]) and writer["name"] not in reader.get("aliases", ()):
            return [f"{at or 'the value'}: record {writer['name']} is read as record {reader['name']}"]
        pair = (reader["name"], writer["name"])
        if pair in self._in_progress:  # a recursive type: its fields are being checked further up
            return []
        self._in_progress.add(pair)
        written = {f["name"]: f for f in writer.get("fields", ())}
        found = []
        for field in reader.get("fields", ()):
            path = f"{at}.{field['name']}" if at else field["name"]
            source = next((written[n] for n in [field["name"], *field.get("aliases", ())] if n in written), None)
            if source is not None:
                found += self._problems(field["type"], source["type"], path)
            elif "default" not in field:
                found.append(f"{path}: the reader's field {field['name']!r} has no default and the writer has no "
                             "such field")
        self._in_progress.discard(pair)
        return found


def _kind(schema: Any) -> str:
    return schema if isinstance(schema, str) else str(schema.get("type"))


def _simple(name: str) -> str:
    return name.rsplit(".", 1)[-1]


_CHECKS: dict[str, Callable[[str, str], list[str]]] = {
    "AVRO": _avro, "JSON": json_schema.problems, "PROTOBUF": protobuf.problems}
_EVOLUTION_CHECKS: dict[str, Callable[[str, str], list[str]]] = {"PROTOBUF": protobuf.removed}  # in any direction
