"""The worker: runs the connectors and tasks a herder gives it, in this process, and reports their statuses.

Connector instances run in the caller's thread (``start``, ``task_configs``, ``stop`` are quick); each task runs
in a thread of its own (:mod:`onceflow.connect.task_runner`). A connector or task that fails is reported FAILED
with its trace; the failure never escapes to the caller, as in Kafka Connect (creating a connector whose
``start`` raises succeeds, and its status says why it failed).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping

from onceflow.connect.connector import Connector, ConnectorContext, SourceConnector
from onceflow.connect.connector_config import ConnectorConfig
from onceflow.connect.sink_runner import SinkTaskRunner
from onceflow.connect.source_runner import SourceTaskRunner
from onceflow.connect.status import State, Status, TargetState, TaskId
from onceflow.connect.task import SinkTask, SourceTask
from onceflow.connect.task_runner import TaskRunner, WorkerContext
from onceflow.connector.errors import KafkaException
from onceflow.connector.producer import Producer

log = logging.getLogger(__name__)

ConnectorListener = Callable[[str, Status], None]
TaskListener = Callable[[TaskId, Status], None]
_ABANDONED_WAIT_S = 60


class _Context(ConnectorContext):
    def __init__(self, worker: Worker, name: str, reconfigure: Callable[[str], None]) -> None:
        self._worker, self._name, self._reconfigure = worker, name, reconfigure

    def request_task_reconfiguration(self) -> None:
        threading.Thread(target=self._reconfigure, args=(self._name,), daemon=True).start()

    def raise_error(self, error: Exception) -> None:
        self._worker.connector_failed(self._name, error)


def task_class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Worker:
    """Connectors and tasks running here; see the module docstring."""

    def __init__(self, context: WorkerContext, on_connector: ConnectorListener, on_task: TaskListener,
                 fence_abandoned: bool = True) -> None:
        self.context = context
        # Fence a task that outlives its graceful stop (standalone: its id may never start again). Not on a
        # distributed worker: there a slot's new owner fences it as it starts, and the publisher of new task configs
        # fences the changed ones; a late fence here would fence the new owner's healthy instance.
        self._fence_abandoned = fence_abandoned
        self._on_connector = on_connector
        self._on_task = on_task
        self._lock = threading.RLock()
        self._connectors: dict[str, tuple[Connector, ConnectorConfig]] = {}
        self._tasks: dict[TaskId, TaskRunner] = {}
        self._abandoned: dict[TaskId, TaskRunner] = {}  # stopped, but still ending (e.g. in a slow fencing call)

    @property
    def worker_id(self) -> str:
        return self.context.worker_id

    # -- connectors -------------------------------------------------------------------------------------------

    def start_connector(self, config: ConnectorConfig, target: TargetState,
                        reconfigure: Callable[[str], None]) -> bool:
        """Start a connector (STOPPED: only report it so); False if it failed (its status says why)."""
        with self._lock:
            self.stop_connector(config.name)
            if target is TargetState.STOPPED:
                self._report(config.name, State.STOPPED, config)
                return True
            connector = self.context.plugins.connector(config.connector_class)()
            try:
                connector.initialize(_Context(self, config.name, reconfigure))
                connector.start(config.props)
            except Exception as exc:
                self._report(config.name, State.FAILED, config, "".join(traceback.format_exception(exc)))
                return False
            self._connectors[config.name] = (connector, config)
            self._report(config.name, State.PAUSED if target is TargetState.PAUSED else State.RUNNING, config)
            return True

    def task_configs(self, name: str) -> list[dict[str, str]] | None:
        """The running connector's task configs (each with ``task.class``); None if it is not running or fails."""
        with self._lock:
            running = self._connectors.get(name)
            if running is None:
                return None
            connector, config = running
            try:
                configs = connector.task_configs(config.tasks_max)
            except Exception as exc:
                self.connector_failed(name, exc)
                return None
            task_class = task_class_name(connector.task_class())
            return [{**c, "task.class": task_class} for c in configs[: config.tasks_max]]

    def set_connector_target(self, name: str, target: TargetState) -> None:
        with self._lock:
            running = self._connectors.get(name)
            if running is not None:
                self._report(name, State.PAUSED if target is TargetState.PAUSED else State.RUNNING, running[1])

    def stop_connector(self, name: str) -> None:
        with self._lock:
            running = self._connectors.pop(name, None)
        if running is not None:
            try:
                running[0].stop()
            except Exception:  # the connector is gone either way; its failure to stop is only logged
                log.error("connector %s failed to stop", name, exc_info=True)

    def connector_failed(self, name: str, error: BaseException) -> None:
        with self._lock:
            running = self._connectors.pop(name, None)
        if running is not None:
            self._report(name, State.FAILED, running[1], "".join(traceback.format_exception(error)))

    def running_connectors(self) -> list[str]:
        with self._lock:
            return sorted(self._connectors)

    def _report(self, name: str, state: State, config: ConnectorConfig, trace: str | None = None) -> None:
        version = self._version(config)
        self._on_connector(name, Status(state, self.worker_id, version, trace))

    def _version(self, config: ConnectorConfig) -> str:
        desc = self.context.plugins.find(config.connector_class)
        return desc.version if desc is not None else ""

    # -- tasks ------------------------------------------------------------------------------------------------

    def start_task(self, task_id: TaskId, config: ConnectorConfig, task_config: Mapping[str, str],
                   target: TargetState) -> None:
        """Start a task in its thread (PAUSED: started, idle); a task that cannot even be made is FAILED."""
        with self._lock:
            self.stop_tasks([task_id])
            previous = self._abandoned.pop(task_id, None)
            if previous is not None and not previous.join(_ABANDONED_WAIT_S):
                log.error("task %s: the previous instance has not ended after %ss; starting anyway (it is fenced "
                          "by the new one, unless it fences it first)", task_id, _ABANDONED_WAIT_S)
            connector = self.context.plugins.connector(config.connector_class)
            try:
                task_cls = connector().task_class()
                task = task_cls()
                runner_cls: type[TaskRunner] = (SourceTaskRunner if issubclass(connector, SourceConnector)
                                                else SinkTaskRunner)
                if not isinstance(task, SourceTask if runner_cls is SourceTaskRunner else SinkTask):
                    raise TypeError(f"{task_class_name(task_cls)} is not a {config.type} task")
            except Exception as exc:
                self._on_task(task_id, Status(State.FAILED, self.worker_id, self._version(config),
                                              "".join(traceback.format_exception(exc))))
                return
            runner = runner_cls(task_id, task, task_config, config, self.context, self._on_task)
            self._tasks[task_id] = runner
            self._on_task(task_id, Status(State.UNASSIGNED, self.worker_id, task.version()))
            runner.start(paused=target is TargetState.PAUSED)

    def set_task_target(self, task_id: TaskId, target: TargetState) -> None:
        with self._lock:
            runner = self._tasks.get(task_id)
        if runner is not None:
            (runner.pause if target is TargetState.PAUSED else runner.resume)()

    def stop_tasks(self, task_ids: list[TaskId]) -> None:
        """Stop these tasks (all at once) and wait for them, up to ``task.shutdown.graceful.timeout.ms`` in all."""
        with self._lock:
            runners = [self._tasks.pop(t) for t in task_ids if t in self._tasks]
        for runner in runners:
            runner.stop()
        deadline = time.monotonic() + self.context.config["task.shutdown.graceful.timeout.ms"] / 1000
        for runner in runners:
            if not runner.join(max(0.0, deadline - time.monotonic())):
                log.warning("task %s did not stop within task.shutdown.graceful.timeout.ms; a new instance waits "
                            "for it to end. It is at:\n%s", runner.id, runner.where())
                with self._lock:
                    self._abandoned[runner.id] = runner
                if not self._fence_abandoned:
                    continue
                try:
                    self.fence_tasks([runner.id], runner.config)
                except KafkaException as exc:  # (the worker may be stopping with its store unreachable)
                    log.error("task %s could not be fenced (%s): it may commit until it ends", runner.id, exc)

    def fence_tasks(self, task_ids: list[TaskId], config: ConnectorConfig) -> None:
        """Fence every instance of these tasks, on whichever worker it still runs (Kafka Connect's zombie fencing,
        KIP-618): a transaction it has open aborts, and its next commit fails (PRODUCER_FENCED). Before a task's
        partitions go to other tasks, or its id is dropped: else an instance still running commits records whose
        source offsets another task already resumed from."""
        for task_id in task_ids:
            transactional_id = self.context.transactional_id(task_id, config)
            if transactional_id is None:
                continue
            producer = Producer({**self.context.client_conf("producer"), "transactional.id": transactional_id})
            try:
                producer.init_transactions()
            finally:
                producer.close()

    def running_tasks(self, connector: str | None = None) -> list[TaskId]:
        with self._lock:
            return sorted(t for t in self._tasks if connector is None or t.connector == connector)

    def stop(self) -> None:
        """Stop every task and connector."""
        self.stop_tasks(self.running_tasks())
        for name in self.running_connectors():
            self.stop_connector(name)
