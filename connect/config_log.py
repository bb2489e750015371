"""The config stream of a distributed worker group (``config.storage.topic``), as Kafka Connect's config topic.

One partition of keyed JSON records, read from its start by every worker: ``connector-<name>``
(``{"properties": {...}, "slot": n}``; null: deleted), ``target-state-<name>`` (``{"state": "PAUSED"}``),
``tasks-<name>`` (``{"tasks": [{...}, ...]}``: every task config of a connector at once) and ``restart-<name>``
(``{"include_tasks": ..., "only_failed": ..., "task": n|null}``: an order to the workers running it).

Every change is a CAS append at the end the writer read (``expected_offset``): of two workers changing configs at
once exactly one lands first, and the other reads it and applies its change again on top, so any worker can take
any request (none is forwarded to a leader) and no change is lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from onceflow.connect.status import TargetState
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store import Record, Store, Writer

log = logging.getLogger(__name__)

SLOTS = 64
"""Partitions of the slots stream: each connector and task runs on the worker that owns its slot."""
_CAS_ATTEMPTS = 50

Change = tuple[str, dict[str, Any] | None]


@dataclasses.dataclass(frozen=True)
class Restart:
    """A restart order read from the log: of a connector (and its tasks), or of one task."""

    offset: int
    connector: str
    include_tasks: bool
    only_failed: bool
    task: int | None


@dataclasses.dataclass
class ClusterState:
    """What the config stream says up to where it was read."""

    connectors: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    slots: dict[str, int] = dataclasses.field(default_factory=dict)
    targets: dict[str, TargetState] = dataclasses.field(default_factory=dict)
    tasks: dict[str, list[dict[str, str]]] = dataclasses.field(default_factory=dict)
    next_slot: int = 0

    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        kind, _, name = key.partition("-")
        if key.startswith("target-state-"):
            name = key.removeprefix("target-state-")
            if value is None:
                self.targets.pop(name, None)
            else:
                self.targets[name] = TargetState(value["state"])
        elif kind == "connector":
            if value is None:
                for table in (self.connectors, self.slots, self.tasks, self.targets):
                    table.pop(name, None)
            else:  # every field read before anything changes: a record that cannot be read is skipped whole
                properties, slot, width = dict(value["properties"]), int(value["slot"]), int(value.get("width", 1))
                self.connectors[name] = properties
                self.slots[name] = slot
                self.next_slot = max(self.next_slot, slot + width)
        elif kind == "tasks" and name in self.connectors:
            self.tasks[name] = [dict(t) for t in (value or {}).get("tasks", [])]

    def copy(self) -> ClusterState:
        """A copy that later applies leave as it is (they replace a connector's properties and task list, never
        edit them, so the tables' values can be shared)."""
        return ClusterState(dict(self.connectors), dict(self.slots), dict(self.targets), dict(self.tasks),
                            self.next_slot)

    def connector_slot(self, name: str) -> int:
        return self.slots[name] % SLOTS

    def task_slot(self, name: str, task: int) -> int:
        return (self.slots[name] + 1 + task) % SLOTS


class ConfigLog:
    """Reads the config stream into a :class:`ClusterState` and appends changes with CAS; see the module."""

    def __init__(self, store: Store, stream: str) -> None:
        self.stream = stream
        self._store = store
        self._writer: Writer = store.open_writer()
        self.state = ClusterState()
        self.position = store.partition_state(stream, 0).start_offset
        self.restarts: list[Restart] = []  # read but not yet taken
        self._lock = threading.RLock()  # REST threads and the herder's share the reader and the writer

    def refresh(self) -> bool:
        """Read what was appended since the last call; True if anything was."""
        with self._lock:
            end = self._store.partition_state(self.stream, 0).end_offset
            changed = False
            while self.position < end:
                messages = self._store.read(self.stream, 0, self.position, 1000)
                if not messages:
                    break
                for message in messages:
                    self._apply(message.offset() or 0, message.key(), message.value())
                self.position = (messages[-1].offset() or 0) + 1
                changed = True
            self.position = max(self.position, end)  # on Kafka, transaction markers take the last offsets
            return changed

    def snapshot(self) -> tuple[int, ClusterState]:
        """Read on to the end; the position there and a copy of the state, which reads that REST threads make
        meanwhile (every :meth:`append` reads on first) do not change under the caller."""
        with self._lock:
            self.refresh()
            return self.position, self.state.copy()

    def _apply(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        try:
            name, body = (key or b"").decode(), json.loads(value) if value is not None else None
            if name.startswith("restart-"):
                if body is not None:
                    self.restarts.append(Restart(offset, name.removeprefix("restart-"), bool(body["include_tasks"]),
                                                 bool(body["only_failed"]), body.get("task")))
                return
            self.state.apply(name, body)
        except (ValueError, KeyError, TypeError) as exc:  # a record this version cannot read: skipped, said once
            log.error("config stream %s: record at %d is not a config record (%r); skipped", self.stream, offset, exc)

    def take_restarts(self) -> list[Restart]:
        with self._lock:
            taken, self.restarts = self.restarts, []
            return taken

    def append(self, changes: Callable[[ClusterState], list[Change]]) -> None:
        """Append what ``changes`` makes of the state read to the end, in one CAS append; read again and make
        them again when another worker appended first."""
        for _ in range(_CAS_ATTEMPTS):
            with self._lock:
                self.refresh()
                records = [Record(key.encode(), None if value is None else json.dumps(value).encode())
                           for key, value in changes(self.state)]
                if not records:
                    return
                try:
                    self._writer.append(self.stream, 0, records, expected_offset=self.position)
                except KafkaException as exc:
                    if exc.code != ErrorCode.CAS_MISMATCH:
                        raise
                    continue
                self.refresh()
                return
        fail(ErrorCode.REBALANCE_IN_PROGRESS, f"config stream {self.stream}: {_CAS_ATTEMPTS} concurrent changes came "
             "first; try again")

    def close(self) -> None:
        self._writer.close()
