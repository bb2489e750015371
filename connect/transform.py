"""Single message transforms and predicates: the plugin API (Kafka Connect's ``Transformation`` and ``Predicate``).

A connector config lists ``transforms=a,b`` and configures each as ``transforms.a.type=<class>`` plus
``transforms.a.<key>=...``; ``transforms.a.predicate=p`` (with ``predicates.p.type=...``) applies ``a`` only to
records ``p`` matches (``transforms.a.negate=true``: those it does not). A transform returning None drops the
record. Source records are transformed before they are converted, sink records after.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, TypeVar

from onceflow.connect.config_def import ConfigDef
from onceflow.connect.records import ConnectRecord

R = TypeVar("R", bound=ConnectRecord)


class _Plugin(abc.ABC):
    """What transforms and predicates share: a declared config, parsed into :attr:`settings`."""

    settings: dict[str, Any]
    """The parsed config (:meth:`configure` sets it)."""

    def configure(self, props: Mapping[str, str]) -> None:
        self.settings = self.config().parse(props)

    @abc.abstractmethod
    def config(self) -> ConfigDef: ...

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the plugin holds (nothing by default)."""


class Transformation(_Plugin):
    """Changes, reroutes or drops one record at a time."""

    @abc.abstractmethod
    def apply(self, record: R) -> R | None:
        """The transformed record (of the same record type), or None to drop it."""


class Predicate(_Plugin):
    """Decides whether a transform applies to a record."""

    @abc.abstractmethod
    def test(self, record: ConnectRecord) -> bool: ...
