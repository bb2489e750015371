"""The states of connectors and tasks and how they are reported, in Kafka Connect's words and JSON shapes.

A connector's target state (what the user asked: RUNNING, PAUSED, STOPPED) is part of its config; its status
(what it is doing: UNASSIGNED, RUNNING, PAUSED, STOPPED, FAILED with a trace, RESTARTING) is reported by the
worker that runs it, with that worker's id.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any, NamedTuple


class State(enum.Enum):
    UNASSIGNED = "UNASSIGNED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    RESTARTING = "RESTARTING"
    DESTROYED = "DESTROYED"


class TargetState(enum.Enum):
    """What a user asked a connector to be (``initial_state`` on creation, pause, resume, stop)."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"


class TaskId(NamedTuple):
    connector: str
    task: int

    def __str__(self) -> str:
        return f"{self.connector}-{self.task}"

    def info(self) -> dict[str, Any]:
        return {"connector": self.connector, "task": self.task}


@dataclasses.dataclass(frozen=True)
class Status:
    """One connector's or task's reported state."""

    state: State
    worker_id: str
    version: str
    trace: str | None = None
    generation: int = 0

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.value, "worker_id": self.worker_id}
        if self.trace is not None:
            out["trace"] = self.trace
        out["version"] = self.version
        return out


class StatusBoard:
    """The statuses this process knows, thread-safe (standalone: all of them; distributed: its view)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connectors: dict[str, Status] = {}
        self._tasks: dict[TaskId, Status] = {}
        self._topics: dict[str, set[str]] = {}

    def put_connector(self, name: str, status: Status) -> None:
        with self._lock:
            self._connectors[name] = status

    def put_task(self, task: TaskId, status: Status) -> None:
        with self._lock:
            self._tasks[task] = status

    def connector(self, name: str) -> Status | None:
        with self._lock:
            return self._connectors.get(name)

    def task(self, task: TaskId) -> Status | None:
        with self._lock:
            return self._tasks.get(task)

    def tasks(self, connector: str) -> dict[TaskId, Status]:
        with self._lock:
            return {t: s for t, s in self._tasks.items() if t.connector == connector}

    def forget_tasks(self, connector: str) -> None:
        """Drop the statuses of a connector's tasks (they were stopped; new ones report afresh)."""
        with self._lock:
            for task in [t for t in self._tasks if t.connector == connector]:
                del self._tasks[task]

    def forget(self, connector: str) -> None:
        """Drop a deleted connector's statuses and topics."""
        self.forget_tasks(connector)
        with self._lock:
            self._connectors.pop(connector, None)
            self._topics.pop(connector, None)

    def add_topic(self, connector: str, topic: str) -> None:
        """A connector's task used a topic (Kafka Connect's topic tracking)."""
        with self._lock:
            self._topics.setdefault(connector, set()).add(topic)

    def topics(self, connector: str) -> list[str]:
        with self._lock:
            return sorted(self._topics.get(connector, ()))

    def reset_topics(self, connector: str) -> None:
        with self._lock:
            self._topics.pop(connector, None)
