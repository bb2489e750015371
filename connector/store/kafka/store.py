"""The Kafka store: streams as topics (an epoch per topic), the catalog, reads, groups; see the package docstring."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._group import ConsumerGroupDescription  # exported by confluent_kafka.admin, untyped there
from confluent_kafka.admin._listoffsets import OffsetSpec  # exported by confluent_kafka.admin, untyped there

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.message import Message
from onceflow.connector.store.contract import (
    INTERNAL_TOPIC_PREFIX,
    EpochDescription,
    GroupDescription,
    GroupMemberDescription,
    GroupSettings,
    PartitionKey,
    PartitionState,
    StreamDescription,
    TopicSettings,
    check_partition_count,
    first_epoch,
)
from onceflow.connector.store.kafka.catalog import Catalog
from onceflow.connector.store.kafka.clients import (
    ATTEMPT_S,
    LIBRDKAFKA_BATCH_SIZE,
    SEQUENCES_SETTINGS,
    TIMEOUT_S,
    ensure_topic,
    offset_of,
    offsets_client,
    refresh_metadata,
    released_admin,
    sequence_key,
    sequences_topic,
    through_leader_changes,
    translate,
)
from onceflow.connector.store.kafka.group import KafkaGroupMember, owned_here
from onceflow.connector.store.kafka.messages import as_messages
from onceflow.connector.store.kafka.probe import require_hidden_aborts
from onceflow.connector.store.kafka.reader import Reader
from onceflow.connector.store.kafka.writer import KafkaWriter

log = logging.getLogger(__name__)

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_EPOCH_SUFFIX = re.compile(r"\.epoch-\d+$")


GROUP_CLIENT_IDLE_S = 300.0
"""A group's offsets client nobody used this long is closed when another group's is made."""


@dataclasses.dataclass
class _GroupClient:
    """A group's offsets client, how many calls use it now, and when the last one ended (monotonic)."""

    consumer: ck.Consumer
    users: int = 0
    used: float = dataclasses.field(default_factory=time.monotonic)


class KafkaStore:
    """A store on a Kafka cluster; see the module docstring for the mapping."""

    def __init__(self, location: str, config: StoreConfig) -> None:
        bootstrap, _, namespace = location.partition("/")
        self._url = f"kafka://{location}"
        self._prefix = f"{namespace}." if namespace else ""
        self._sequences_made = False  # see _kept_sequence_at
        self._config = config
        self._conf: dict[str, Any] = {"socket.connection.setup.timeout.ms": config.connect_timeout_ms,
                                      **dict(config.kafka_settings), "bootstrap.servers": bootstrap}
        self._admin = _check_reachable(self._conf, config.connect_timeout_ms / 1000)  # topics, truncation
        self._catalog = Catalog(self._conf, self._admin, f"__onceflow_catalog{'.' + namespace if namespace else ''}")
        self._group_clients: dict[str, _GroupClient] = {}
        self._uncommitted_offsets: ck.Consumer | None = None  # high watermarks, for seals
        self._clients_lock = threading.Lock()  # the clients above are made on first use, by whichever thread
        self._open_readers()

    @property
    def url(self) -> str:
        return self._url

    @property
    def atomic_conditions(self) -> int:
        return 1  # checked by the fenced owner of what it is about (KafkaWriter._guard)

    @property
    def writer_sessions_outlive_close(self) -> bool:
        return True  # an idempotent producer's id, kept by the brokers

    @property
    def unusable(self) -> KafkaError | None:
        return self._catalog.lost

    def _require_hidden_aborts(self, doing: str) -> None:
        """Before a first transactional producer: refuse a broker that shows aborted records (probe)."""
        require_hidden_aborts(self._conf, self._config.allow_visible_aborts, doing)

    def _open_readers(self) -> None:
        self._reader = Reader(self._conf)  # sequential reads of the clients
        self._tail = Reader(self._conf)  # end offsets and last sequences, without moving the reader
        # Per Kafka partition: records below this offset were read, and a look at the catalog after they were found
        # their partition open, so every seal to come ends past them (see _sealed_past)
        self._open_below: dict[tuple[str, int], int] = {}
        self._readable_ends: dict[tuple[str, int, int], int] = {}  # sealed Kafka partition -> past its last record

    def _close_readers(self, for_good: bool = True) -> None:
        """Close the readers' consumers; ``for_good`` (the store closes): their AdminClients too (not when they are
        replaced: a commit may still be asking one for stable offsets, and it is freed with its reader)."""
        with self._clients_lock:
            made = [*(c.consumer for c in self._group_clients.values()), *filter(None, [self._uncommitted_offsets])]
            self._group_clients.clear()
            self._uncommitted_offsets = None
        for consumer in made:
            consumer.close()
        self._reader.close(for_good)
        self._tail.close(for_good)

    @staticmethod
    def _never_scaled(stream: str) -> bool:
        """True for onceflow's own streams (INTERNAL_TOPIC_PREFIX: commit logs, staging, progress): they are never
        scaled, so where their partitions live needs no fresh look at the catalog (a round trip), and a scale of
        one is refused."""
        return stream.startswith(INTERNAL_TOPIC_PREFIX)

    # -- streams -------------------------------------------------------------------------------------

    def _stream(self, name: str, refresh: bool = True) -> StreamDescription:
        if refresh:
            self._catalog.refresh()
        else:  # a view with no fresh look too: it would read, and write, the new topics as the lost ones
            self._catalog.require_not_lost()
        entry = self._catalog.get(f"stream:{name}")
        if not entry:
            fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown topic {name!r}")
        return _describe(name, entry)

    def _topic_of(self, name: str, partition: int, refresh: bool = True) -> tuple[str, int, int | None]:
        """(Kafka topic, its partition, the sealed end offset or None) of a global partition id; a stream or
        partition this view does not know yet is looked up again in the catalog before it is called unknown."""
        try:
            self._stream(name, refresh).epoch_of(partition)  # UNKNOWN_TOPIC_OR_PART if absent
        except KafkaException as exc:
            if refresh or exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART:
                raise
            self._stream(name, refresh=True).epoch_of(partition)
        epochs = self._catalog.get(f"stream:{name}")["epochs"]
        if any(e["sealed_ends"] is None for e in epochs[:-1]):
            epochs = self._finish_seal(name)
        for epoch in epochs:
            if epoch["first"] <= partition < epoch["first"] + epoch["count"]:
                local = partition - epoch["first"]
                ends = epoch["sealed_ends"]
                return epoch["topic"], local, (ends[local] if ends is not None else None)
        fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown partition {name}[{partition}]")

    def _finish_seal(self, name: str) -> list[dict[str, Any]]:
        """Seal the epochs a scale left open behind its new one (the scale does it next; whoever looks first,
        if it was killed in between); returns the stream's epochs.

        A sealed partition ends past every record written to it now, committed or not. Every writer looks
        at the catalog after its records landed; one that landed past the end is told PARTITION_SEALED (its
        records stay hidden). Writers began to avoid the old epoch when the new one was written, before this
        look, so nothing acknowledged can land past the end.
        """
        while True:
            entry = self._catalog.get(f"stream:{name}")
            if not entry:
                fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown topic {name!r}")
            epochs = [dict(e) for e in entry["epochs"]]
            sealing = [e for e in epochs[:-1] if e["sealed_ends"] is None]
            if not sealing:
                return epochs
            for epoch in sealing:
                epoch["sealed_ends"] = [self._end_for_seal(epoch["topic"], p) for p in range(epoch["count"])]
            if self._catalog.propose(f"stream:{name}", {**entry, "epochs": epochs}):
                return epochs
            self._catalog.refresh()  # another process sealed it, or scaled again

    def _end_for_seal(self, topic: str, local: int) -> int:
        """Past every record written so far: the high watermark (uncommitted records included), or the end read
        from the tail where that lies further (Tansu's high watermark can stop short of a batch, PEER.md)."""
        return max(self._high_watermark(topic, local), self._tail.end_offset(topic, local)[1])

    def _high_watermark(self, topic: str, local: int) -> int:
        with self._clients_lock:  # one client, whichever threads seal at once
            if self._uncommitted_offsets is None:
                self._uncommitted_offsets = offsets_client({**self._conf, "isolation.level": "read_uncommitted"})
            offsets = self._uncommitted_offsets
        return int(through_leader_changes(
            lambda: offsets.get_watermark_offsets(ck.TopicPartition(topic, local), timeout=ATTEMPT_S),
            f"reading the high watermark of {topic}[{local}]", refresh=lambda: refresh_metadata(offsets, [topic]))[1])

    def create_stream(self, name: str, partitions: int, settings: TopicSettings | None = None,
                      validate_only: bool = False) -> StreamDescription:
        if not isinstance(name, str) or not _TOPIC_NAME.match(name) or _EPOCH_SUFFIX.search(name):
            fail(ErrorCode.TOPIC_EXCEPTION, f"invalid topic name {name!r}: 1-200 of [A-Za-z0-9._-], "
                 "not ending in .epoch-N")
        check_partition_count(name, partitions)
        settings = settings or TopicSettings()
        self._check_batch_room(name, settings)
        self._catalog.refresh()
        if self._catalog.get(f"stream:{name}"):
            fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        topic = self._prefix + name
        ensure_topic(self._admin, topic, partitions, settings, validate_only)
        if validate_only:
            return first_epoch(name, partitions)
        epoch = {"epoch": 0, "first": 0, "count": partitions, "topic": topic, "sealed_ends": None}
        entry = {"epochs": [epoch], "replication_factor": settings.replication_factor, "config": dict(settings.config),
                 "id": uuid.uuid4().hex}
        if not self._catalog.propose(f"stream:{name}", entry):
            fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} was created concurrently")
        return self._stream(name, refresh=False)

    def _check_batch_room(self, name: str, settings: TopicSettings) -> None:
        """INVALID_CONFIG for a ``max.message.bytes`` below the batches onceflow writes: Kafka would refuse them,
        and a committed transaction's merge would fail on them every time (nothing of its group published again)."""
        room = settings.config.get("max.message.bytes")
        needed = max(LIBRDKAFKA_BATCH_SIZE, self._config.message_max_bytes + BATCH_FRAMING)
        if room is not None and (not str(room).isdigit() or int(room) < needed):
            fail(ErrorCode.INVALID_CONFIG, f"topic {name!r}: max.message.bytes={room} is below the {needed} bytes of "
                 f"the record batches onceflow writes (librdkafka's batch.size, or the store's message.max.bytes, "
                 f"{self._config.message_max_bytes}, plus framing); raise it, or lower the store's message.max.bytes")

    def delete_stream(self, name: str) -> None:
        self._stream(name)
        stream_entry = self._catalog.get(f"stream:{name}")
        if not self._catalog.propose(f"stream:{name}", None):
            fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"topic {name!r} changed concurrently; retry", retriable=True)
        topics = [epoch["topic"] for epoch in stream_entry["epochs"]]
        # A consumer that knew a deleted topic crashes librdkafka on Tansu (PEER.md).
        self._close_readers(for_good=False)
        self._open_readers()
        for topic, future in self._admin.delete_topics(topics, operation_timeout=TIMEOUT_S).items():
            try:
                future.result(timeout=TIMEOUT_S)
            except ck.KafkaException as exc:
                raise translate(exc, f"deleting topic {topic!r} of deleted stream {name!r}") from exc

    def list_streams(self) -> list[str]:
        self._catalog.refresh()
        return self._catalog.names("stream:")

    def describe_stream(self, name: str) -> StreamDescription:
        return self._stream(name)

    def scale_stream(self, name: str, partitions: int) -> StreamDescription:
        check_partition_count(name, partitions)
        if self._never_scaled(name):
            fail(ErrorCode.INVALID_REQUEST, f"{name!r} is one of onceflow's own streams, which are never scaled")
        self._stream(name)
        epochs = self._finish_seal(name)
        entry = self._catalog.get(f"stream:{name}")
        current = epochs[-1]
        topic = f"{self._prefix}{name}.epoch-{current['epoch'] + 1}"
        ensure_topic(self._admin, topic, partitions, _settings(entry))  # as the stream's first epoch
        epochs.append({"epoch": current["epoch"] + 1, "first": current["first"] + current["count"],
                       "count": partitions, "topic": topic, "sealed_ends": None})
        if not self._catalog.propose(f"stream:{name}", {**entry, "epochs": epochs}):
            fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"topic {name!r} was scaled concurrently; retry", retriable=True)
        failpoint("kafka.scale.before_seal")
        self._finish_seal(name)  # in two steps: see _finish_seal
        return self._stream(name, refresh=False)

    # -- reads ------------------------------------------------------------------------------------------

    def partition_state(self, stream: str, partition: int) -> PartitionState:
        topic, local, sealed_end = self._topic_of(stream, partition, refresh=not self._never_scaled(stream))
        undecided_from = None
        if sealed_end is None:
            start, end = self._tail.end_offset(topic, local)  # (the last stable offset's: read_committed)
        else:
            start = self._reader.watermarks(topic, local)[0]
            end, undecided_from = self._readable_end(topic, local, start, sealed_end)
        return PartitionState(start, end, sealed_end is not None, lambda: self._tail.last_sequence(
            topic, local, start, end, self._kept_sequence_at(stream, topic, local)), undecided_from)

    def _kept_sequence_at(self, stream: str, topic: str, local: int) -> tuple[str, bytes]:
        """Where a Kafka partition's last sequence number is kept beside its records (``clients.sequences_topic``).
        That topic is made here, once per store, before anything reads or writes it: a look at a topic that does
        not exist waits out the retries of a partition on the move, and making it inside a CAS owner's transaction
        would hold that open."""
        if not self._sequences_made:
            ensure_topic(self._admin, sequences_topic(self._prefix), 1, SEQUENCES_SETTINGS)
            self._sequences_made = True
        entry = self._catalog.get(f"stream:{stream}")
        stream_id = str(entry.get("id", "")) if entry else ""
        return sequences_topic(self._prefix), sequence_key(stream_id, topic, local)

    def _readable_end(self, topic: str, local: int, start: int, sealed_end: int) -> tuple[int, int | None]:
        """A sealed partition's end as its readers reach it: one past its last committed record below the seal, once
        every transaction below the seal is decided (the seal until then: one may still commit). A reader's position
        stops after the last record it got, never on the commit or abort markers after it, so a successor that
        waited for its predecessor's position (or committed offset) to reach the seal waited for good. With it, the
        last stable offset while a transaction below the seal is undecided (:attr:`PartitionState.undecided_from`)."""
        key = (topic, local, sealed_end)  # (a stream deleted and made again seals anew)
        if key in self._readable_ends:
            return self._readable_ends[key], None
        stable = self._tail.stable_ends([(topic, local)])[(topic, local)]
        if stable < sealed_end:
            return sealed_end, stable
        window, last = 8, None
        while last is None:
            first = max(start, sealed_end - window)
            below = [offset_of(m) for m in self._tail.read_range(topic, local, first, sealed_end)
                     if offset_of(m) < sealed_end]
            last = max(below, default=None)
            if first == start:
                break
            window *= 4
        end = start if last is None else last + 1
        self._readable_ends[key] = end  # decided and sealed: it never changes
        return end, None

    def stored_end(self, stream: str, partition: int) -> int:
        topic, local, sealed_end = self._topic_of(stream, partition, refresh=not self._never_scaled(stream))
        return sealed_end if sealed_end is not None else self._high_watermark(topic, local)

    def prefetch(self, positions: Mapping[PartitionKey, int]) -> None:
        wanted = {}
        for (stream, partition), offset in positions.items():
            with contextlib.suppress(KafkaException):  # (a stream gone, say: its read reports it)
                topic, local, _ = self._topic_of(stream, partition, refresh=False)
                wanted[(topic, local)] = offset
        self._reader.prefetch(wanted)

    def read(self, stream: str, partition: int, offset: int, max_records: int) -> list[Message]:
        topic, local, sealed_end = self._topic_of(stream, partition, refresh=False)
        messages = self._reader.read(topic, local, offset, max_records)
        if messages and sealed_end is None and not self._never_scaled(stream):
            sealed_end = self._sealed_past(stream, partition, topic, local, offset_of(messages[-1]))
        if sealed_end is not None:  # records that landed past the seal are not the stream's
            messages = [m for m in messages if offset_of(m) < sealed_end]
        return as_messages(messages, stream, partition)

    def _sealed_past(self, stream: str, partition: int, topic: str, local: int, last: int) -> int | None:
        """The sealed end of a partition read up to offset ``last`` while this view knew no seal of it; None while
        it is open past ``last``.

        A plain writer whose records landed past a seal was told PARTITION_SEALED and rerouted them, so a reader
        must never hand them out. A view may predate the seal, and a seal may come while records are fetched: only
        a look at the catalog after they were fetched decides (as a writer's after its records landed). A seal
        not found then reads a high watermark later, above every record fetched before the look: so one look
        serves every record below the high watermark the last fetch reported, not only those it returned."""
        key = (topic, local)
        if last < self._open_below.get(key, 0):
            return None
        fetched = max(self._reader.fetched_high_watermark(topic, local), last + 1)  # known before the look
        self._catalog.refresh()
        _, _, sealed_end = self._topic_of(stream, partition, refresh=False)  # (a seal proposed is finished here)
        if sealed_end is None:
            self._open_below[key] = max(self._open_below.get(key, 0), fetched)
        return sealed_end

    def truncate_before(self, stream: str, partition: int, offset: int) -> int:
        topic, local, _ = self._topic_of(stream, partition)
        start, end = self._tail.end_offset(topic, local)
        if offset > end:
            fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{stream}[{partition}]: cannot truncate before {offset}, past the "
                 f"end offset {end}")
        if offset <= start:
            return start

        def delete() -> int:
            future = next(iter(self._admin.delete_records([ck.TopicPartition(topic, local, offset)],
                                                          request_timeout=ATTEMPT_S).values()))
            return int(future.result(timeout=ATTEMPT_S).low_watermark)

        # Asked of the leader the admin client last heard of: one that died or moved on since is looked up again.
        return through_leader_changes(delete, f"truncating {stream}[{partition}] (DeleteRecords)",
                                      refresh=lambda: refresh_metadata(self._admin, [topic]))

    # -- writes -------------------------------------------------------------------------------------------

    def open_writer(self, writer_id: str | None = None, delivery_timeout_ms: int | None = None) -> KafkaWriter:
        epoch = 0
        if writer_id is not None:
            while True:  # a newer epoch for this writer id, decided by catalog order
                self._catalog.refresh()
                current = self._catalog.get(f"writer:{writer_id}")
                epoch = current["epoch"] + 1 if current else 0
                if self._catalog.propose(f"writer:{writer_id}", {"epoch": epoch}):
                    break
        return KafkaWriter(self, writer_id, epoch, delivery_timeout_ms)

    # -- consumer groups ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _group_consumer(self, group: str) -> Iterator[ck.Consumer]:
        """The client that commits and reads ``group``'s offsets, while the block runs: one per group, whichever
        threads ask at once (a second one would be left open: its threads and connections). Making one closes
        those nobody used for :data:`GROUP_CLIENT_IDLE_S`: a process that runs for months commits for groups that
        come and go (Connect's connectors), and each client would stay open for good."""
        idle: list[ck.Consumer] = []
        with self._clients_lock:
            client = self._group_clients.get(group)
            if client is None:
                idle = self._take_idle_group_clients()
                client = self._group_clients[group] = _GroupClient(ck.Consumer(
                    {**self._conf, "group.id": self._prefix + group, "enable.auto.commit": False}))
            client.users += 1
        for consumer in idle:
            consumer.close()
        try:
            yield client.consumer
        finally:
            with self._clients_lock:
                client.users -= 1
                client.used = time.monotonic()
                dropped = client.users == 0 and self._group_clients.get(group) is not client
            if dropped:  # the group was deleted while in use here: its last user closes it
                client.consumer.close()

    def _take_idle_group_clients(self) -> list[ck.Consumer]:
        """Forget the group clients nobody uses now nor used for GROUP_CLIENT_IDLE_S; the caller closes them."""
        since = time.monotonic() - GROUP_CLIENT_IDLE_S
        idle = [group for group, c in self._group_clients.items() if c.users == 0 and c.used <= since]
        return [self._group_clients.pop(group).consumer for group in idle]

    def _kafka_offsets(self, offsets: Mapping[PartitionKey, int]) -> list[ck.TopicPartition]:
        """The Kafka topic partition and offset of each (stream, partition id) -> offset."""
        return [ck.TopicPartition(*self._topic_of(stream, partition)[:2], offset)
                for (stream, partition), offset in offsets.items()]

    def _epoch_topics(self, streams: Iterable[str]) -> dict[str, tuple[str, int]]:
        """Kafka topic -> (stream, first partition id) for every epoch of the streams that exist."""
        self._catalog.refresh()
        mapping = {}
        for stream in streams:
            entry = self._catalog.get(f"stream:{stream}")
            for epoch in entry["epochs"] if entry else []:
                mapping[epoch["topic"]] = (stream, epoch["first"])
        return mapping

    def join_group(self, group: str, settings: GroupSettings) -> KafkaGroupMember:
        return KafkaGroupMember(self, group, self._prefix + group, settings)

    def commit_offsets(self, group: str, offsets: Mapping[PartitionKey, int]) -> None:
        kafka_offsets = self._kafka_offsets(offsets)
        try:
            with self._group_consumer(group) as consumer:
                consumer.commit(offsets=kafka_offsets, asynchronous=False)
        except ck.KafkaException as exc:
            raise translate(exc, f"committing offsets of group {group!r}") from exc

    def committed_offsets(self, group: str, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        wanted = {key: self._topic_of(key[0], key[1]) for key in partitions}
        if not wanted:
            return {}
        asked = [ck.TopicPartition(topic, local) for topic, local, _ in wanted.values()]
        with self._group_consumer(group) as consumer:
            found = through_leader_changes(lambda: consumer.committed(asked, timeout=ATTEMPT_S),
                                           f"reading committed offsets of group {group!r}")
        by_topic = {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
        return {key: by_topic[(t, p)] for key, (t, p, _) in wanted.items() if (t, p) in by_topic}

    def close(self) -> None:
        self._close_readers()
        self._catalog.close()
        self._admin = released_admin(f"store {self._url}")

    # -- consumer groups, as the cluster's admin API sees them -----------------------------------------------

    def list_groups(self) -> list[str]:
        """Every group of this store's namespace the cluster knows (onceflow's own readers never join or commit, so
        none of theirs is listed)."""
        result = _admin_result(self._admin.list_consumer_groups(request_timeout=TIMEOUT_S), "listing groups")
        return sorted(g.group_id[len(self._prefix):] for g in result.valid if g.group_id.startswith(self._prefix))

    def describe_group(self, group: str) -> GroupDescription:
        kafka_group = self._prefix + group
        doing = f"describing group {group!r}"
        found = self._described(kafka_group, doing)
        topics = self._epoch_topics(self.list_streams())
        members = tuple(GroupMemberDescription(
            m.member_id, m.client_id, m.host,
            tuple(sorted((topics[tp.topic][0], topics[tp.topic][1] + tp.partition)
                         for tp in (m.assignment.topic_partitions or []) if tp.topic in topics)))
            for m in found.members)
        return GroupDescription(group, members, self._group_offsets(kafka_group, topics, doing))

    def check_member(self, group: str, member_id: str, partitions: Iterable[PartitionKey]) -> None:
        kafka_group = self._prefix + group
        doing = f"looking for member {member_id} of group {group!r}"
        try:
            members = {m.member_id for m in self._described(kafka_group, doing).members}
        except KafkaException as exc:
            if exc.code != ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            members = set()
        if member_id not in members:
            fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group!r}: member {member_id!r} is not in the group (its "
                 f"session ended: {sorted(partitions)} may be another member's now); the commit was refused")
        owned = owned_here(kafka_group, member_id)  # (a member of another process: its membership only)
        lost = sorted(set(partitions) - owned) if owned is not None else []
        if lost:
            fail(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group!r}: member {member_id!r} no longer owns {lost} (the "
                 "group rebalanced and gave them to another member); the commit was refused")

    def _described(self, kafka_group: str, doing: str) -> ConsumerGroupDescription:
        """The cluster's description of a group (a read: asked again while the group's coordinator moves)."""
        def ask() -> ConsumerGroupDescription:  # (through_leader_changes retries confluent-kafka's own errors)
            found: ConsumerGroupDescription = self._admin.describe_consumer_groups(
                [kafka_group], request_timeout=ATTEMPT_S)[kafka_group].result(timeout=ATTEMPT_S)
            return found

        return through_leader_changes(ask, doing)

    def _group_offsets(self, kafka_group: str, topics: Mapping[str, tuple[str, int]], doing: str
                       ) -> dict[PartitionKey, int]:
        """A group's committed next offsets of the partitions of this store's streams."""
        request = [ck.ConsumerGroupTopicPartitions(kafka_group)]
        found = _admin_result(self._admin.list_consumer_group_offsets(request, request_timeout=TIMEOUT_S)
                              [kafka_group], doing)
        return {(topics[tp.topic][0], topics[tp.topic][1] + tp.partition): tp.offset
                for tp in found.topic_partitions or [] if tp.topic in topics and tp.offset >= 0}

    def delete_group(self, group: str) -> None:
        kafka_group = self._prefix + group
        with self._clients_lock:
            client = self._group_clients.pop(group, None)
            unused = client is not None and client.users == 0  # else its last user closes it
        if client is not None and unused:
            client.consumer.close()
        _admin_result(self._admin.delete_consumer_groups([kafka_group], request_timeout=TIMEOUT_S)[kafka_group],
                      f"deleting group {group!r}")

    # -- reads by timestamp --------------------------------------------------------------------------------

    def offset_for_time(self, stream: str, partition: int, timestamp: int) -> int | None:
        """Kafka's own lookup (ListOffsets by timestamp, read_committed) on the partition's epoch topic."""
        return self._list_offset(stream, partition, OffsetSpec.for_timestamp(timestamp))

    def max_timestamp(self, stream: str, partition: int) -> tuple[int, int] | None:
        """Kafka's own MAX_TIMESTAMP lookup (KIP-734) on the partition's epoch topic."""
        topic, local, sealed_end = self._topic_of(stream, partition)
        spec = OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
        info = self._list_offsets_info(topic, local, spec, f"{stream}[{partition}]")
        if info.offset < 0 or (sealed_end is not None and info.offset >= sealed_end):
            return None
        return int(info.offset), int(info.timestamp)

    def brokers(self) -> dict[int, tuple[str, int]]:
        metadata = through_leader_changes(lambda: self._admin.list_topics(timeout=TIMEOUT_S), "reading the brokers")
        return {int(b.id): (str(b.host), int(b.port)) for b in metadata.brokers.values()}

    def replicas(self, stream: str) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]]:
        """From the cluster's metadata of each epoch's topic."""
        self._stream(stream)
        out = {}
        for epoch in self._catalog.get(f"stream:{stream}")["epochs"]:
            topic = epoch["topic"]
            metadata = through_leader_changes(functools.partial(self._admin.list_topics, topic, timeout=TIMEOUT_S),
                                              f"reading the metadata of {topic!r}")
            for local, p in metadata.topics[topic].partitions.items():
                out[epoch["first"] + local] = (int(p.leader), tuple(p.replicas), tuple(p.isrs))
        return out

    def _list_offset(self, stream: str, partition: int, spec: OffsetSpec) -> int | None:
        topic, local, sealed_end = self._topic_of(stream, partition)
        offset = int(self._list_offsets_info(topic, local, spec, f"{stream}[{partition}]").offset)
        return None if offset < 0 or (sealed_end is not None and offset >= sealed_end) else offset

    def _list_offsets_info(self, topic: str, local: int, spec: OffsetSpec, where: str) -> Any:
        tp = ck.TopicPartition(topic, local)

        def ask() -> Any:
            futures = self._admin.list_offsets({tp: spec}, isolation_level=ck.IsolationLevel.READ_COMMITTED,
                                               request_timeout=ATTEMPT_S)
            return next(iter(futures.values())).result(timeout=ATTEMPT_S)

        return through_leader_changes(ask, f"{where}: looking up an offset ({spec.__class__.__name__})",
                                      refresh=lambda: refresh_metadata(self._admin, [topic]))



def _admin_result(future: Any, doing: str) -> Any:
    """An admin future's result, its error as onceflow's."""
    try:
        return future.result(timeout=TIMEOUT_S)
    except ck.KafkaException as exc:
        raise translate(exc, doing) from exc
    except TimeoutError as exc:
        raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"{doing}: no answer within {TIMEOUT_S:.0f}s",
                                        retriable=True)) from exc


BATCH_FRAMING = 1024  # a record batch's header and its one record's framing, beyond the record's own bytes


def _settings(entry: Mapping[str, Any]) -> TopicSettings:
    """A stream's topic settings, as its catalog entry keeps them (none in entries written before they were)."""
    return TopicSettings(entry.get("replication_factor", -1), entry.get("config", {}))


def _describe(name: str, entry: Mapping[str, Any]) -> StreamDescription:
    epochs = tuple(
        EpochDescription(e["epoch"], tuple(range(e["first"], e["first"] + e["count"])), e["sealed_ends"] is not None)
        for e in entry["epochs"]
    )
    return StreamDescription(name, epochs, _settings(entry))



def _check_reachable(conf: Mapping[str, Any], timeout_s: float) -> AdminClient:
    """An admin client of the cluster, once a broker answered: fails fast, naming the address, when none does
    (instead of hanging in the first request); a setting librdkafka refuses is INVALID_CONFIG."""
    try:
        admin = AdminClient(dict(conf))
    except ck.KafkaException as exc:
        raise KafkaException(KafkaError(ErrorCode.INVALID_CONFIG, f"librdkafka refused the config: "
                                        f"{exc.args[0].str()}")) from exc
    try:
        admin.list_topics(timeout=timeout_s)
    except ck.KafkaException as exc:
        raise KafkaException(KafkaError(
            ErrorCode._TRANSPORT, f"no Kafka broker answered at {conf['bootstrap.servers']} within {timeout_s:g}s "
            f"(store.connect.timeout.ms): {exc.args[0].str()}", retriable=True)) from exc
    return admin
