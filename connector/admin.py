"""``AdminClient``: confluent-kafka's admin API (futures per topic) plus ``scale_topic``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from onceflow.connector.config import AdminConfig, build
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store import StreamDescription, TopicSettings, open_store
from onceflow.connector.topic import (
    DEFAULT_NUM_PARTITIONS,
    INTERNAL_TOPIC_PREFIX,
    ClusterMetadata,
    NewPartitions,
    NewTopic,
    TopicPartition,
    cluster_metadata,
)

T = TypeVar("T")


def _future(operation: Callable[[], T]) -> Future[T]:
    """Run a store operation now and hand back its outcome as a completed future, as confluent-kafka does."""
    future: Future[T] = Future()
    try:
        future.set_result(operation())
    except KafkaException as exc:
        future.set_exception(exc)
    return future


def _user_topic(topic: str, doing: str) -> str:
    """``topic``, unless it is one of onceflow's internal topics, which only onceflow itself may change."""
    if isinstance(topic, str) and topic.startswith(INTERNAL_TOPIC_PREFIX):
        fail(ErrorCode.TOPIC_EXCEPTION, f"cannot {doing} topic {topic!r}: names starting with "
             f"{INTERNAL_TOPIC_PREFIX!r} are reserved for onceflow's internal topics")
    return topic


class AdminClient:
    """Creates, lists, scales, truncates and deletes topics of a store.

    Topics named ``__onceflow.*`` (transaction logs, staging, sink claims) are onceflow's own: creating, deleting,
    scaling or truncating one through this client fails with TOPIC_EXCEPTION.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = build(AdminConfig, config, "admin")
        self._store = open_store(self._config.store)

    def create_topics(self, new_topics: list[NewTopic], validate_only: bool = False,
                      **kwargs: Any) -> dict[str, Future[None]]:
        """One future per topic: None when created (or, ``validate_only``, when it would be, creating nothing),
        else TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_CONFIG, ...

        ``num_partitions=-1`` (NewTopic's default) creates :data:`DEFAULT_NUM_PARTITIONS` partitions;
        ``replication_factor`` and ``config`` apply to every epoch's topic on kafka://."""

        def create(topic: NewTopic) -> None:
            partitions = DEFAULT_NUM_PARTITIONS if topic.num_partitions == -1 else topic.num_partitions
            settings = TopicSettings(topic.replication_factor, dict(topic.config))
            self._store.create_stream(_user_topic(topic.topic, "create"), partitions, settings, validate_only)

        return {t.topic: _future(lambda t=t: create(t)) for t in new_topics}  # type: ignore[misc]

    def delete_topics(self, topics: list[str], **kwargs: Any) -> dict[str, Future[None]]:
        def delete(topic: str) -> None:
            self._store.delete_stream(_user_topic(topic, "delete"))

        return {t: _future(lambda t=t: delete(t)) for t in topics}  # type: ignore[misc]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return cluster_metadata(self._store, topic)

    def scale_topic(self, topic: str, num_partitions: int) -> Future[StreamDescription]:
        """Seal the topic's current partitions and open a new epoch of ``num_partitions`` partitions.

        Records of one key keep their order: readers finish the sealed partitions first.
        """
        return _future(lambda: self._store.scale_stream(_user_topic(topic, "scale"), num_partitions))

    def create_partitions(self, new_partitions: list[NewPartitions], validate_only: bool = False,
                          **kwargs: Any) -> dict[str, Future[None]]:
        """Grow each topic to ``new_total_count`` partitions, as a scale: its current partitions are sealed and a
        new epoch of ``new_total_count`` partitions opens (Kafka adds partitions and moves keys to them, breaking
        per-key order; a scale keeps it). INVALID_PARTITIONS unless the count grows; ``replica_assignment`` is
        INVALID_REQUEST (the store places partitions)."""

        def grow(request: NewPartitions) -> None:
            topic = _user_topic(request.topic, "add partitions to")
            current = len(self._store.describe_stream(topic).current.partitions)
            if request.new_total_count <= current:
                fail(ErrorCode.INVALID_PARTITIONS, f"topic {topic!r} has {current} partitions; the new total count "
                     f"{request.new_total_count} must be larger")
            if request.replica_assignment is not None:
                fail(ErrorCode.INVALID_REQUEST, f"topic {topic!r}: replica_assignment is not supported (the store "
                     "places partitions)")
            if not validate_only:
                self._store.scale_stream(topic, request.new_total_count)

        return {p.topic: _future(lambda p=p: grow(p)) for p in new_partitions}  # type: ignore[misc]

    def delete_records(self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
                       ) -> dict[TopicPartition, Future[TopicPartition]]:
        """Truncate each partition before the given offset; each future yields the new low watermark."""

        def truncate(tp: TopicPartition) -> TopicPartition:
            start = self._store.truncate_before(_user_topic(tp.topic, "truncate"), tp.partition, tp.offset)
            return TopicPartition(tp.topic, tp.partition, start)

        return {tp: _future(lambda tp=tp: truncate(tp)) for tp in topic_partition_offsets}  # type: ignore[misc]

    def close(self) -> None:
        self._store.close()
