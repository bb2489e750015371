"""The status stream of a distributed worker group (``status.storage.topic``), as Kafka Connect's status topic.

Each worker writes the statuses of the connectors and tasks it runs (``status-connector-<name>``,
``status-task-<name>-<n>``: ``{"state", "trace", "worker_id", "version"}``; null: forgotten) and reads everyone's,
so any worker answers ``GET /connectors/<name>/status``. A key's latest record wins (a key always lands in the
same partition).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from onceflow.connect.offsets import Deliveries
from onceflow.connect.status import State, Status, StatusBoard, TaskId
from onceflow.connector.errors import KafkaException
from onceflow.connector.producer import Producer
from onceflow.connector.store import Store, TopicSettings, ensure_stream

log = logging.getLogger(__name__)


def _value(status: Status) -> bytes:
    return json.dumps({"state": status.state.value, "trace": status.trace, "worker_id": status.worker_id,
                       "version": status.version}).encode()


class StatusLog:
    """Writes this worker's statuses and follows everyone's into a :class:`StatusBoard`."""

    def __init__(self, store: Store, stream: str, partitions: int, settings: TopicSettings, board: StatusBoard,
                 client_conf: Mapping[str, Any]) -> None:
        self.board = board
        self._store = store
        self._stream = stream
        ensure_stream(store, stream, partitions, settings)
        self._producer = Producer(client_conf)
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}
        self._deliveries = Deliveries()

    def put_connector(self, name: str, status: Status) -> None:
        self.board.put_connector(name, status)
        self._write(f"status-connector-{name}", _value(status))

    def put_task(self, task: TaskId, status: Status) -> None:
        self.board.put_task(task, status)
        self._write(f"status-task-{task.connector}-{task.task}", _value(status))

    def _write(self, key: str, value: bytes | None) -> None:
        """Write a status; a failure is logged, not raised (as Kafka Connect's status store does): the callers
        are a task's last report of its own failure and the herder's, which can do nothing about it, and this
        worker's board has the status already. Other workers do not see it until the next status is written."""
        with self._lock:
            try:
                self._producer.produce(self._stream, value, key=key.encode(), on_delivery=self._deliveries)
                self._producer.flush()
                self._deliveries.check(f"status {key}")
            except KafkaException as exc:
                log.error("Failed to write status update to the status stream: %s", exc)

    def refresh(self) -> None:
        """Read everyone's statuses written since the last call."""
        for partition in self._store.describe_stream(self._stream).partitions:
            position = self._positions.get(partition)
            state = self._store.partition_state(self._stream, partition)
            position = state.start_offset if position is None else position
            while position < state.end_offset:
                messages = self._store.read(self._stream, partition, position, 1000)
                if not messages:
                    break
                for message in messages:
                    self._apply((message.key() or b"").decode(), message.value())
                position = (messages[-1].offset() or 0) + 1
            self._positions[partition] = max(position, state.end_offset)

    def _apply(self, key: str, value: bytes | None) -> None:
        try:
            body = json.loads(value) if value is not None else None
            status = None if body is None else Status(State(body["state"]), body["worker_id"], body.get("version", ""),
                                                      body.get("trace"))
        except (ValueError, KeyError, TypeError):
            log.error("status stream %s: %r is not a status record; skipped", self._stream, key)
            return
        if key.startswith("status-connector-") and status is not None:
            self.board.put_connector(key.removeprefix("status-connector-"), status)
        elif key.startswith("status-task-") and status is not None:
            name, _, number = key.removeprefix("status-task-").rpartition("-")
            if number.isdigit():
                self.board.put_task(TaskId(name, int(number)), status)

    def close(self) -> None:
        self._producer.close()
