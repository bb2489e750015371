"""Connectors: a connector splits its job into task configs; its tasks move the data (:mod:`onceflow.connect.task`).

Mirrors Kafka Connect's ``Connector``/``SourceConnector``/``SinkConnector``: the worker calls ``start(props)``
with the connector's config, ``task_configs(max_tasks)`` for the configs of at most ``tasks.max`` tasks,
``stop()`` when the connector is paused, reconfigured, moved or deleted. ``config()`` declares the keys the
connector takes; ``validate`` may add checks across keys.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, ConfigValue

if TYPE_CHECKING:
    from onceflow.connect.task import Task


class ConnectorContext(abc.ABC):
    """What a connector may ask of its worker."""

    @abc.abstractmethod
    def request_task_reconfiguration(self) -> None:
        """Ask the worker to call ``task_configs`` again (the source's shape changed) and restart the tasks."""

    @abc.abstractmethod
    def raise_error(self, error: Exception) -> None:
        """Fail the connector with ``error`` (its status becomes FAILED with the trace)."""


class Connector(abc.ABC):
    """A plugin that configures tasks. Subclass :class:`SourceConnector` or :class:`SinkConnector`."""

    context: ConnectorContext

    def initialize(self, context: ConnectorContext) -> None:
        self.context = context

    @abc.abstractmethod
    def version(self) -> str:
        """The plugin's version (shown by ``GET /connector-plugins`` and in status)."""

    @abc.abstractmethod
    def start(self, props: Mapping[str, str]) -> None:
        """Start with the connector's config (strings, as the user wrote them)."""

    @abc.abstractmethod
    def task_class(self) -> type[Task]:
        """The task class that runs this connector's work."""

    @abc.abstractmethod
    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        """A config per task, at most ``max_tasks`` of them."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release what ``start`` took."""

    @abc.abstractmethod
    def config(self) -> ConfigDef:
        """The keys this connector takes."""

    def validate(self, props: Mapping[str, str]) -> dict[str, ConfigValue]:
        """Every declared key's value and errors; override to add checks that span several keys."""
        return self.config().validate_all(props)


class ExactlyOnceSupport(enum.Enum):
    """A source connector's answer to "can you provide exactly-once with this config?" (KIP-618)."""

    SUPPORTED = "SUPPORTED"
    UNSUPPORTED = "UNSUPPORTED"


class SourceConnector(Connector):
    """A connector whose tasks read from an outside system into streams."""

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport | None:
        """SUPPORTED if the tasks' source offsets let them resume exactly where a committed transaction ended;
        None if the connector does not say (``exactly.once.support=required`` then refuses it)."""
        return None

    def can_define_transaction_boundaries(self, props: Mapping[str, str]) -> bool:
        """True if its tasks commit and abort through their ``TransactionContext``
        (``transaction.boundary=connector``)."""
        return False

    def alter_offsets(self, props: Mapping[str, str], offsets: Mapping[str, Any]) -> bool:
        """Check (or act on) offsets a user writes with ``PATCH /connectors/{name}/offsets``; raise to refuse
        them. True if the connector handled them; the worker writes them either way."""
        return False


class SinkConnector(Connector):
    """A connector whose tasks consume streams (``topics`` or ``topics.regex``) into an outside system."""

    def alter_offsets(self, props: Mapping[str, str], offsets: Mapping[Any, int | None]) -> bool:
        """As :meth:`SourceConnector.alter_offsets`, for consumed offsets."""
        return False


class SameConfig(Connector):
    """A connector whose tasks each take its whole config: ``tasks.max`` of them, or one if ``one_task``. Mix it
    in before :class:`SourceConnector` or :class:`SinkConnector`; ``start`` checks the config against ``config()``."""

    one_task = False

    def __init__(self) -> None:
        self._props: dict[str, str] = {}

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self.config().parse(props)
        self._props = dict(props)

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [dict(self._props) for _ in range(1 if self.one_task else max_tasks)]

    def stop(self) -> None:
        """Nothing to release: the tasks do the work."""
