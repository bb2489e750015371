"""The Kafka backend's catalog: streams' epochs and writers' epochs, kept in one single-partition topic.

Each catalog record is ``{"name", "base", "value"}``: a new version of one entry, valid only if ``base`` is
the catalog offset of the version it replaces (-1 for a new name). Every reader applies records in log order
and skips any whose base is stale, so of two racing changes exactly the first one in the log wins and every
process agrees which, without relying on Kafka transactions or their abort markers.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException

TIMEOUT_S = 30.0


def translate(exc: ck.KafkaException | ck.KafkaError | None, doing: str) -> KafkaException:
    """A confluent-kafka error as onceflow's, keeping the code where both know it."""
    error = exc.args[0] if isinstance(exc, ck.KafkaException) else exc
    if error is None:
        return KafkaException(KafkaError(ErrorCode.UNKNOWN, f"{doing}: failed without an error"))
    try:
        code = ErrorCode(error.code())
    except ValueError:
        code = ErrorCode._TRANSPORT if error.retriable() else ErrorCode.UNKNOWN
    return KafkaException(KafkaError(code, f"{doing}: {error.str()}", retriable=error.retriable(),
                                     fatal=error.fatal()))


def offset_of(message: ck.Message) -> int:
    """The offset of a record the broker returned (CORRUPT_MESSAGE for one without)."""
    offset = message.offset()
    if offset is None:
        raise KafkaException(KafkaError(ErrorCode.CORRUPT_MESSAGE,
                                        f"{message.topic()}[{message.partition()}]: a record without an offset"))
    return offset


def delivery_error(err: ck.KafkaError | None, msg: ck.Message) -> ck.KafkaError | None:
    """A delivery report's error, or one for a record reported delivered without an offset (the broker did not
    return one): where it landed is unknown. Delivery callbacks must not raise: confluent-kafka would surface
    the exception as a SystemError from whatever call served the callback."""
    if err is None and msg.offset() is None:
        return ck.KafkaError(ck.KafkaError._STATE, f"{msg.topic()}[{msg.partition()}]: a record was reported "
                             "delivered without an offset", retriable=True)
    return err


def offsets_client(conf: Mapping[str, Any]) -> ck.Consumer:
    """A consumer that never fetches, for watermark requests.

    A fetching consumer's ListOffsets waits behind its own long-poll Fetch on the same connection.
    """
    return ck.Consumer({**conf, "group.id": f"onceflow-offsets-{uuid.uuid4().hex}", "enable.auto.commit": False})


def drain(consumer: ck.Consumer, timeout_s: float, limit: int = 10_000) -> list[ck.Message]:
    """The next message (waiting up to ``timeout_s``) and whatever else is already fetched."""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    return [first, *consumer.consume(limit, timeout=0)]


def ensure_topic(conf: Mapping[str, Any], topic: str, partitions: int) -> bool:
    """Create ``topic``; False if it already existed."""
    admin = AdminClient(dict(conf))
    future = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=TIMEOUT_S)[topic]
    try:
        future.result(timeout=TIMEOUT_S)
        return True
    except ck.KafkaException as exc:
        if exc.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise translate(exc, f"creating topic {topic!r}") from exc


class Catalog:
    """A process's view of the catalog topic, refreshed on demand, and the way to change it."""

    def __init__(self, kafka_conf: Mapping[str, Any], topic: str) -> None:
        self._conf = dict(kafka_conf)
        self._topic = topic
        ensure_topic(self._conf, topic, 1)
        self._producer = ck.Producer({**self._conf, "enable.idempotence": True, "linger.ms": 0})
        self._consumer = ck.Consumer({**self._conf, "group.id": f"onceflow-catalog-{uuid.uuid4().hex}",
                                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self._tp = ck.TopicPartition(topic, 0, 0)
        self._consumer.assign([self._tp])
        self._offsets = offsets_client(self._conf)
        self._position = 0
        self._entries: dict[str, tuple[int, Any]] = {}  # name -> (catalog offset of its version, value)
        self._proposed, self._won = -1, False  # this process's last proposal: its offset, and whether it won

    def refresh(self) -> None:
        """Apply every catalog record up to the current end of the catalog topic."""
        try:
            _, high = self._offsets.get_watermark_offsets(self._tp, timeout=TIMEOUT_S)
        except ck.KafkaException as exc:
            raise translate(exc, "reading the catalog's end offset") from exc
        if high < self._position:
            raise KafkaException(KafkaError(
                ErrorCode._STATE, f"catalog {self._topic} went back from offset {self._position} to {high}: the "
                "cluster lost acknowledged data (a memory-only broker restarted?); reopen the store", fatal=True))
        deadline = time.monotonic() + TIMEOUT_S
        while self._position < high:
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"catalog {self._topic}: reading to offset "
                                                f"{high} took over {TIMEOUT_S}s", retriable=True))
            for message in drain(self._consumer, 1.0):
                error = message.error()
                if error is not None:
                    raise translate(error, "reading the catalog")
                self._apply(offset_of(message), json.loads(message.value() or b"null"))
                self._position = offset_of(message) + 1

    def _apply(self, offset: int, record: dict[str, Any]) -> None:
        current = self._entries.get(record["name"])
        if record["base"] == (current[0] if current is not None else -1):
            self._entries[record["name"]] = (offset, record["value"])
            self._won = self._won or offset == self._proposed

    def get(self, name: str) -> Any:
        entry = self._entries.get(name)
        return entry[1] if entry is not None else None

    def names(self, prefix: str) -> list[str]:
        return sorted(n[len(prefix):] for n, (_, v) in self._entries.items() if n.startswith(prefix) and v)

    def propose(self, name: str, value: Any) -> bool:
        """Write a new version of ``name`` based on the version this process last saw; True if it won."""
        current = self._entries.get(name)
        base = current[0] if current is not None else -1
        reports: list[tuple[ck.KafkaError | None, ck.Message]] = []
        record = json.dumps({"name": name, "base": base, "value": value}).encode()
        self._producer.produce(self._topic, record, key=name.encode(), partition=0,
                               on_delivery=lambda err, msg: reports.append((err, msg)))
        self._producer.flush(TIMEOUT_S)
        error = reports[0][0] if reports else ck.KafkaError(ck.KafkaError._TIMED_OUT)
        if error is not None:
            raise translate(error, f"writing catalog entry {name!r}")
        self._proposed, self._won = offset_of(reports[0][1]), False
        while self._position <= self._proposed:
            self.refresh()
        return self._won  # even if a later version, based on this one, was applied in the same refresh

    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()
