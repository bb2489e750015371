"""Distributed mode: workers sharing a ``group.id`` run the connectors of one cluster together.

Connector configs, target states and task configs live in the config stream (:mod:`onceflow.connect.config_log`),
statuses in the status stream (:mod:`onceflow.connect.status_log`), source offsets in the offsets stream, as Kafka
Connect keeps them in topics. Work is shared through the store's consumer groups (Kafka's group protocol on
kafka://): every worker is a member of the group ``<group.id>`` over a stream of :data:`SLOTS` partitions, the
*slots*; each connector was given a run of slots when it was created, one for its connector instance and one per
task, and a worker runs exactly the connectors and tasks whose slots it owns. When a worker leaves, its slots
(and so its work) go to the others: at once when it stops, after ``session.timeout.ms`` when it dies. A slot is
handed over only after its old owner stopped what ran there; a task that lost its slot without knowing it (a
zombie) is fenced by its successor's transactional producer, so it commits nothing more.

Every worker answers every request: a change is a CAS append to the config stream, which the workers running the
connector then act on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from onceflow.connect.app import ConnectWorker, cluster_id, offset_store
from onceflow.connect.config_log import SLOTS, Change, ClusterState, ConfigLog, Restart
from onceflow.connect.herder import NOT_STOPPED, ConnectorEntry, Herder, check_name
from onceflow.connect.offsets import compacted
from onceflow.connect.status import State, StatusBoard, TargetState, TaskId
from onceflow.connect.status_log import StatusLog
from onceflow.connect.task_runner import WorkerContext
from onceflow.connect.worker import Worker
from onceflow.connect.worker_config import Mode
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store import (
    GroupMember,
    GroupSettings,
    PartitionKey,
    Store,
    TopicSettings,
    ensure_stream,
)

log = logging.getLogger(__name__)

_TICK_S = 0.1
_AFTER_BUG_S = 1.0  # an unexpected error's pause, so one that repeats logs once a second, not every tick
_MAX_POLL_INTERVAL_MS = 300_000


def slots_stream(group: str) -> str:
    return f"__onceflow.connect.{group}.slots"


class DistributedHerder(Herder):
    """A :class:`Herder` whose state is the config stream and whose share of the work is its slots."""

    def __init__(self, worker: Worker, store: Store, statuses: StatusLog, cluster: str, configs: ConfigLog,
                 member: GroupMember, slots: str) -> None:
        super().__init__(worker, store, statuses.board, cluster)
        self.configs = configs
        self.status_log = statuses
        self._member = member
        self._slots = slots
        self._owned: frozenset[int] = frozenset()
        self._followed = -1  # the config stream's position the entries reflect
        self._state = ClusterState()  # the config stream's state there (a copy: REST threads read on meanwhile)
        self._running_connectors: dict[str, tuple[dict[str, str], TargetState]] = {}
        self._running_tasks: dict[TaskId, tuple[dict[str, str], TargetState]] = {}
        self._unpublished: set[str] = set()  # connectors whose task configs may not be published yet: tried again
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="connect-herder", daemon=True)

    def start(self) -> None:
        """Read the config stream (old restart orders are history), then follow it and the group."""
        self.configs.refresh()
        self.configs.take_restarts()
        self._tick()
        self._thread.start()

    # -- requests: reads see the config stream as it is now, changes are appended to it -------------------------

    def connectors(self) -> list[str]:
        self._follow_configs()
        return super().connectors()

    def entry(self, name: str, unknown: str = "Connector {name} not found") -> ConnectorEntry:
        self._follow_configs()
        return super().entry(name, unknown)

    def put_connector_config(self, name: str, props: Mapping[str, str], allow_replace: bool,
                             initial: TargetState = TargetState.RUNNING) -> tuple[bool, dict[str, Any]]:
        name = check_name(name)
        config = self.parse(name, props)
        created = False
        tasks: list[dict[str, str]] = []

        def changes(state: ClusterState) -> list[Change]:
            nonlocal created, tasks
            exists = name in state.connectors
            if exists and not allow_replace:
                fail(ErrorCode.DUPLICATE_RESOURCE, f"Connector {name} already exists")
            created, tasks = not exists, state.tasks.get(name, [])
            slot = state.slots[name] if exists else state.next_slot
            record = {"properties": dict(config.props), "slot": slot, "width": config.tasks_max + 1}
            out: list[Change] = [(f"connector-{name}", record)]
            if created:
                out.append((f"target-state-{name}", {"state": initial.value}))
            return out

        self.configs.append(changes)
        self._follow_configs()
        # As Kafka Connect answers: the new config with the tasks it had before it (a new connector's come later,
        # once the leader made them; they may have been made already, by the time this answers).
        return created, {**self.connector_info(name), "config": dict(config.props),
                         "tasks": [TaskId(name, i).info() for i in range(len(tasks))]}

    def delete_connector(self, name: str) -> dict[str, Any]:
        info = self.connector_info(name)
        self.configs.append(lambda state: [(f"connector-{name}", None)] if name in state.connectors else [])
        self._follow_configs()
        return info

    def set_target(self, name: str, target: TargetState) -> None:
        self.entry(name, "Unknown connector {name}")
        self.configs.append(lambda state: [(f"target-state-{name}", {"state": target.value})])
        self._follow_configs()

    def restart_connector(self, name: str, include_tasks: bool = False, only_failed: bool = False) -> dict[str, Any]:
        _, restart_connector, tasks = self._restart_plan(name, include_tasks, only_failed)
        marked = self._mark_restarting(name, restart_connector, tasks)
        order = {"include_tasks": include_tasks, "only_failed": only_failed, "task": None}
        self.configs.append(lambda state: [(f"restart-{name}", order)])
        return marked

    def restart_task(self, name: str, task: int) -> None:
        entry = self.entry(name, "Unknown connector: {name}")
        if not 0 <= task < len(entry.tasks):
            fail(ErrorCode.RESOURCE_NOT_FOUND, f"Unknown task: {name}-{task}")
        order = {"include_tasks": True, "only_failed": False, "task": task}
        self.configs.append(lambda state: [(f"restart-{name}", order)])

    def _stopped(self, name: str) -> ConnectorEntry:
        entry = self.entry(name)
        running = [s for t, s in self.statuses.tasks(name).items() if t.task < len(entry.tasks)
                   and s.state in (State.RUNNING, State.PAUSED)]
        if entry.target is not TargetState.STOPPED or entry.tasks or running:
            fail(ErrorCode.INVALID_REQUEST, NOT_STOPPED.format(name=name))
        return entry

    # -- following the streams and the group --------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.wait(_TICK_S):
            try:
                self._tick()
            except KafkaException as exc:  # the store failed for a moment: the next tick tries again
                log.warning("distributed herder: %s", exc)
            except Exception:  # a bug: said with its stack; a dead thread would leave a worker that runs nothing
                log.exception("distributed herder: unexpected error; trying again in %.0f s", _AFTER_BUG_S)
                self._stopping.wait(_AFTER_BUG_S)

    def _tick(self) -> None:
        with self._lock:
            self._follow_configs()
            self.status_log.refresh()
            owned = self._member.sync([self._slots], self._give_up)
            self._owned = frozenset(p for _, p in owned)
            self._run_owned()
            self._restart(self.configs.take_restarts())

    def _follow_configs(self) -> None:
        """The entries as the config stream says now (a connector whose plugin is not installed here is left out,
        and said so)."""
        with self._lock:
            position, state = self.configs.snapshot()
            if position == self._followed:
                return
            self._followed, self._state = position, state
            entries: dict[str, ConnectorEntry] = {}
            for name, props in state.connectors.items():
                try:
                    config = self.parse(name, props)
                except KafkaException as exc:
                    log.error("connector %s cannot run on this worker: %s", name, exc)
                    continue
                entries[name] = ConnectorEntry(config, state.targets.get(name, TargetState.RUNNING),
                                               list(state.tasks.get(name, [])))
            self._entries = entries

    def _give_up(self, partitions: frozenset[PartitionKey]) -> None:
        """The group moves these slots elsewhere: stop what runs on them first."""
        slots = {p for _, p in partitions}
        state = self._state

        def connector_moves(name: str) -> bool:
            return name not in state.slots or state.connector_slot(name) in slots

        def task_moves(task: TaskId) -> bool:
            return task.connector not in state.slots or state.task_slot(task.connector, task.task) in slots

        self._stop_units(connector_moves, task_moves)

    def _run_owned(self) -> None:
        """Make this worker run exactly the connectors and tasks of its slots, as their configs say."""
        state = self._state
        wanted_connectors = {n: e for n, e in self._entries.items() if state.connector_slot(n) in self._owned}
        wanted_tasks = {TaskId(n, i): (e, c) for n, e in self._entries.items() for i, c in enumerate(e.tasks)
                        if e.target is not TargetState.STOPPED and state.task_slot(n, i) in self._owned}

        def connector_changed(name: str) -> bool:
            wanted = wanted_connectors.get(name)
            return wanted is None or self._running_connectors[name][0] != wanted.config.props

        def task_changed(task: TaskId) -> bool:
            return task not in wanted_tasks or self._running_tasks[task][0] != wanted_tasks[task][1]

        self._stop_units(connector_changed, task_changed)
        followed = self._followed
        for name, entry in wanted_connectors.items():
            self._run_connector(name, entry)
        if self._followed != followed:  # new task configs published, the old ones' tasks fenced: start none of
            return  # those (the next tick starts the new ones)
        for task, (entry, task_config) in wanted_tasks.items():
            self._run_task(task, entry, task_config)

    def _stop_units(self, connector_gone: Callable[[str], bool], task_gone: Callable[[TaskId], bool]) -> None:
        """Stop the running tasks and connectors these say must go."""
        tasks = [t for t in self._running_tasks if task_gone(t)]
        self.worker.stop_tasks(tasks)
        for task in tasks:
            del self._running_tasks[task]
        for name in [n for n in self._running_connectors if connector_gone(n)]:
            self.worker.stop_connector(name)
            del self._running_connectors[name]

    def _run_connector(self, name: str, entry: ConnectorEntry) -> None:
        running = self._running_connectors.get(name)
        if running is not None and running[1] is entry.target:
            if name in self._unpublished:
                self._publish_tasks(name, entry)
            return
        if running is not None and TargetState.STOPPED not in (running[1], entry.target):
            self.worker.set_connector_target(name, entry.target)
        else:
            self.worker.start_connector(entry.config, entry.target, self.reconfigure)
        self._running_connectors[name] = (dict(entry.config.props), entry.target)
        self._unpublished.add(name)
        self._publish_tasks(name, entry)

    def _publish_tasks(self, name: str, entry: ConnectorEntry) -> None:
        """The connector's worker writes its task configs to the config stream when they changed."""
        configs = [] if entry.target is TargetState.STOPPED else self.worker.task_configs(name)
        if configs is None or configs == entry.tasks:
            self._unpublished.discard(name)
            return
        # The tasks whose configs change or go run on any worker, each stopped once its worker reads the new
        # configs: fenced first, none of them commits a source partition that a new task already resumed from.
        self.worker.fence_tasks([TaskId(name, i) for i, old in enumerate(entry.tasks)
                                 if i >= len(configs) or configs[i] != old], entry.config)
        self.configs.append(lambda state: [(f"tasks-{name}", {"tasks": configs})] if name in state.connectors
                            else [])
        self._unpublished.discard(name)
        self._follow_configs()

    def reconfigure(self, name: str) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and name in self._running_connectors:
                self._publish_tasks(name, entry)

    def _run_task(self, task: TaskId, entry: ConnectorEntry, task_config: dict[str, str]) -> None:
        running = self._running_tasks.get(task)
        if running is None:
            self.worker.start_task(task, entry.config, task_config, entry.target)
        elif running[1] is not entry.target:
            self.worker.set_task_target(task, entry.target)
        else:
            return
        self._running_tasks[task] = (dict(task_config), entry.target)

    def _restart(self, orders: list[Restart]) -> None:
        """Carry out the restart orders for what runs here."""
        for order in orders:
            entry = self._entries.get(order.connector)
            if entry is None:
                continue
            status = self.statuses.connector(order.connector)
            if order.task is None and order.connector in self._running_connectors and (
                    not order.only_failed or self._failed(status)):
                self.worker.start_connector(entry.config, entry.target, self.reconfigure)
            for task in [t for t in self._running_tasks if t.connector == order.connector]:
                chosen = order.include_tasks and (order.task is None or order.task == task.task)
                if chosen and (not order.only_failed or self._failed(self.statuses.task(task))):
                    self.worker.start_task(task, entry.config, self._running_tasks[task][0], entry.target)

    def stop(self) -> None:
        """Leave the group (the others take over at once) after stopping everything here."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.ExitStack() as closing:  # each closed even when one before it raised (last first)
            closing.callback(self._stable.close)
            closing.callback(self.configs.close)
            closing.callback(self.status_log.close)
            with self._lock:
                self._stop_units(lambda name: True, lambda task: True)
                self._member.leave()


class DistributedWorker(ConnectWorker):
    """A worker of the cluster ``group.id``; see the module docstring."""

    mode = Mode.DISTRIBUTED

    def _start(self) -> Herder:
        config = self.config
        client = {"store.url": config.store_url, "transaction.group": config["transaction.group"]}
        for kind in ("config", "status"):
            partitions = 1 if kind == "config" else config["status.storage.partitions"]
            ensure_stream(self.store, config[f"{kind}.storage.topic"], partitions,
                          compacted(self.store, config[f"{kind}.storage.replication.factor"]))
        self.offsets = offset_store(config, self.store, client)
        status_log = StatusLog(self.store, config["status.storage.topic"], config["status.storage.partitions"],
                               compacted(self.store, config["status.storage.replication.factor"]),
                               StatusBoard(), {"store.url": config.store_url})
        context = WorkerContext(config, self.plugins, self.worker_id, self.offsets, self._prefix(),
                                status_log.board.add_topic)
        worker = Worker(context, status_log.put_connector, status_log.put_task, fence_abandoned=False)
        slots = slots_stream(config["group.id"])
        ensure_stream(self.store, slots, SLOTS, TopicSettings())
        member = self.store.join_group(config["group.id"], GroupSettings(config["session.timeout.ms"],
                                                            config["heartbeat.interval.ms"], _MAX_POLL_INTERVAL_MS))
        herder = DistributedHerder(worker, self.store, status_log, cluster_id(config.store_url),
                                   ConfigLog(self.store, config["config.storage.topic"]), member, slots)
        herder.start()
        return herder

    def _prefix(self) -> str:
        return str(self.config["group.id"])
