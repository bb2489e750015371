"""Names for places in the log: ``TopicPartition``, ``NewTopic``, offsets constants, and metadata."""

from __future__ import annotations

import dataclasses

from onceflow.connector.errors import KafkaError
from onceflow.connector.store.contract import Store

OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001


class TopicPartition:
    """A partition of a topic and, depending on the call, an offset in it (as confluent-kafka's)."""

    __slots__ = ("error", "leader_epoch", "metadata", "offset", "partition", "topic")

    def __init__(
        self,
        topic: str,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        metadata: str | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: KafkaError | None = None

    def _key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    # As confluent-kafka's: equality, order and hash are by topic and partition only, never the offset, so a
    # TopicPartition names the same dict key or set member whatever offset it carries.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: TopicPartition) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset},"
                f"error={self.error}}}")


DEFAULT_NUM_PARTITIONS = 1
"""Partitions of a topic created with ``num_partitions=-1`` (the default), on every backend: onceflow creates its
streams itself and does not read a broker's ``num.partitions``."""


@dataclasses.dataclass
class NewTopic:
    """A topic to create; ``num_partitions`` is the partition count of its first epoch (-1, the default, as in
    confluent-kafka: :data:`DEFAULT_NUM_PARTITIONS`)."""

    topic: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class NewPartitions:
    """A request to grow a topic to ``new_total_count`` partitions (see ``AdminClient.create_partitions``)."""

    topic: str
    new_total_count: int
    replica_assignment: list[list[int]] | None = None


@dataclasses.dataclass(frozen=True)
class PartitionMetadata:
    """A partition: its id, the stream epoch it belongs to, and whether that epoch is sealed."""

    id: int
    epoch: int
    sealed: bool
    leader: int = 0
    replicas: tuple[int, ...] = (0,)
    isrs: tuple[int, ...] = (0,)
    error: KafkaError | None = None


@dataclasses.dataclass(frozen=True)
class TopicMetadata:
    """A topic: every partition of every epoch, and the epochs in order (the last one is open)."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    epochs: tuple[tuple[int, ...], ...]
    error: KafkaError | None = None


@dataclasses.dataclass(frozen=True)
class BrokerMetadata:
    """A server holding the store, as confluent-kafka's: the embedded store is one, id 0, whose host is its path."""

    id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.id}"


@dataclasses.dataclass(frozen=True)
class ClusterMetadata:
    """What ``AdminClient.list_topics`` and ``Consumer.list_topics`` return."""

    topics: dict[str, TopicMetadata]
    brokers: dict[int, BrokerMetadata] = dataclasses.field(default_factory=dict)
    cluster_id: str = "onceflow"
    controller_id: int = 0
    orig_broker_id: int = 0
    orig_broker_name: str = "embedded"


def cluster_metadata(store: Store, topic: str | None = None) -> ClusterMetadata:
    """Metadata of one topic (UNKNOWN_TOPIC_OR_PART if absent) or of all, as ``list_topics`` returns it."""
    names = [topic] if topic is not None else store.list_streams()
    topics = {}
    for name in names:
        stream = store.describe_stream(name)
        placed = store.replicas(name)
        partitions = {p: PartitionMetadata(p, epoch.epoch, epoch.sealed, *placed.get(p, (-1, (), ())))
                      for epoch in stream.epochs for p in epoch.partitions}
        topics[name] = TopicMetadata(name, partitions, tuple(e.partitions for e in stream.epochs))
    brokers = {i: BrokerMetadata(i, host, port) for i, (host, port) in store.brokers().items()}
    return ClusterMetadata(topics, brokers, controller_id=min(brokers, default=-1),
                           orig_broker_id=min(brokers, default=-1))


@dataclasses.dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What ``Producer.send_offsets_to_transaction`` needs of a consumer (``Consumer.consumer_group_metadata()``):
    its group and, if it subscribed, its member id and generation when this was taken (on Kafka "" while it was
    not in the group; None for a consumer that only assigns). A transaction's commit is refused (abort it) if that
    member lost its partitions since (UNKNOWN_MEMBER_ID), or, in this process, gave any of them up and got it back
    since (ILLEGAL_GENERATION), as by Kafka's generation check. ``generation_id`` counts the member's own
    rebalances, each gain or loss of partitions (connector/generations.py), not the coordinator's generations: 0
    before its first, -1 for a consumer that only assigns."""

    group_id: str
    member_id: str | None = None
    generation_id: int = -1
