"""Plugins: connectors, converters, transforms and predicates, found only through installed entry points.

Every plugin is an entry point of the group ``onceflow.connect.plugins`` whose name is its class name, e.g.::

    [project.entry-points."onceflow.connect.plugins"]
    "com.example.MySourceConnector" = "my_package.source:MySourceConnector"

A config names a plugin by that class name or by an alias, as in Kafka Connect: its simple name
(``FileStreamSourceConnector``) and, for a connector, the simple name without ``Connector``
(``FileStreamSource``); an alias two plugins share is not an alias. A config can name nothing else (never an
import path), so a REST request cannot make a worker import arbitrary code. ``plugin.path`` adds directories
whose installed distributions' entry points count too (``pip install --target DIR``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from onceflow import __version__
from onceflow.connect.connector import Connector, SinkConnector, SourceConnector
from onceflow.connect.converters import Converter
from onceflow.connect.transform import Predicate, Transformation
from onceflow.connector.errors import ErrorCode, fail

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "onceflow.connect.plugins"
KINDS: tuple[tuple[type, str], ...] = ((SourceConnector, "source"), (SinkConnector, "sink"),
                                       (Converter, "converter"), (Transformation, "transformation"),
                                       (Predicate, "predicate"))


@dataclasses.dataclass(frozen=True)
class PluginDesc:
    """An installed plugin: its class name, kind (Kafka's names: source, sink, converter, transformation,
    predicate), version and class."""

    class_name: str
    kind: str
    version: str
    cls: type

    def info(self) -> dict[str, str]:
        """Kafka Connect's ``PluginInfo`` JSON."""
        return {"class": self.class_name, "type": self.kind, "version": self.version}


def _kind(cls: Any) -> str | None:
    return next((kind for base, kind in KINDS if isinstance(cls, type) and issubclass(cls, base)), None)


def _version(cls: type) -> str:
    if issubclass(cls, Connector):
        try:
            return cls().version()
        except Exception:  # a plugin that cannot be made without arguments still lists
            log.warning("plugin %s: version() failed", cls.__name__, exc_info=True)
    return str(getattr(cls, "VERSION", __version__))


def _entry_points(plugin_path: Sequence[str]) -> list[importlib.metadata.EntryPoint]:
    """Entry points of the group installed in the interpreter and in each ``plugin.path`` directory."""
    found = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for directory in plugin_path:
        if directory not in sys.path:
            sys.path.append(directory)
        for dist in importlib.metadata.distributions(path=[directory]):
            found.extend(ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP)
    return found


class Plugins:
    """The plugins a worker can run, and how names in configs resolve to them."""

    def __init__(self, plugin_path: Sequence[str] = (), extra: Iterable[tuple[str, type]] = ()) -> None:
        """``extra``: (class name, class) pairs an embedding application registers in code, beside the entry
        points (how tests register theirs)."""
        self._descs: dict[str, PluginDesc] = {}
        for ep in _entry_points(plugin_path):
            try:
                self._add(ep.name, ep.load())
            except Exception:  # one broken plugin must not stop the worker; it is reported and left out
                log.error("plugin %s (%s) cannot be loaded; left out", ep.name, ep.value, exc_info=True)
        for name, cls in extra:
            self._add(name, cls)
        self._aliases = self._alias_table()

    def _add(self, name: str, cls: Any) -> None:
        kind = _kind(cls)
        if kind is None:
            log.error("plugin %s is a %r, not a connector, converter, transformation or predicate; left out", name,
                      cls)
            return
        self._descs[name] = PluginDesc(name, kind, _version(cls), cls)

    def _alias_table(self) -> dict[str, str]:
        candidates: dict[str, set[str]] = {}
        for desc in self._descs.values():
            simple = desc.class_name.rsplit(".", 1)[-1]
            names = {simple}
            if desc.kind in ("source", "sink") and simple.endswith("Connector") and simple != "Connector":
                names.add(simple.removesuffix("Connector"))
            for alias in names:
                candidates.setdefault(alias, set()).add(desc.class_name)
        return {alias: next(iter(owners)) for alias, owners in candidates.items()
                if len(owners) == 1 and alias not in self._descs}

    def all(self) -> list[PluginDesc]:
        """Every plugin, in Kafka's listing order: sinks, sources, transforms, predicates, converters."""
        order = {"sink": 0, "source": 1, "transformation": 2, "predicate": 3, "converter": 4}
        return sorted(self._descs.values(), key=lambda d: (order[d.kind], d.class_name))

    def connectors(self) -> list[PluginDesc]:
        return [d for d in self.all() if d.kind in ("source", "sink")]

    def find(self, name: str) -> PluginDesc | None:
        """The plugin ``name`` (a class name or an alias) names, or None."""
        return self._descs.get(name) or self._descs.get(self._aliases.get(name, ""))

    def connector(self, name: str) -> type[Connector]:
        """The connector class ``name`` names; INVALID_CONFIG listing the installed ones if none."""
        desc = self.find(name)
        if desc is None or desc.kind not in ("source", "sink"):
            fail(ErrorCode.INVALID_CONFIG, f"Failed to find any class that implements Connector and which name "
                 f"matches {name}, available connectors are: {', '.join(d.class_name for d in self.connectors())}")
        cls: type[Connector] = desc.cls
        return cls

    def converter(self, name: str) -> type[Converter]:
        cls: type[Converter] = self._of(name, "converter")
        return cls

    def transformation(self, name: str) -> type[Transformation]:
        cls: type[Transformation] = self._of(name, "transformation")
        return cls

    def predicate(self, name: str) -> type[Predicate]:
        cls: type[Predicate] = self._of(name, "predicate")
        return cls

    def names(self, kind: str) -> list[str]:
        """Class names of every plugin of a kind (``recommended_values`` in validation)."""
        return [d.class_name for d in self.all() if d.kind == kind]

    def _of(self, name: str, kind: str) -> type:
        desc = self.find(name)
        if desc is None or desc.kind != kind:
            fail(ErrorCode.INVALID_CONFIG, f"Class {name} cannot be found: no installed {kind} plugin is named so "
                 f"(installed: {', '.join(self.names(kind)) or 'none'})")
        return desc.cls


def prefixed(props: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The keys of ``props`` that start with ``prefix``, without it (a converter's or transform's own keys)."""
    return {k[len(prefix):]: v for k, v in props.items() if k.startswith(prefix)}
