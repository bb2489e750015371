"""A connector's transforms, configured from its config and applied in order (with their predicates)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TypeVar

from onceflow.connect.connector_config import ConnectorConfig
from onceflow.connect.error_handling import ErrorHandler, Skipped
from onceflow.connect.plugins import Plugins, prefixed
from onceflow.connect.records import ConnectRecord
from onceflow.connect.transform import Predicate, Transformation

R = TypeVar("R", bound=ConnectRecord)
_OWN_KEYS = ("type", "predicate", "negate")


@dataclasses.dataclass(frozen=True)
class _Step:
    alias: str
    plugin: str
    transform: Transformation
    predicate: Predicate | None
    negate: bool


class TransformationChain:
    """The ``transforms`` of a connector config; a record dropped by one is not seen by the next."""

    def __init__(self, plugins: Plugins, config: ConnectorConfig) -> None:
        predicates: dict[str, Predicate] = {}
        for alias, class_name in config.predicates.items():
            predicate = plugins.predicate(class_name)()
            predicate.configure({k: v for k, v in prefixed(config.props, f"predicates.{alias}.").items()
                                 if k != "type"})
            predicates[alias] = predicate
        self._steps: list[_Step] = []
        for alias, class_name in config.transforms.items():
            transform = plugins.transformation(class_name)()
            own = prefixed(config.props, f"transforms.{alias}.")
            transform.configure({k: v for k, v in own.items() if k not in _OWN_KEYS})
            selector = predicates.get(own.get("predicate", "")) if own.get("predicate") else None
            self._steps.append(_Step(alias, class_name, transform, selector,
                                     own.get("negate", "false").lower() == "true"))

    def apply(self, record: R, errors: ErrorHandler) -> R | None:
        """The record after every transform that applies to it, or None once one drops it (or fails and the
        failure is tolerated)."""
        current: R | None = record
        for step in self._steps:
            if current is None:
                return None
            if step.predicate is not None and step.predicate.test(current) == step.negate:
                continue
            result = errors.run("TRANSFORMATION", step.plugin, functools.partial(step.transform.apply, current),
                                record)
            current = None if isinstance(result, Skipped) else result
        return current

    def close(self) -> None:
        for step in self._steps:
            step.transform.close()
            if step.predicate is not None:
                step.predicate.close()
