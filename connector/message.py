"""``Message``: one record as a consumer or a delivery report sees it, shaped like confluent-kafka's."""

from __future__ import annotations

import gc
import sys

from onceflow.connector.errors import KafkaError

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Headers = list[tuple[str, bytes | None]]


class Message:
    """A record with its position; ``error()`` is set on failed delivery reports and events."""

    __slots__ = ("_error", "_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(
        self,
        topic: str | None,
        partition: int | None,
        offset: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timestamp: int = -1,
        error: KafkaError | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp
        self._error = error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Headers | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch), as confluent-kafka."""
        if self._timestamp < 0:
            return (TIMESTAMP_NOT_AVAILABLE, 0)
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def error(self) -> KafkaError | None:
        return self._error

    def latency(self) -> float | None:
        """Seconds from produce() to its delivery report; None, as confluent-kafka's for a consumed record: onceflow
        does not time its deliveries."""
        return None

    def leader_epoch(self) -> int | None:
        """The partition leader's epoch when the record was written; None, as confluent-kafka's where unknown:
        onceflow's readers do not keep it."""
        return None

    def set_key(self, key: bytes | None) -> None:
        self._key = key
        _keep_collectable(self, key)

    def set_value(self, value: bytes | None) -> None:
        self._value = value
        _keep_collectable(self, value)

    def set_headers(self, headers: Headers | None) -> None:
        self._headers = headers
        _keep_collectable(self, headers)

    def set_error(self, error: KafkaError | None) -> None:
        self._error = error
        _keep_collectable(self, error)

    def __len__(self) -> int:
        return len(self._value) if self._value is not None else 0

    def __repr__(self) -> str:
        where = f"{self._topic}[{self._partition}]@{self._offset}"
        return f"Message({where}, key={self._key!r}, error={self._error})"


_MADE_IN_C = ("onceflow.connector.store._batch_codec", "onceflow.connector.store.kafka._messages")


def _keep_collectable(message: Message, field: object) -> None:
    """A Message read by a compiled hot path is not tracked by the garbage collector while its fields cannot form
    a cycle (connector/_message_slots.h); given a field that could, it is tracked again, so that a cycle through
    it is still collected. Only such a Message is untracked, and the module that made it is loaded."""
    if not gc.is_tracked(message):
        maker = next(module for module in map(sys.modules.get, _MADE_IN_C) if module is not None)
        maker.keep_collectable(message, field)
