"""The herder: what the REST API asks of a worker (Kafka Connect's ``Herder``), answered in Kafka Connect's JSON
shapes, with its errors as :class:`KafkaException` whose codes the REST layer turns into statuses
(RESOURCE_NOT_FOUND 404, DUPLICATE_RESOURCE 409, INVALID_CONFIG/INVALID_REQUEST 400, REBALANCE_IN_PROGRESS 409).

:class:`Herder` keeps connector configs in memory and runs every connector here (standalone mode); the
distributed herder (:mod:`onceflow.connect.distributed`) keeps them in streams and shares them out. Both decide
what should run (a connector's config, target state and task configs) and :meth:`Herder.reconcile` makes the
worker match.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Mapping
from typing import Any

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef
from onceflow.connect.connector import Connector, SourceConnector
from onceflow.connect.connector_config import ConnectorConfig, definition, parse, validate
from onceflow.connect.offsets import canonical
from onceflow.connect.plugins import PluginDesc, Plugins
from onceflow.connect.sink_runner import sink_group
from onceflow.connect.status import State, Status, StatusBoard, TargetState, TaskId
from onceflow.connect.worker import Worker
from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.store import Store
from onceflow.txn.stable_offsets import StableOffsets

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
NOT_STOPPED = ("Connectors must be in the STOPPED state before their offsets can be modified. This can be done for "
               "the specified connector by issuing a 'PUT' request to the '/connectors/{name}/stop' endpoint")


@dataclasses.dataclass
class ConnectorEntry:
    """What should run for one connector: its config, target state and task configs."""

    config: ConnectorConfig
    target: TargetState
    tasks: list[dict[str, str]] = dataclasses.field(default_factory=list)


def check_name(name: str) -> str:
    """A connector name as Kafka Connect accepts it: trimmed, not empty, no control characters."""
    name = name.strip()
    if not name:
        fail(ErrorCode.INVALID_CONFIG, "Connector configuration is invalid and contains the following 1 error(s):\n"
             "Invalid value  for configuration name: String may not be empty\nYou can also find the above list of "
             "errors at the endpoint `/connector-plugins/{connectorType}/config/validate`")
    if _CONTROL.search(name) or "/" in name:
        fail(ErrorCode.INVALID_CONFIG, f"Connector name {name!r} may not contain control characters or '/'")
    return name


class Herder:
    """Standalone: connectors kept in memory, all run by this worker."""

    def __init__(self, worker: Worker, store: Store, statuses: StatusBoard, cluster_id: str) -> None:
        self.worker = worker
        self.store = store
        self.statuses = statuses
        self.cluster_id = cluster_id
        self._lock = threading.RLock()
        self._entries: dict[str, ConnectorEntry] = {}
        # Sink offsets are read and written only once every transaction decided so far set its own (a sink task
        # that died between its COMMIT and the merge: a reset under it would be undone by that merge).
        self._stable = StableOffsets(store, StoreConfig(url=worker.context.config.store_url))

    @property
    def plugins(self) -> Plugins:
        return self.worker.context.plugins

    @property
    def exactly_once(self) -> bool:
        return self.worker.context.config.exactly_once

    # -- reads --------------------------------------------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        return {"version": __version__, "commit": "onceflow", "kafka_cluster_id": self.cluster_id}

    def connectors(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def entry(self, name: str, unknown: str = "Connector {name} not found") -> ConnectorEntry:
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            fail(ErrorCode.RESOURCE_NOT_FOUND, unknown.format(name=name))
        return entry

    def connector_info(self, name: str) -> dict[str, Any]:
        entry = self.entry(name)
        return {"name": name, "config": dict(entry.config.props),
                "tasks": [TaskId(name, i).info() for i in range(len(entry.tasks))], "type": entry.config.type}

    def connector_config(self, name: str) -> dict[str, str]:
        return dict(self.entry(name).config.props)

    def task_configs(self, name: str) -> list[dict[str, Any]]:
        entry = self.entry(name)
        return [{"id": TaskId(name, i).info(), "config": dict(c)} for i, c in enumerate(entry.tasks)]

    def connector_status(self, name: str) -> dict[str, Any]:
        status = self.statuses.connector(name)
        with self._lock:
            entry = self._entries.get(name)
        if status is None or entry is None:
            fail(ErrorCode.RESOURCE_NOT_FOUND, f"No status found for connector {name}")
        tasks = self.statuses.tasks(name)
        return {"name": name, "connector": status.info(),
                "tasks": [{"id": t.task, **s.info()} for t, s in sorted(tasks.items()) if t.task < len(entry.tasks)],
                "type": entry.config.type}

    def task_status(self, name: str, task: int) -> dict[str, Any]:
        status = self.statuses.task(TaskId(name, task))
        if status is None:
            fail(ErrorCode.RESOURCE_NOT_FOUND, f"No status found for task {name}-{task}")
        return {"id": task, **status.info()}

    def active_topics(self, name: str) -> dict[str, Any]:
        """The topics the connector's tasks used since it was created or its topics were reset."""
        self.entry(name)
        return {name: {"topics": self.statuses.topics(name)}}

    def reset_topics(self, name: str) -> None:
        self.entry(name)
        self.statuses.reset_topics(name)

    # -- config changes -------------------------------------------------------------------------------------------

    def validate(self, props: Mapping[str, str]) -> dict[str, Any]:
        checked = validate(self.plugins, props, self.exactly_once)
        desc = self.plugins.find(str(props.get("connector.class")))
        return checked.infos(desc.class_name if desc is not None else str(props.get("connector.class")))

    def plugin_config(self, desc: PluginDesc) -> list[dict[str, Any]]:
        """A plugin's keys (Kafka's ``ConfigKeyInfo`` list): a connector's own, then every connector's."""
        own: ConfigDef = desc.cls().config()
        if issubclass(desc.cls, Connector):
            own = own.merged(definition(self.plugins, desc.cls))
        return own.infos()

    def parse(self, name: str, props: Mapping[str, str]) -> ConnectorConfig:
        return parse(self.plugins, {**props, "name": name}, self.exactly_once)

    def put_connector_config(self, name: str, props: Mapping[str, str], allow_replace: bool,
                             initial: TargetState = TargetState.RUNNING) -> tuple[bool, dict[str, Any]]:
        """Create or (``allow_replace``) reconfigure a connector; (created, its info)."""
        name = check_name(name)
        config = self.parse(name, props)
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None and not allow_replace:
                fail(ErrorCode.DUPLICATE_RESOURCE, f"Connector {name} already exists")
            target = existing.target if existing is not None else initial
            self._entries[name] = ConnectorEntry(config, target)
            self.reconcile(name)
            return existing is None, self.connector_info(name)

    def delete_connector(self, name: str) -> dict[str, Any]:
        with self._lock:
            info = self.connector_info(name)
            self._stop_everything(name)
            del self._entries[name]
            self.statuses.forget(name)
            return info

    def set_target(self, name: str, target: TargetState) -> None:
        """Pause, resume or stop a connector (idempotent)."""
        with self._lock:
            entry = self.entry(name, "Unknown connector {name}")
            previous, entry.target = entry.target, target
            if previous is TargetState.STOPPED or target is TargetState.STOPPED:
                self.reconcile(name)
                return
            self.worker.set_connector_target(name, target)
            for task in self.worker.running_tasks(name):
                self.worker.set_task_target(task, target)

    def restart_connector(self, name: str, include_tasks: bool = False, only_failed: bool = False) -> dict[str, Any]:
        """Restart the connector (unless ``only_failed`` and it is not FAILED) and, with ``include_tasks``, its
        tasks (only the FAILED ones with ``only_failed``); the status as it was marked (RESTARTING)."""
        with self._lock:
            entry, restart_connector, tasks = self._restart_plan(name, include_tasks, only_failed)
            marked = self._mark_restarting(name, restart_connector, tasks)
            if restart_connector:
                self._start_connector(name, entry)
            for task in tasks:
                self.worker.start_task(task, entry.config, entry.tasks[task.task], entry.target)
            return marked

    def _restart_plan(self, name: str, include_tasks: bool,
                      only_failed: bool) -> tuple[ConnectorEntry, bool, list[TaskId]]:
        """(the entry, whether its connector restarts, the tasks that restart) for a restart request."""
        entry = self.entry(name, "Unknown connector: {name}")
        if self.statuses.connector(name) is None:
            fail(ErrorCode.RESOURCE_NOT_FOUND, f"Status for connector {name} not found")
        restart_connector = not only_failed or self._failed(self.statuses.connector(name))
        tasks = [TaskId(name, i) for i in range(len(entry.tasks))] if include_tasks else []
        return entry, restart_connector, [t for t in tasks if not only_failed or self._failed(self.statuses.task(t))]

    def _mark_restarting(self, name: str, connector: bool, tasks: list[TaskId]) -> dict[str, Any]:
        """The connector's status with what restarts marked RESTARTING (what a restart request answers)."""
        status = self.connector_status(name)
        if connector:
            status["connector"]["state"] = State.RESTARTING.value
        for task in status["tasks"]:
            if TaskId(name, task["id"]) in tasks:
                task["state"] = State.RESTARTING.value
        return status

    def restart_task(self, name: str, task: int) -> None:
        with self._lock:
            entry = self.entry(name, "Unknown connector: {name}")
            if not 0 <= task < len(entry.tasks):
                fail(ErrorCode.RESOURCE_NOT_FOUND, f"Unknown task: {name}-{task}")
            self.worker.start_task(TaskId(name, task), entry.config, entry.tasks[task], entry.target)

    @staticmethod
    def _failed(status: Status | None) -> bool:
        return status is not None and status.state is State.FAILED

    # -- running what should run ------------------------------------------------------------------------------------

    def reconcile(self, name: str) -> None:
        """(Re)start the connector and its tasks as its entry says (from scratch: a config change restarts all)."""
        with self._lock:
            entry = self._entries[name]
            self._stop_everything(name)
            self._start_connector(name, entry)
            for i, task_config in enumerate(entry.tasks):
                self.worker.start_task(TaskId(name, i), entry.config, task_config, entry.target)

    def _start_connector(self, name: str, entry: ConnectorEntry) -> None:
        """Start the connector and refresh its task configs (none while it is stopped or failed)."""
        self.worker.start_connector(entry.config, entry.target, self.reconfigure)
        if entry.target is TargetState.STOPPED:
            entry.tasks = []
            return
        configs = self.worker.task_configs(name)
        entry.tasks = configs if configs is not None else []

    def _stop_everything(self, name: str) -> None:
        self.worker.stop_tasks(self.worker.running_tasks(name))
        self.worker.stop_connector(name)
        self.statuses.forget_tasks(name)

    def reconfigure(self, name: str) -> None:
        """A connector asked for new task configs: restart its tasks if they changed."""
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.target is TargetState.STOPPED:
                return
            configs = self.worker.task_configs(name)
            if configs is None or configs == entry.tasks:
                return
            self.worker.stop_tasks(self.worker.running_tasks(name))
            entry.tasks = configs
            for i, task_config in enumerate(configs):
                self.worker.start_task(TaskId(name, i), entry.config, task_config, entry.target)

    # -- offsets (KIP-875) ----------------------------------------------------------------------------------------

    def offsets(self, name: str) -> dict[str, Any]:
        entry = self.entry(name)
        if entry.config.type == "source":
            stored = self.worker.context.offsets.offsets(name)
            return {"offsets": [{"partition": json.loads(p), "offset": o} for p, o in sorted(stored.items())]}
        return {"offsets": [{"partition": {"kafka_partition": p, "kafka_topic": t}, "offset": {"kafka_offset": o}}
                            for (t, p), o in sorted(self._sink_offsets(entry.config).items())]}

    def _sink_offsets(self, config: ConnectorConfig) -> dict[tuple[str, int], int]:
        """The sink's committed offsets; an offset at its partition's start counts as none (a reset one)."""
        self._stable.settle(sink_group(config.name))
        partitions = [(t, p) for t in self._sink_topics(config) for p in self.store.describe_stream(t).partitions]
        committed = self.store.committed_offsets(sink_group(config.name), partitions)
        return {tp: o for tp, o in committed.items() if o > self.store.partition_state(*tp).start_offset}

    def _sink_topics(self, config: ConnectorConfig) -> list[str]:
        streams = self.store.list_streams()
        if config.get("topics"):
            return [t for t in config.get("topics") if t in streams]
        pattern = re.compile(str(config.get("topics.regex")))
        return [s for s in streams if pattern.match(s)]

    def alter_offsets(self, name: str, offsets: Any) -> dict[str, str]:
        """Write (PATCH) offsets of a STOPPED connector; a null offset forgets one."""
        if not isinstance(offsets, dict) or not isinstance(offsets.get("offsets"), list) or not offsets["offsets"]:
            fail(ErrorCode.INVALID_REQUEST, "Partitions / offsets need to be provided for an alter offsets request")
        with self._lock:
            entry = self._stopped(name)
            parsed = [self._offset_entry(item) for item in offsets["offsets"]]
            if entry.config.type == "source":
                self._alter_source(entry, parsed)
            else:
                self._alter_sink(entry, parsed)
        return {"message": "The offsets for this connector have been altered successfully"}

    def reset_offsets(self, name: str) -> dict[str, str]:
        """Forget (DELETE) every offset of a STOPPED connector."""
        with self._lock:
            entry = self._stopped(name)
            if entry.config.type == "source":
                stored = self.worker.context.offsets.offsets(name)
                self.worker.context.offsets.write(name, dict.fromkeys(stored))
            else:
                self.store.commit_offsets(sink_group(name), {tp: self.store.partition_state(*tp).start_offset
                                                             for tp in self._sink_offsets(entry.config)})
        return {"message": "The offsets for this connector have been reset successfully"}

    def _stopped(self, name: str) -> ConnectorEntry:
        entry = self.entry(name)
        if entry.target is not TargetState.STOPPED or self.worker.running_tasks(name):
            fail(ErrorCode.INVALID_REQUEST, NOT_STOPPED.format(name=name))
        return entry

    @staticmethod
    def _offset_entry(item: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if not isinstance(item, dict) or not isinstance(item.get("partition"), dict):
            fail(ErrorCode.INVALID_REQUEST, f"Each offset needs a 'partition' object and an 'offset' object or "
                 f"null, got {item!r}")
        offset = item.get("offset")
        if offset is not None and not isinstance(offset, dict):
            fail(ErrorCode.INVALID_REQUEST, f"An offset must be an object or null, got {offset!r}")
        return item["partition"], offset

    def _alter_source(self, entry: ConnectorEntry, parsed: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> None:
        connector = self.plugins.connector(entry.config.connector_class)()
        changes = {canonical(partition): offset for partition, offset in parsed}
        if isinstance(connector, SourceConnector):
            connector.alter_offsets(entry.config.props, changes)
        self.worker.context.offsets.write(entry.config.name, changes)

    def _alter_sink(self, entry: ConnectorEntry, parsed: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> None:
        offsets: dict[tuple[str, int], int] = {}
        for partition, offset in parsed:
            topic, number = partition.get("kafka_topic"), partition.get("kafka_partition")
            if not isinstance(topic, str) or not isinstance(number, int):
                fail(ErrorCode.INVALID_REQUEST, f"A sink offset's partition needs 'kafka_topic' (a string) and "
                     f"'kafka_partition' (an integer), got {partition!r}")
            self.store.partition_state(topic, number)  # UNKNOWN_TOPIC_OR_PART
            value = None if offset is None else offset.get("kafka_offset")
            if value is not None and (not isinstance(value, int) or value < 0):
                fail(ErrorCode.INVALID_REQUEST, f"'kafka_offset' must be an integer >= 0, got {value!r}")
            offsets[(topic, number)] = (self.store.partition_state(topic, number).start_offset if value is None
                                        else value)
        # (its tasks are stopped: a transaction one of them claimed and left open is aborted, not merged later)
        self._stable.settle(sink_group(entry.config.name), aborting_claims=True)
        self.store.commit_offsets(sink_group(entry.config.name), offsets)

    # -- life -----------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        with self._lock:
            try:
                self.worker.stop()
            finally:
                self._stable.close()

