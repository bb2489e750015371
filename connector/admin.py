"""``AdminClient``: confluent-kafka's admin API (futures per topic or group) plus ``scale_topic``.

Requests and results are confluent-kafka's own value types (``TopicCollection``, ``OffsetSpec``,
``TopicDescription``, ``ConsumerGroupDescription``, ...), re-exported here, so code written for confluent-kafka
builds and reads them unchanged; partitions in them are onceflow's :class:`TopicPartition`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    Node,
    TopicCollection,
    TopicPartitionInfo,
)
from confluent_kafka.admin._group import (
    ConsumerGroupDescription,
    ConsumerGroupListing,
    ListConsumerGroupsResult,
    MemberAssignment,
    MemberDescription,
)
from confluent_kafka.admin._listoffsets import ListOffsetsResultInfo, OffsetSpec
from confluent_kafka.admin._topic import TopicDescription

from onceflow.connector.config import AdminConfig, ClientEvents, build
from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store import StreamDescription, TopicSettings, open_store
from onceflow.connector.store.contract import INTERNAL_TOPIC_PREFIX, GroupDescription
from onceflow.connector.topic import (
    DEFAULT_NUM_PARTITIONS,
    OFFSET_END,
    BrokerMetadata,
    ClusterMetadata,
    NewPartitions,
    NewTopic,
    PartitionMetadata,
    TopicMetadata,
    TopicPartition,
    cluster_metadata,
)
from onceflow.txn.stable_offsets import StableOffsets

T = TypeVar("T")
log = logging.getLogger(__name__)
_STATS_CHECK_S = 0.01  # how often poll() looks whether statistics are due
_UNKNOWN: Any = None
"""None where confluent-kafka's types hold None for an unknown topic id; their type hints say otherwise."""


def _user_topic(topic: str, doing: str) -> str:
    """``topic``, unless it is one of onceflow's internal topics, which only onceflow itself may change."""
    if isinstance(topic, str) and topic.startswith(INTERNAL_TOPIC_PREFIX):
        fail(ErrorCode.TOPIC_EXCEPTION, f"cannot {doing} topic {topic!r}: names starting with "
             f"{INTERNAL_TOPIC_PREFIX!r} are reserved for onceflow's internal topics")
    return topic


def _theirs(partitions: list[TopicPartition]) -> Any:
    """onceflow's partitions where confluent-kafka's types hold theirs (same fields, same equality)."""
    return partitions


def _state(group: GroupDescription) -> ConsumerGroupState:
    if group.members:
        return ConsumerGroupState.STABLE
    return ConsumerGroupState.EMPTY if group.offsets else ConsumerGroupState.DEAD


def _check_groups(group_ids: list[str], doing: str) -> None:
    """_INVALID_ARG unless ``group_ids`` is a non-empty list of distinct names (confluent-kafka raises ValueError)."""
    if not isinstance(group_ids, list) or not group_ids or len(set(group_ids)) != len(group_ids) or not all(
            isinstance(g, str) and g for g in group_ids):
        fail(ErrorCode._INVALID_ARG, f"{doing} needs a non-empty list of distinct group names, got {group_ids!r}")


class AdminClient:
    """Creates, lists, scales, truncates and deletes topics of a store.

    Topics named ``__onceflow.*`` (transaction logs, staging, sink claims) are onceflow's own: creating, deleting,
    scaling or truncating one through this client fails with TOPIC_EXCEPTION.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = build(AdminConfig, config, "admin")
        # "producer": librdkafka's admin client is a producer handle (its name, its statistics' type).
        self._events = ClientEvents(self._config.client, self._config.client_id, "producer", log)
        self._requests = 0
        self._store = open_store(self._config.store)
        self._stable = StableOffsets(self._store, self._config.store)

    def _future(self, what: str, operation: Callable[[], T]) -> Future[T]:
        """Run a store operation now and hand back its outcome as a completed future, as confluent-kafka does.
        Its error is the future's alone (never error_cb's: nothing else meets it); with ``debug``, one line."""
        future: Future[T] = Future()
        self._requests += 1
        try:
            future.set_result(operation())
        except KafkaException as exc:
            future.set_exception(exc)
            self._events.debug("%s: %s", what, exc.error)
        else:
            self._events.debug("%s: done", what)
        return future

    def poll(self, timeout: float | None = None) -> int:
        """Serve stats_cb when statistics are due, waiting for that up to ``timeout`` seconds (None or -1: until
        then, without stats_cb not at all); how many callbacks ran. Requests need no poll: their futures are
        done when the call returns."""
        deadline = time.monotonic() + (timeout if timeout is not None and timeout >= 0 else float("inf"))
        while not self._events.stats_due():
            left = deadline - time.monotonic()
            if left <= 0 or not self._events.collecting:
                return 0
            time.sleep(min(left, _STATS_CHECK_S))
        self._events.emit_stats({"replyq": 0, "msg_cnt": 0, "msg_size": 0, "tx": self._requests,
                                 "rx": self._requests, "txmsgs": 0, "rxmsgs": 0, "topics": {}})
        return 1

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

        return {t.topic: self._future(f"create_topics {t.topic}",
                                      lambda t=t: create(t)) for t in new_topics}  # type: ignore[misc]

    def delete_topics(self, topics: list[str], **kwargs: Any) -> dict[str, Future[None]]:
        def delete(topic: str) -> None:
            self._store.delete_stream(_user_topic(topic, "delete"))

        return {t: self._future(f"delete_topics {t}", lambda t=t: delete(t)) for t in topics}  # type: ignore[misc]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return cluster_metadata(self._store, topic)

    def scale_topic(self, topic: str, num_partitions: int) -> Future[StreamDescription]:
        """Seal the topic's current partitions and open a new epoch of ``num_partitions`` partitions.

        Records of one key keep their order: readers finish the sealed partitions first.
        """
        return self._future(f"scale_topic {topic}",
                            lambda: self._store.scale_stream(_user_topic(topic, "scale"), num_partitions))

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

        return {p.topic: self._future(f"create_partitions {p.topic}",
                                      lambda p=p: grow(p)) for p in new_partitions}  # type: ignore[misc]

    def delete_records(self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
                       ) -> dict[TopicPartition, Future[TopicPartition]]:
        """Truncate each partition before the given offset; each future yields the new low watermark."""

        def truncate(tp: TopicPartition) -> TopicPartition:
            start = self._store.truncate_before(_user_topic(tp.topic, "truncate"), tp.partition, tp.offset)
            return TopicPartition(tp.topic, tp.partition, start)

        return {tp: self._future(f"delete_records {tp}",
                                 lambda tp=tp: truncate(tp)) for tp in topic_partition_offsets}  # type: ignore[misc]

    def describe_topics(self, topics: TopicCollection, request_timeout: float = -1,
                        include_authorized_operations: bool = False, **kwargs: Any) -> dict[str, Future[Any]]:
        """One future per topic name: a ``TopicDescription`` whose partitions are every epoch's, each with its
        leader, replicas and in-sync replicas as ``Node``s; UNKNOWN_TOPIC_OR_PART for a topic that does not exist."""
        if not isinstance(topics, TopicCollection):
            fail(ErrorCode._INVALID_ARG, f"describe_topics needs a TopicCollection, got {type(topics).__name__}")
        nodes = self._nodes()

        def describe(name: str) -> TopicDescription:
            self._store.describe_stream(name)  # UNKNOWN_TOPIC_OR_PART
            placed = self._store.replicas(name)
            partitions = [TopicPartitionInfo(p, nodes.get(leader, Node(leader, "", -1)),
                                             [nodes.get(r, Node(r, "", -1)) for r in replicas],
                                             [nodes.get(r, Node(r, "", -1)) for r in isr])
                          for p, (leader, replicas, isr) in sorted(placed.items())]
            return TopicDescription(name, _UNKNOWN, name.startswith(INTERNAL_TOPIC_PREFIX), partitions, None)

        return {name: self._future(f"describe_topics {name}",
                                   lambda n=name: describe(n)) for name in topics.topic_names}  # type: ignore[misc]

    def _nodes(self) -> dict[int, Node]:
        return {i: Node(i, host, port) for i, (host, port) in self._store.brokers().items()}

    def list_offsets(self, topic_partition_offsets: dict[TopicPartition, OffsetSpec],
                     isolation_level: IsolationLevel | None = None, request_timeout: float = -1,
                     **kwargs: Any) -> dict[TopicPartition, Future[ListOffsetsResultInfo]]:
        """One future per partition: a ``ListOffsetsResultInfo(offset, timestamp, leader_epoch)`` for
        ``OffsetSpec.earliest()``, ``latest()``, ``max_timestamp()`` or ``for_timestamp(ms)``; offset -1 when no
        record matches. Readers only ever see committed records, so both isolation levels answer alike."""

        def look_up(tp: TopicPartition, spec: OffsetSpec) -> ListOffsetsResultInfo:
            value = spec._value
            if value in (-2, -1):  # OffsetSpec.earliest(), latest()
                state = self._store.partition_state(tp.topic, tp.partition)
                return ListOffsetsResultInfo(state.start_offset if value == -2 else state.end_offset, -1, -1)
            if value == -3:  # OffsetSpec.max_timestamp()
                found = self._store.max_timestamp(tp.topic, tp.partition)
                return ListOffsetsResultInfo(*(found or (OFFSET_END, -1)), -1)
            offset = self._store.offset_for_time(tp.topic, tp.partition, value)
            if offset is None:
                return ListOffsetsResultInfo(OFFSET_END, -1, -1)
            record = self._store.read(tp.topic, tp.partition, offset, 1)
            return ListOffsetsResultInfo(offset, record[0].timestamp()[1] if record else -1, -1)

        for spec in topic_partition_offsets.values():
            if not isinstance(spec, OffsetSpec):
                fail(ErrorCode._INVALID_ARG, f"list_offsets needs an OffsetSpec per partition, got {spec!r}")
        return {tp: self._future(f"list_offsets {tp}", lambda tp=tp, s=s: look_up(tp, s))  # type: ignore[misc]
                for tp, s in topic_partition_offsets.items()}

    # -- consumer groups --------------------------------------------------------------------------------------

    def list_consumer_groups(self, request_timeout: float = -1, states: set[ConsumerGroupState] | None = None,
                             **kwargs: Any) -> Future[ListConsumerGroupsResult]:
        """A future of ``ListConsumerGroupsResult``: each group with live members (STABLE) or only committed
        offsets (EMPTY), optionally only those in ``states``."""

        def listing() -> ListConsumerGroupsResult:
            found = [ConsumerGroupListing(d.group, False, _state(d))
                     for d in map(self._store.describe_group, self._store.list_groups())]
            return ListConsumerGroupsResult([g for g in found if not states or g.state in states], [])

        return self._future("list_consumer_groups", listing)

    def describe_consumer_groups(self, group_ids: list[str], request_timeout: float = -1,
                                 include_authorized_operations: bool = False, **kwargs: Any
                                 ) -> dict[str, Future[ConsumerGroupDescription]]:
        """One future per group: a ``ConsumerGroupDescription`` with its live members and what each owns (a group
        the store does not know is DEAD with no members, as Kafka's)."""
        _check_groups(group_ids, "describe_consumer_groups")
        coordinator = min(self._nodes().items(), default=(-1, Node(-1, "", -1)))[1]
        assignor = "roundrobin" if self._store.url.startswith("sqlite://") else "cooperative-sticky"

        def describe(group: str) -> ConsumerGroupDescription:
            found = self._store.describe_group(group)
            members = [MemberDescription(m.member_id, m.client_id, m.host,
                                         MemberAssignment(_theirs([TopicPartition(t, p) for t, p in m.assignment])))
                       for m in found.members]
            return ConsumerGroupDescription(group, False, members, assignor if members else "", _state(found),
                                            coordinator)

        return {g: self._future(f"describe_consumer_groups {g}",
                                lambda g=g: describe(g)) for g in group_ids}  # type: ignore[misc]

    def list_consumer_group_offsets(self, list_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
                                    require_stable: bool = False, request_timeout: float = -1, **kwargs: Any
                                    ) -> dict[str, Future[ConsumerGroupTopicPartitions]]:
        """One future per group: its committed offsets, of the partitions named (OFFSET_INVALID where none) or of
        every partition it committed. ``require_stable``: once every transaction decided so far that carries offsets
        for the group set its own (a merge pass may run here, which needs write access to its group's topics).
        Without it, unlike Kafka's (where only undecided transactions' offsets are missing), those of a producer
        that died between its COMMIT and the merge are missing until a consumer or an admin call merges them."""
        _check_groups([r.group_id for r in list_consumer_group_offsets_request], "list_consumer_group_offsets")

        def offsets(request: ConsumerGroupTopicPartitions) -> ConsumerGroupTopicPartitions:
            if require_stable:
                self._stable.settle(request.group_id)
            committed = self._store.describe_group(request.group_id).offsets
            if request.topic_partitions is None:
                named = [TopicPartition(t, p, o) for (t, p), o in sorted(committed.items())]
            else:
                named = [TopicPartition(tp.topic, tp.partition, committed.get((tp.topic, tp.partition), -1001))
                         for tp in request.topic_partitions]
            return ConsumerGroupTopicPartitions(request.group_id, _theirs(named))

        return {r.group_id: self._future(f"list_consumer_group_offsets {r.group_id}",
                                         lambda r=r: offsets(r))  # type: ignore[misc]
                for r in list_consumer_group_offsets_request}

    def alter_consumer_group_offsets(self, alter_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
                                     request_timeout: float = -1, **kwargs: Any
                                     ) -> dict[str, Future[ConsumerGroupTopicPartitions]]:
        """Set an empty group's committed offsets (one group per call, as confluent-kafka); the future yields the
        group and its partitions with the offsets set. UNKNOWN_MEMBER_ID while the group has live members (Kafka's
        answer: they own the partitions), UNKNOWN_TOPIC_OR_PART for a partition that does not exist."""
        if len(alter_consumer_group_offsets_request) != 1:
            fail(ErrorCode._INVALID_ARG, "alter_consumer_group_offsets takes exactly one group per call, as "
                 f"confluent-kafka's; got {len(alter_consumer_group_offsets_request)}")
        request = alter_consumer_group_offsets_request[0]
        _check_groups([request.group_id], "alter_consumer_group_offsets")
        if not request.topic_partitions or any(tp.offset < 0 for tp in request.topic_partitions):
            fail(ErrorCode._INVALID_ARG, f"alter_consumer_group_offsets: group {request.group_id!r} needs partitions "
                 "with offsets >= 0")

        def alter() -> ConsumerGroupTopicPartitions:
            group, partitions = request.group_id, request.topic_partitions or []
            members = self._store.describe_group(group).members
            if members:
                fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group!r} has {len(members)} live members: its offsets can "
                     "be altered once they left")
            for tp in partitions:
                self._store.partition_state(tp.topic, tp.partition)  # UNKNOWN_TOPIC_OR_PART
            # Else a decided transaction's merge, or a claimed one of a member removed since, would set its offsets
            # over these.
            self._stable.settle(group, aborting_claims=True)
            self._store.commit_offsets(group, {(tp.topic, tp.partition): tp.offset for tp in partitions})
            return ConsumerGroupTopicPartitions(group, _theirs([TopicPartition(tp.topic, tp.partition, tp.offset)
                                                                for tp in partitions]))

        return {request.group_id: self._future(f"alter_consumer_group_offsets {request.group_id}", alter)}

    def delete_consumer_groups(self, group_ids: list[str], request_timeout: float = -1, **kwargs: Any
                               ) -> dict[str, Future[None]]:
        """One future per group: None once its committed offsets are gone; NON_EMPTY_GROUP while it has live
        members, GROUP_ID_NOT_FOUND for a group the store does not know."""
        _check_groups(group_ids, "delete_consumer_groups")

        def delete(group: str) -> None:
            if not self._store.describe_group(group).members:  # (else delete_group refuses: NON_EMPTY_GROUP)
                # Else a decided transaction's merge, or a claimed one of a member removed since, would bring its
                # offsets back.
                self._stable.settle(group, aborting_claims=True)
            self._store.delete_group(group)

        return {g: self._future(f"delete_consumer_groups {g}", lambda g=g: delete(g))  # type: ignore[misc]
                for g in group_ids}

    def close(self) -> None:
        try:
            self._stable.close()
        finally:
            self._store.close()


__all__ = [  # the client, its requests and results: confluent_kafka.admin's names and confluent_kafka's
    "AdminClient",
    "BrokerMetadata",
    "ClusterMetadata",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ConsumerGroupState",
    "ConsumerGroupTopicPartitions",
    "IsolationLevel",
    "ListConsumerGroupsResult",
    "ListOffsetsResultInfo",
    "MemberAssignment",
    "MemberDescription",
    "NewPartitions",
    "NewTopic",
    "Node",
    "OffsetSpec",
    "PartitionMetadata",
    "TopicCollection",
    "TopicDescription",
    "TopicMetadata",
    "TopicPartition",
    "TopicPartitionInfo",
]
