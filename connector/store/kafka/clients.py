"""confluent-kafka calls as onceflow needs them: errors translated to onceflow's, reads retried through leader
changes, topics created with onceflow's settings, record headers and delivery reports interpreted."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar, cast

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.store.contract import TopicSettings

SEQUENCE_HEADER = "onceflow.sequence"
TIMEOUT_S = 30.0
# librdkafka's batch.size, which onceflow leaves (a batch of many records fits it); its message.max.bytes caps it.
LIBRDKAFKA_BATCH_SIZE = 1_000_000
ATTEMPT_S = 10.0
"""How long one attempt of a read that :func:`through_leader_changes` retries may wait: librdkafka sends an
offsets request to the leader its metadata names and keeps it there until it times out, and a client keeps a
dead leader in its metadata (for minutes: librdkafka asks again every ``topic.metadata.refresh.interval.ms``,
and an admin client's entries last ``metadata.max.age.ms``). An attempt given the whole TIMEOUT_S left no time
to refresh the metadata and ask the new leader: a running store's offset reads and truncations of a partition
whose leader died failed after TIMEOUT_S, every one, while the node stayed down."""
_T = TypeVar("_T")
_MOVING = frozenset({
    ck.KafkaError.LEADER_NOT_AVAILABLE, ck.KafkaError.NOT_LEADER_FOR_PARTITION, ck.KafkaError.REPLICA_NOT_AVAILABLE,
    ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS, ck.KafkaError.COORDINATOR_NOT_AVAILABLE, ck.KafkaError.NOT_COORDINATOR,
    ck.KafkaError.FENCED_LEADER_EPOCH, ck.KafkaError.UNKNOWN_LEADER_EPOCH, ck.KafkaError.OFFSET_NOT_AVAILABLE,
    ck.KafkaError._TRANSPORT, ck.KafkaError._TIMED_OUT, ck.KafkaError._UNKNOWN_PARTITION,
    ck.KafkaError._DESTROY_BROKER, ck.KafkaError._NOENT,
})
"""Errors of a read asked while a partition's leader or a coordinator moves (a broker died or restarted). _NOENT:
an admin request's "Failed to query partition leaders: No leaders found", asked between a leader's death and
the election of the next one (refreshed metadata says so: readers crashed on it in kill/restart cycles)."""


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
    before each new attempt. A request to a leader that died waits for it until it times out, so ``read()``
    waits :data:`ATTEMPT_S` at most, and the next attempt, after the refresh, reaches the new leader. A future
    that did not answer in time (Python's TimeoutError) counts as _TIMED_OUT. Any other error, or the same one
    after ``timeout_s``, is raised translated.
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


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
"""Topic settings of onceflow's own topics (catalog, commit logs, staging, claims): the cluster's default
retention (7 days on Apache Kafka) would delete the catalog or a commit log that is still needed."""


def sequences_topic(prefix: str) -> str:
    """The compacted topic where a CAS owner keeps each partition's last application sequence number, written in
    the transaction of the batch that carries it: the batch itself may go (retention, compaction), the number must
    not (a writer resuming from it would write again what it wrote). Keyed by :func:`sequence_key`."""
    return f"__onceflow_sequences.{prefix}".rstrip(".")


SEQUENCES_SETTINGS = TopicSettings(config={"cleanup.policy": "compact", "segment.ms": "3600000"})


def sequence_key(stream_id: str, topic: str, local: int) -> bytes:
    """A Kafka partition's key in :func:`sequences_topic`; ``stream_id`` tells a stream from one deleted and made
    again under its name (empty for streams made before streams had ids)."""
    return f"{stream_id}/{topic}/{local}".encode()


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


def as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def record_headers(
    headers: Mapping[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
    keep_sequence: bool = False,
) -> list[tuple[str, bytes | None]] | None:
    """Record headers as onceflow gives them (a list of (name, bytes)); onceflow's own header hidden."""
    items = headers.items() if isinstance(headers, Mapping) else headers or []
    kept = [(k, as_bytes(v)) for k, v in items if keep_sequence or k != SEQUENCE_HEADER]
    return kept or None



def call(fn: Any, *args: Any, doing: str, **kwargs: Any) -> None:
    """Call a confluent-kafka method; its errors as onceflow's (see :func:`translating`)."""
    with translating(doing):
        fn(*args, **kwargs)


@contextlib.contextmanager
def translating(doing: str) -> Iterator[None]:
    """confluent-kafka's errors raised inside, as onceflow's (a fenced producer: PRODUCER_FENCED, fatal; a
    produce() on a producer that a rival fenced meanwhile fails with _FATAL, fatal)."""
    try:
        try:
            yield
        except SystemError as exc:  # a fatal error confluent-kafka raised while it served a delivery callback
            if isinstance(exc.__cause__, ck.KafkaException):
                raise exc.__cause__ from exc
            # Its error lost on the way ("returned NULL without setting an exception"): seen in a merge's flush
            # while many processes started and took the progress owner from each other (cause not confirmed).
            # Treated as fatal: an owner is dropped and taken afresh, where a bare SystemError ended the process.
            raise KafkaException(KafkaError(ErrorCode._FATAL, f"{doing}: confluent-kafka failed without saying why "
                                            f"({exc}); the client is unusable", fatal=True)) from exc
    except ck.KafkaException as exc:
        error = exc.args[0]
        if error.code() in (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                            ck.KafkaError.INVALID_PRODUCER_EPOCH):
            raise KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, f"{doing}: {error.str()}", fatal=True)) from exc
        if error.code() == ck.KafkaError._FATAL:  # the producer is unusable, whatever the flag says
            raise KafkaException(KafkaError(ErrorCode._FATAL, f"{doing}: {error.str()}", fatal=True)) from exc
        raise translate(exc, doing) from exc


class _ReleasedAdmin:
    """What a closed store or reader keeps in place of its AdminClient. An AdminClient has no close(): its
    librdkafka threads end only when it is freed, so a closed Producer, Consumer or store that the application
    still holds would keep them for good (~4 clients' threads each); any use after close is refused."""

    def __init__(self, owner: str) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> NoReturn:
        fail(ErrorCode._STATE, f"{self._owner} is closed")


def released_admin(owner: str) -> AdminClient:
    """A stand-in for a closed owner's AdminClient, so the client itself can be freed (see :class:`_ReleasedAdmin`)."""
    return cast(AdminClient, _ReleasedAdmin(owner))
