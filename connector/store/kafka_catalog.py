"""The Kafka backend's catalog: streams' epochs and writers' epochs, kept in one single-partition topic.

Each catalog record is ``{"name", "base", "value"}``: a new version of one entry, valid only if ``base`` is
the catalog offset of the version it replaces (-1 for a new name). Every reader applies records in log order
and skips any whose base is stale, so of two racing changes exactly the first one in the log wins and every
process agrees which, without relying on Kafka transactions or their abort markers.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.store.contract import TopicSettings
from onceflow.connector.threads import one_at_a_time

TIMEOUT_S = 30.0
_T = TypeVar("_T")
_MOVING = frozenset({
    ck.KafkaError.LEADER_NOT_AVAILABLE, ck.KafkaError.NOT_LEADER_FOR_PARTITION, ck.KafkaError.REPLICA_NOT_AVAILABLE,
    ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS, ck.KafkaError.COORDINATOR_NOT_AVAILABLE, ck.KafkaError.NOT_COORDINATOR,
    ck.KafkaError.FENCED_LEADER_EPOCH, ck.KafkaError.UNKNOWN_LEADER_EPOCH, ck.KafkaError.OFFSET_NOT_AVAILABLE,
    ck.KafkaError._TRANSPORT, ck.KafkaError._TIMED_OUT, ck.KafkaError._UNKNOWN_PARTITION,
    ck.KafkaError._DESTROY_BROKER,
})
"""Errors of a read asked while a partition's leader or a coordinator moves (a broker died or restarted)."""


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


def through_leader_changes(read: Callable[[], _T], doing: str, timeout_s: float = TIMEOUT_S,
                           refresh: Callable[[], object] | None = None) -> _T:
    """``read()`` (a metadata or offsets read, safe to repeat), asked again while a leader or coordinator moves.

    librdkafka retries produce and fetch across a leader change but not these reads: one asked of a broker
    that just lost leadership fails with NOT_LEADER_FOR_PARTITION, found when a node of a three-node cluster
    was killed, and after the node is back a client that kept the old leader's metadata fails with
    FENCED_LEADER_EPOCH for minutes: ``refresh()`` (asking the read's client for the topic's metadata) runs
    before each new attempt. A future that did not answer in time (Python's TimeoutError) counts as
    _TIMED_OUT. Any other error, or the same one after ``timeout_s``, is raised translated.
    """
    deadline, wait = time.monotonic() + timeout_s, 0.05
    while True:
        try:
            return read()
        except ck.KafkaException as exc:
            error = exc.args[0]
            if (error.code() not in _MOVING and not error.retriable()) or time.monotonic() + wait > deadline:
                raise translate(exc, doing) from exc
        except TimeoutError as exc:
            if time.monotonic() + wait > deadline:
                raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"{doing}: no answer within {timeout_s:.0f}s",
                                                retriable=True)) from exc
        time.sleep(wait)
        wait = min(wait * 2, 1.0)
        if refresh is not None:
            with contextlib.suppress(ck.KafkaException):
                refresh()


def refresh_metadata(client: ck.Consumer | AdminClient, topics: Iterable[str]) -> None:
    """Ask the cluster for these topics' metadata: a client keeps a dead leader's until it does (the ``refresh``
    of :func:`through_leader_changes`)."""
    for topic in topics:
        client.list_topics(topic, timeout=5)


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


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
"""Topic settings of onceflow's own topics (catalog, commit logs, staging, claims): the cluster's default
retention (7 days on Apache Kafka) would delete the catalog or a commit log that is still needed."""


def is_internal(topic: str) -> bool:
    """True for onceflow's own topics: a dot-separated part of the name starts with ``__onceflow``."""
    return any(part.startswith("__onceflow") for part in topic.split("."))


def ensure_topic(admin: AdminClient, topic: str, partitions: int, settings: TopicSettings | None = None,
                 validate_only: bool = False) -> bool:
    """Create ``topic`` with ``settings`` (default: the cluster's replication and configs); False if it already
    existed. ``validate_only``: the cluster checks the request (replication, config names and values) and
    creates nothing.

    onceflow's own topics never expire (:data:`KEEP_FOREVER`); a user's streams keep the cluster's retention.
    """
    settings = settings or TopicSettings()
    config = {**settings.config, **(KEEP_FOREVER if is_internal(topic) else {})}
    new = NewTopic(topic, partitions, replication_factor=settings.replication_factor, config=config)
    future = admin.create_topics([new], operation_timeout=TIMEOUT_S, validate_only=validate_only)[topic]
    try:
        future.result(timeout=TIMEOUT_S)
        created = True
    except ck.KafkaException as exc:
        if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
            raise translate(exc, f"creating topic {topic!r}") from exc
        created = False
    except TimeoutError as exc:  # the cluster did not answer (a node down): retriable, as a typed error
        raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"creating topic {topic!r}: no answer within "
                                        f"{TIMEOUT_S:.0f}s", retriable=True)) from exc
    if not validate_only:
        _await_leaders(admin, topic)
    return created


def _await_leaders(admin: AdminClient, topic: str) -> None:
    """Wait until every partition of a new topic has a leader: on a cluster of several nodes a topic is
    announced before its leaders are, and reads asked in between fail with UNKNOWN_TOPIC_OR_PART."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        found = admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if found is not None and found.error is None and found.partitions and all(
                p.leader >= 0 and p.error is None for p in found.partitions.values()):
            return
        if time.monotonic() > deadline:
            fail(ErrorCode.LEADER_NOT_AVAILABLE, f"topic {topic!r} has partitions without a leader after "
                 f"{TIMEOUT_S:.0f}s")
        time.sleep(0.05)


class Catalog:
    """A process's view of the catalog topic, refreshed on demand, and the way to change it. Thread-safe: a
    refresh applies records in catalog order (each is based on the one before), so refreshes and proposals
    take turns."""

    def __init__(self, kafka_conf: Mapping[str, Any], admin: AdminClient, topic: str) -> None:
        self._conf = dict(kafka_conf)
        self._topic = topic
        ensure_topic(admin, topic, 1)
        self._producer = ck.Producer({**self._conf, "enable.idempotence": True, "linger.ms": 0})
        self._consumer = ck.Consumer({**self._conf, "group.id": f"onceflow-catalog-{uuid.uuid4().hex}",
                                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self._tp = ck.TopicPartition(topic, 0, 0)
        self._consumer.assign([self._tp])
        self._offsets = offsets_client(self._conf)
        self._position = 0
        self._entries: dict[str, tuple[int, Any]] = {}  # name -> (catalog offset of its version, value)
        self._proposed, self._won = -1, False  # this process's last proposal: its offset, and whether it won
        self._lock = threading.RLock()

    @one_at_a_time
    def refresh(self) -> None:
        """Apply every catalog record up to the current end of the catalog topic."""
        _, high = through_leader_changes(lambda: self._offsets.get_watermark_offsets(self._tp, timeout=TIMEOUT_S),
                                         "reading the catalog's end offset",
                                         refresh=lambda: refresh_metadata(self._offsets, [self._topic]))
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

    @one_at_a_time
    def names(self, prefix: str) -> list[str]:
        return sorted(n[len(prefix):] for n, (_, v) in self._entries.items() if n.startswith(prefix) and v)

    @one_at_a_time
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
