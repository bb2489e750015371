"""How a task's failures are handled: ``errors.retry.timeout``, ``errors.tolerance``, ``errors.log.enable`` and (for
sinks) the dead letter queue, as Kafka Connect's ``RetryWithToleranceOperator``.

Each step of a record's way through the worker is a *stage* (Kafka's names: ``KEY_CONVERTER``, ``VALUE_CONVERTER``,
``TRANSFORMATION``, ``TASK_POLL``, ``TASK_PUT``). A retriable failure (``KafkaError.retriable()``) is retried with
growing pauses until ``errors.retry.timeout`` (0: never, -1: forever). A failure that remains, in a converter or a
transform, skips the record under ``errors.tolerance=all`` (and reaches the dead letter queue of a sink); under
``none`` it fails the task ("Tolerance exceeded in error handler"). A task's own ``poll``/``put`` failures are never
tolerated: they fail the task (a sink task reports bad records through its ``ErrantRecordReporter`` instead).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from onceflow.connect.connector_config import ConnectorConfig
from onceflow.connect.status import TaskId
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException

log = logging.getLogger(__name__)

T = TypeVar("T")
TOLERABLE_STAGES = frozenset({"KEY_CONVERTER", "VALUE_CONVERTER", "HEADER_CONVERTER", "TRANSFORMATION"})
_FIRST_BACKOFF_S = 0.3


@dataclasses.dataclass(frozen=True)
class Failure:
    """A record that failed at a stage, with the error and the plugin class that raised it."""

    stage: str
    plugin: str
    error: BaseException
    record: Any


class Skipped:
    """The result of an operation whose failure was tolerated: the record is dropped."""


SKIPPED = Skipped()


class ErrorHandler:
    """Runs a task's stages with its connector's error settings; see the module docstring."""

    def __init__(self, config: ConnectorConfig, task: TaskId, stopping: threading.Event,
                 report: Callable[[Failure], None] | None = None) -> None:
        self._task = task
        self._tolerate_all = config.get("errors.tolerance") == "all"
        self._retry_timeout_ms = int(config.get("errors.retry.timeout") or 0)
        self._max_delay_s = int(config.get("errors.retry.delay.max.ms") or 60_000) / 1000
        self._log_errors = bool(config.get("errors.log.enable"))
        self._log_messages = bool(config.get("errors.log.include.messages"))
        self._stopping = stopping
        self._report = report
        self.skipped = 0

    def run(self, stage: str, plugin: str, operation: Callable[[], T], record: Any = None) -> T | Skipped:
        """``operation``'s result; SKIPPED if it failed and the failure is tolerated; else the failure raises."""
        try:
            return self.retrying(operation)
        except Exception as exc:
            if stage not in TOLERABLE_STAGES:
                raise
            self.report(Failure(stage, plugin, exc, record))
            return SKIPPED

    def report(self, failure: Failure) -> None:
        """A record failed: tolerate it (log, dead letter queue) under ``errors.tolerance=all``, else raise."""
        if not self._tolerate_all:
            raise KafkaException(KafkaError(ErrorCode._FAIL, f"Tolerance exceeded in error handler: "
                                            f"{failure.stage} ({failure.plugin}) failed: {failure.error}")) \
                from failure.error
        self._tolerated(failure)

    def retrying(self, operation: Callable[[], T]) -> T:
        """``operation``, retried while it fails retriably and ``errors.retry.timeout`` allows."""
        deadline = (float("inf") if self._retry_timeout_ms < 0
                    else time.monotonic() + self._retry_timeout_ms / 1000)
        pause = _FIRST_BACKOFF_S
        while True:
            try:
                return operation()
            except KafkaException as exc:
                if not exc.error.retriable() or time.monotonic() + pause > deadline or self._stopping.is_set():
                    raise
                log.info("task %s: retriable failure, retrying in %.1fs: %s", self._task, pause, exc)
                self._stopping.wait(pause)
                pause = min(pause * 2, self._max_delay_s)

    def _tolerated(self, failure: Failure) -> None:
        self.skipped += 1
        if self._log_errors:
            detail = f" record: {failure.record!r}" if self._log_messages else ""
            log.error("task %s: error at stage %s (%s), record skipped (errors.tolerance=all): %s%s", self._task,
                      failure.stage, failure.plugin, failure.error, detail)
        if self._report is not None:
            self._report(failure)
