"""JSON Schema evolutions: whether every document one schema accepts, another accepts too.

The check walks both schemas side by side: types (an integer is a number), enums, an object's required and
declared properties and whether it is closed (``additionalProperties: false``), array items, and the bounds of
strings and numbers. A writer whose content model is open may write properties it does not declare; like
Confluent's own checker in its lenient mode, such undeclared properties are not held against a reader.
"""

from __future__ import annotations

import json
from typing import Any

from onceflow.schemas.registry.errors import RegistryError

_UPPER_BOUNDS = ("maxLength", "maximum", "maxItems")
_LOWER_BOUNDS = ("minLength", "minimum", "minItems")


def check_schema(parsed: Any) -> None:
    """42201 unless ``parsed`` is a JSON Schema its own draft (``$schema``, else the latest) accepts."""
    if isinstance(parsed, bool):  # true accepts every document, false none
        return
    if not isinstance(parsed, dict):
        raise RegistryError(42201, "Invalid schema: a JSON Schema is an object or a boolean")
    import jsonschema  # here, not at the top: ~80 ms that every CLI command and worker would pay at start

    try:
        jsonschema.validators.validator_for(parsed).check_schema(parsed)
    except jsonschema.SchemaError as exc:
        raise RegistryError(42201, f"Invalid schema: {exc.message} at {list(exc.path)}") from exc


def problems(reader: str, writer: str) -> list[str]:
    """Why some document that JSON Schema ``writer`` accepts is refused by ``reader``; [] if none is."""
    return _problems(json.loads(reader), json.loads(writer), "")


def _problems(reader: Any, writer: Any, at: str) -> list[str]:
    where = at or "the document"
    if reader is True or writer is False or reader == writer:
        return []
    if reader is False or writer is True:
        return [f"{where}: the reader accepts less than the writer's {'anything' if writer is True else 'schema'}"]
    found = _types(reader, writer, where) + _enum(reader, writer, where) + _bounds(reader, writer, where)
    if "items" in reader and isinstance(reader["items"], dict | bool):
        found += _problems(reader["items"], writer.get("items", True), f"{at}[]" if at else "[]")
    return found + _object(reader, writer, at)


def _types(reader: dict[str, Any], writer: dict[str, Any], where: str) -> list[str]:
    wanted = _type_set(reader)
    if wanted is None:
        return []
    written = _type_set(writer)
    if written is None:
        return [f"{where}: the reader takes only {sorted(wanted)}, the writer any type"]
    refused = sorted(t for t in written if t not in wanted and not (t == "integer" and "number" in wanted))
    return [f"{where}: the reader's types {sorted(wanted)} refuse the writer's {refused}"] if refused else []


def _type_set(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    return None if kind is None else {kind} if isinstance(kind, str) else set(kind)


def _enum(reader: dict[str, Any], writer: dict[str, Any], where: str) -> list[str]:
    if "enum" not in reader:
        return []
    missing = [v for v in writer.get("enum", [None]) if v not in reader["enum"]] if "enum" in writer else None
    if missing is None:
        return [f"{where}: the reader takes only the values {reader['enum']}, the writer any"]
    return [f"{where}: the reader's enum lacks the writer's values {missing}"] if missing else []


def _bounds(reader: dict[str, Any], writer: dict[str, Any], where: str) -> list[str]:
    found = []
    for key in _UPPER_BOUNDS + _LOWER_BOUNDS:
        if key in reader and not (key in writer and _within(key, writer[key], reader[key])):
            found.append(f"{where}: the reader's {key} {reader[key]} is narrower than the writer's "
                         f"{writer.get(key, 'none')}")
    return found


def _within(key: str, written: Any, read: Any) -> bool:
    return bool(written <= read) if key in _UPPER_BOUNDS else bool(written >= read)


def _object(reader: dict[str, Any], writer: dict[str, Any], at: str) -> list[str]:
    read, written = reader.get("properties", {}), writer.get("properties", {})
    found = [f"{_path(at, name)}: the reader requires property {name!r}, which the writer may leave out"
             for name in reader.get("required", []) if name not in writer.get("required", [])]
    extra = reader.get("additionalProperties", True)
    if extra is False and writer.get("additionalProperties", True) is not False:
        found.append(f"{at or 'the document'}: the reader is closed (additionalProperties false), the writer open")
    for name, schema in written.items():
        if name not in read and extra is False:
            found.append(f"{_path(at, name)}: the writer's property {name!r} is not allowed by the closed reader")
        else:
            found += _problems(read.get(name, extra), schema, _path(at, name))
    return found


def _path(at: str, name: str) -> str:
    return f"{at}.{name}" if at else name
