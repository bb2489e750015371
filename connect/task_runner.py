"""What runs a task: a thread per task, its target state (running, paused, stopping) and the status it reports.

:class:`TaskRunner` is shared by the source and sink runners (:mod:`onceflow.connect.source_runner`,
:mod:`onceflow.connect.sink_runner`): the thread calls ``execute`` and reports FAILED with the traceback if it
raises; ``stop`` asks the loop to end after the current batch; ``pause`` makes it idle between batches.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from onceflow.connect.connector_config import ConnectorConfig
from onceflow.connect.converters import Converter
from onceflow.connect.offsets import OffsetStore
from onceflow.connect.plugins import Plugins
from onceflow.connect.status import State, Status, TaskId
from onceflow.connect.task import Task
from onceflow.connect.worker_config import WorkerConfig
from onceflow.connector.admin import AdminClient
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.topic import DEFAULT_NUM_PARTITIONS, NewTopic

log = logging.getLogger(__name__)

StatusListener = Callable[[TaskId, Status], None]
_PAUSED_WAIT_S = 0.1


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """What a worker gives each of its tasks."""

    config: WorkerConfig
    plugins: Plugins
    worker_id: str
    offsets: OffsetStore
    transactional_prefix: str  # a task's transactional.id is <prefix>-<connector>-<task>
    on_topic: Callable[[str, str], None]  # (connector, topic): a task used a topic

    def client_conf(self, client: str) -> dict[str, Any]:
        """A client config: the store, the transaction group (producers), and the worker's ``producer.`` or
        ``consumer.`` keys."""
        conf: dict[str, Any] = {"store.url": self.config.store_url}
        if client == "producer":
            conf["transaction.group"] = self.config["transaction.group"]
        return {**conf, **self.config.client_props(client)}

    def transactional_id(self, task: TaskId, config: ConnectorConfig) -> str | None:
        """The transactional.id of a task's producer: every sink task's (its batches are transactions), a source
        task's under exactly-once support; None when it has none (nothing to fence)."""
        if config.type == "source" and not (self.config.exactly_once and self.offsets.stream is not None):
            return None
        return f"{self.transactional_prefix}-{task.connector}-{task.task}"

    def converter(self, connector: ConnectorConfig, which: str) -> Converter:
        """The connector's key or value converter (``which``), configured from its config or else the worker's."""
        own = connector.get(f"{which}.converter")
        name = own or self.config[f"{which}.converter"]
        props = connector.converter_props(which) if own else self.config.converter_props(which)
        converter = self.plugins.converter(name)()
        converter.configure(props, which == "key")
        return converter


class TaskRunner(abc.ABC):
    """A task in its thread; see the module docstring."""

    def __init__(self, task_id: TaskId, task: Task, task_config: Mapping[str, str], config: ConnectorConfig,
                 worker: WorkerContext, listener: StatusListener) -> None:
        self.id = task_id
        self.task = task
        self.task_config = dict(task_config)
        self.config = config
        self.worker = worker
        self._listener = listener
        self._stopping = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"connect-task-{task_id}", daemon=True)
        self.state = State.UNASSIGNED
        self._admin: AdminClient | None = None
        self._topics: set[str] = set()
        self._used: set[str] = set()

    def start(self, paused: bool = False) -> None:
        if paused:
            self._paused.set()
        self._thread.start()

    def pause(self) -> None:
        self._paused.set()
        if self.state is State.RUNNING:
            self._report(State.PAUSED)

    def resume(self) -> None:
        self._paused.clear()
        if self.state is State.PAUSED:
            self._report(State.RUNNING)

    def stop(self) -> None:
        """Ask the task to stop after its current batch (returns at once; see :meth:`join`)."""
        self._stopping.set()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end; False if it is still running after ``timeout_s``."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def where(self) -> str:
        """Where the task's thread is now (its stack), for a task that does not stop."""
        frame = sys._current_frames().get(self._thread.ident or 0)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(ended)"

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_while_paused(self) -> bool:
        """Idle while paused; True once it may go on, False if it is stopping."""
        while self._paused.is_set() and not self._stopping.is_set():
            self.on_pause()
            self._stopping.wait(_PAUSED_WAIT_S)
        return not self._stopping.is_set()

    def on_pause(self) -> None:  # noqa: B027 - an optional hook
        """Called repeatedly while paused: commit what is pending, so a pause never holds a transaction open."""

    def _run(self) -> None:
        try:
            self.execute()
        except BaseException as exc:  # every failure becomes the task's FAILED status with its trace
            log.error("task %s failed", self.id, exc_info=True)
            self._report(State.FAILED, "".join(traceback.format_exception(exc)))
        else:
            self._report(State.UNASSIGNED)

    def running(self) -> None:
        """The task started: report RUNNING (or PAUSED)."""
        self._report(State.PAUSED if self._paused.is_set() else State.RUNNING)

    def _report(self, state: State, trace: str | None = None) -> None:
        self.state = state
        self._listener(self.id, Status(state, self.worker.worker_id, self.task.version(), trace))

    def ensure_topic(self, topic: str) -> None:
        """Create a missing topic (as a broker's auto-creation would: one partition), once per topic per task."""
        if topic in self._topics:
            return
        if self._admin is None:
            self._admin = AdminClient({"store.url": self.worker.config.store_url})
        try:
            self._admin.create_topics([NewTopic(topic, DEFAULT_NUM_PARTITIONS)])[topic].result()
        except KafkaException as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
        self._topics.add(topic)

    def used_topic(self, topic: str) -> None:
        """Report that this task reads or writes ``topic`` (``GET /connectors/{name}/topics``)."""
        if topic not in self._used:
            self._used.add(topic)
            self.worker.on_topic(self.id.connector, topic)

    @abc.abstractmethod
    def execute(self) -> None:
        """Run the task until it is stopped (or fails)."""
