"""``ConfigDef``: a plugin's declared configuration, checked as Kafka Connect checks it.

A connector, task, converter or transformation declares each key it takes (type, default, validator, docs,
group); the worker parses a config against that declaration before anything starts, and
``PUT /connector-plugins/{plugin}/config/validate`` reports every problem of a config at once, in Kafka
Connect's JSON shape and with its messages ("Invalid value x for configuration tasks.max: Not a number of type
INT"). Values arrive as strings (Java properties, REST bodies) and are parsed to Python types.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail


class Type(enum.Enum):
    """A key's type, with Kafka's names (shown by the REST API)."""

    BOOLEAN = "BOOLEAN"
    STRING = "STRING"
    INT = "INT"
    SHORT = "SHORT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    LIST = "LIST"
    CLASS = "CLASS"
    PASSWORD = "PASSWORD"


class Importance(enum.Enum):
    HIGH = "HIGH"
    MEDIUM = "MEDIUM"
    LOW = "LOW"


class Width(enum.Enum):
    NONE = "NONE"
    SHORT = "SHORT"
    MEDIUM = "MEDIUM"
    LONG = "LONG"


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()
"""The default of a required key."""

_INT_RANGES = {Type.SHORT: 2**15, Type.INT: 2**31, Type.LONG: 2**63}

Validator = Callable[[str, Any], None]
"""Checks a parsed value; raises INVALID_CONFIG (with :func:`invalid`) when it is not acceptable."""


def invalid(name: str, value: Any, why: str) -> KafkaException:
    """Kafka's message for a value a key does not accept (to raise)."""
    shown = "null" if value is None else ",".join(value) if isinstance(value, list) else value
    return KafkaException(KafkaError(ErrorCode.INVALID_CONFIG, f"Invalid value {shown} for configuration {name}: "
                                                               f"{why}"))


def at_least(minimum: int | float) -> Validator:
    """Kafka's ``Range.atLeast``."""
    def check(name: str, value: Any) -> None:
        if value is not None and value < minimum:
            raise invalid(name, value, f"Value must be at least {minimum}")
    return check


def between(minimum: int | float, maximum: int | float) -> Validator:
    """Kafka's ``Range.between``."""
    def check(name: str, value: Any) -> None:
        if value is not None and not minimum <= value <= maximum:
            raise invalid(name, value, f"Value must be between {minimum} and {maximum}")
    return check


def one_of(*allowed: str, case_sensitive: bool = False) -> Validator:
    """Kafka's ``ValidString.in`` (case-insensitive, as ``CaseInsensitiveValidString``, unless asked)."""
    def check(name: str, value: Any) -> None:
        if value is None:
            return
        known = allowed if case_sensitive else tuple(a.lower() for a in allowed)
        if (value if case_sensitive else str(value).lower()) not in known:
            raise invalid(name, value, f"String must be one of: {', '.join(allowed)}")
    return check


def non_empty(name: str, value: Any) -> None:
    """Kafka's ``NonEmptyString``."""
    if value is not None and not str(value).strip():
        raise invalid(name, value, "String may not be empty")


def regex(name: str, value: Any) -> None:
    """A Java-compatible regular expression (Python's syntax)."""
    if value:
        try:
            re.compile(value)
        except re.error as exc:
            raise invalid(name, value, f"not a valid regular expression: {exc}") from None


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One declared key."""

    name: str
    type: Type
    default: Any
    validator: Validator | None
    importance: Importance
    documentation: str
    group: str | None
    order_in_group: int
    width: Width
    display_name: str
    dependents: tuple[str, ...] = ()
    recommender: Callable[[], list[str]] | None = None

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def info(self) -> dict[str, Any]:
        """Kafka Connect's ``ConfigKeyInfo`` JSON."""
        return {"name": self.name, "type": self.type.value, "required": self.required,
                "default_value": None if self.required else render(self.type, self.default),
                "importance": self.importance.value, "documentation": self.documentation, "group": self.group,
                "order_in_group": self.order_in_group, "width": self.width.value, "display_name": self.display_name,
                "dependents": list(self.dependents)}


@dataclasses.dataclass
class ConfigValue:
    """One key's value as validated: Kafka Connect's ``ConfigValueInfo``."""

    name: str
    value: Any = None
    recommended_values: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    visible: bool = True

    def info(self, type_: Type | None) -> dict[str, Any]:
        return {"name": self.name, "value": None if self.value is None else render(type_, self.value),
                "recommended_values": list(self.recommended_values), "errors": list(self.errors),
                "visible": self.visible}


def render(type_: Type | None, value: Any) -> str | None:
    """A parsed value as the string Kafka shows (lists comma-joined, booleans lower case)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if type_ is Type.PASSWORD:
        return "[hidden]"
    return str(value)


def parse_value(key: ConfigKey, raw: Any) -> Any:
    """``raw`` (usually a string) as ``key``'s type; INVALID_CONFIG in Kafka's words if it is not one."""
    if raw is None:
        return None
    kind = key.type
    if kind is Type.BOOLEAN:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise invalid(key.name, raw, "Expected value to be either true or false")
    if kind in _INT_RANGES:
        return _parse_int(key, raw)
    if kind is Type.DOUBLE:
        try:
            return float(str(raw).strip())
        except ValueError:
            raise invalid(key.name, raw, "Not a number of type DOUBLE") from None
    if kind is Type.LIST:
        if isinstance(raw, list | tuple):
            return [str(v).strip() for v in raw]
        text = str(raw).strip()
        return [part.strip() for part in text.split(",")] if text else []
    return str(raw).strip() if kind is not Type.PASSWORD else str(raw)


def _parse_int(key: ConfigKey, raw: Any) -> int:
    if isinstance(raw, bool):
        raise invalid(key.name, raw, f"Not a number of type {key.type.value}")
    try:
        number = raw if isinstance(raw, int) else int(str(raw).strip())
    except ValueError:
        raise invalid(key.name, raw, f"Not a number of type {key.type.value}") from None
    limit = _INT_RANGES[key.type]
    if not -limit <= number < limit:
        raise invalid(key.name, raw, f"Not a number of type {key.type.value}")
    return number


class ConfigDef:
    """Declared keys, in declaration order; ``define`` chains, as Kafka's."""

    def __init__(self, keys: Iterable[ConfigKey] = ()) -> None:
        self._keys: dict[str, ConfigKey] = {}
        for key in keys:
            self._add(key)

    def define(self, name: str, type_: Type, default: Any = NO_DEFAULT, validator: Validator | None = None,
               importance: Importance = Importance.MEDIUM, documentation: str = "", *, group: str | None = None,
               order_in_group: int = -1, width: Width = Width.NONE, display_name: str | None = None,
               recommender: Callable[[], list[str]] | None = None) -> ConfigDef:
        """Declare a key; ``default`` is a raw value (a string as a user would write it) or a parsed one."""
        key = ConfigKey(name, type_, default, validator, importance, documentation, group, order_in_group, width,
                        display_name or name, recommender=recommender)
        if default is not NO_DEFAULT and default is not None:
            key = dataclasses.replace(key, default=parse_value(key, default))
        self._add(key)
        return self

    def _add(self, key: ConfigKey) -> None:
        if key.name in self._keys:
            fail(ErrorCode.INVALID_CONFIG, f"Configuration {key.name} is defined twice.")
        self._keys[key.name] = key

    def merged(self, other: ConfigDef) -> ConfigDef:
        """A new definition with this one's keys, then ``other``'s (a key in both keeps this one's)."""
        merged = ConfigDef(self._keys.values())
        for key in other.config_keys().values():
            if key.name not in merged._keys:
                merged._add(key)
        return merged

    def config_keys(self) -> dict[str, ConfigKey]:
        return dict(self._keys)

    def groups(self) -> list[str]:
        """Group names in the order their first key was declared."""
        return list(dict.fromkeys(k.group for k in self._keys.values() if k.group is not None))

    def parse(self, props: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared key's parsed value; the first problem (Kafka's order) raises INVALID_CONFIG naming its
        key. Undeclared keys are left alone (a connector's config carries the worker's keys too)."""
        values = self.validate_all(props)
        for value in values.values():
            if value.errors:
                fail(ErrorCode.INVALID_CONFIG, value.errors[0])
        return {name: value.value for name, value in values.items()}

    def validate_all(self, props: Mapping[str, Any]) -> dict[str, ConfigValue]:
        """Each declared key's value and every error found in it, nothing raised."""
        values: dict[str, ConfigValue] = {}
        for key in self._keys.values():
            value = values[key.name] = ConfigValue(key.name)
            if key.recommender is not None:
                value.recommended_values = key.recommender()
            try:
                value.value = self._value(key, props)
            except KafkaException as exc:
                value.errors.append(exc.error.str())
        return values

    def _value(self, key: ConfigKey, props: Mapping[str, Any]) -> Any:
        if key.name in props:
            parsed = parse_value(key, props[key.name])
        elif key.required:
            fail(ErrorCode.INVALID_CONFIG, f'Missing required configuration "{key.name}" which has no default value.')
        else:
            parsed = key.default
        if key.validator is not None:
            key.validator(key.name, parsed)
        return parsed

    def infos(self) -> list[dict[str, Any]]:
        """Kafka Connect's ``ConfigKeyInfo`` list (``GET /connector-plugins/{plugin}/config``)."""
        return [key.info() for key in self._keys.values()]
