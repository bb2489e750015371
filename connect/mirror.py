"""Mirror connectors: a topic of any Kafka cluster into onceflow streams, or onceflow streams into a Kafka topic,
exactly once either way. Keys follow MirrorMaker 2 (``MirrorSourceConnector``) where they apply.

``MirrorSourceConnector`` (Kafka -> onceflow) reads ``topics`` (regular expressions, minus ``topics.exclude``) of
the cluster at ``source.cluster.bootstrap.servers`` with a plain consumer (``source.cluster.*``, then ``consumer.*``,
then ``source.consumer.*`` client settings; ``isolation.level`` read_committed and ``auto.offset.reset`` earliest
unless set) and writes each record to the stream the replication policy names (``<source.cluster.alias>.<topic>``,
or the same name with ``IdentityReplicationPolicy``), same partition, key, value, headers and timestamp. Its
source partition is MM2's ``{"cluster": alias, "topic": t, "partition": p}`` and its source offset MM2's
``{"offset": n}``, the offset of the record (the task resumes at n + 1); the worker commits records and offsets
in one onceflow transaction, so after any crash the task seeks its consumer to exactly where the visible
records end. A stream that does not exist is created with the source topic's partition count when
``target.cluster.store.url`` names the worker's store (MM2's target admin client); otherwise create the streams
first (a missing one is created by the worker with one partition).

``MirrorSinkConnector`` (onceflow -> Kafka) writes consumed records to ``<source.cluster.alias>.<stream>`` (by the
replication policy) on the cluster at ``target.cluster.bootstrap.servers`` (``target.cluster.*``, ``producer.*``,
``target.producer.*``), same partition (a missing topic is created, a short one grown), with a transactional
producer whose ``transactional.id`` is ``onceflow-mirror-<connector>-<task index>``: a restarted task fences its
zombie. Each ``put`` is one Kafka transaction holding the records *and* the next offset of each stream partition
they came from, written to ``offset.storage.topic`` on the target cluster (compacted, key
``["<connector>", "<stream>", <partition>]``, value ``{"offset": next}``), so the copy and its progress commit
together without two-phase commit (as the database sink keeps its offsets in the database). A task reads that
topic (read_committed) whenever it is given partitions and resumes there, not from the worker's group offsets;
a record below its partition's stored offset, delivered again after a crash, is skipped. Kafka's group offset
commit is not used: a group's offsets for topics that do not exist on the target cluster are not reliable.

Keys and values are copied as bytes with ``ByteArrayConverter`` (set ``key.converter`` and ``value.converter``
to it, as MirrorMaker does); with other converters a sink writes text as UTF-8 and anything else as JSON.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient as KafkaAdminClient
from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, Importance, Type, at_least, non_empty
from onceflow.connect.connector import ExactlyOnceSupport, SinkConnector, SourceConnector
from onceflow.connect.plugins import prefixed
from onceflow.connect.records import OPTIONAL_BYTES_SCHEMA, SinkRecord, SourceRecord
from onceflow.connect.task import SinkTask, SourceTask
from onceflow.connector.admin import AdminClient
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.store import TopicSettings
from onceflow.connector.store.kafka.clients import (
    as_bytes,
    ensure_topic,
    offsets_client,
    translate,
    translating,
)
from onceflow.connector.topic import NewTopic, TopicPartition

log = logging.getLogger(__name__)

DEFAULT_POLICY = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
DEFAULT_EXCLUDE = r".*[\-\.]internal,.*\.replica,__.*"
ASSIGNED = "task.assigned.partitions"  # MM2's task key: "topic-partition", comma-separated
TASK_INDEX = "task.index"
MAX_POLL_RECORDS = 500
_POLL_WAIT_S = 0.1
_TIMEOUT_S = 30.0
_OFFSETS_READ_TIMEOUT_S = 120.0
_PASSING = (ck.KafkaError._PARTITION_EOF, ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN)
"""Consumer errors the consumer recovers from by itself (as librdkafka says of its consumer errors)."""
_NOT_CLIENT_KEYS = ("alias", "store.url")  # source.cluster.* / target.cluster.* keys that are not client settings


def _policy_keys(d: ConfigDef, alias_default: str) -> ConfigDef:
    return (d.define("source.cluster.alias", Type.STRING, alias_default, non_empty, Importance.HIGH,
                     "The name of the cluster records come from (the prefix of the mirrored topic's name)")
            .define("replication.policy.class", Type.STRING, DEFAULT_POLICY, None, Importance.LOW,
                    "DefaultReplicationPolicy: <source.cluster.alias><separator><topic>; IdentityReplicationPolicy: "
                    "the same name")
            .define("replication.policy.separator", Type.STRING, ".", None, Importance.LOW,
                    "The separator of DefaultReplicationPolicy"))


def _source_def() -> ConfigDef:
    d = (ConfigDef()
         .define("source.cluster.bootstrap.servers", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                 documentation="The Kafka cluster to read from (other source.cluster.* keys: its client settings)")
         .define("topics", Type.LIST, ".*", None, Importance.HIGH, "Topics to mirror: names or regular "
                 "expressions, comma-separated")
         .define("topics.exclude", Type.LIST, DEFAULT_EXCLUDE, None, Importance.HIGH, "Topics not to mirror "
                 "(regular expressions)")
         .define("target.cluster.store.url", Type.STRING, "", None, Importance.MEDIUM, "The worker's store: "
                 "missing streams are created with the source topic's partition count (else create them first)")
         .define("refresh.topics.enabled", Type.BOOLEAN, "true", None, Importance.LOW, "Look for new topics and "
                 "partitions periodically")
         .define("refresh.topics.interval.seconds", Type.LONG, "600", at_least(1), Importance.LOW,
                 "How often to look for new topics and partitions"))
    return _policy_keys(d, "source")


def _sink_def() -> ConfigDef:
    d = (ConfigDef()
         .define("target.cluster.bootstrap.servers", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                 documentation="The Kafka cluster to write to (other target.cluster.* keys: its client settings)")
         .define("offset.storage.topic", Type.STRING, "onceflow-mirror-offsets.internal", non_empty,
                 Importance.MEDIUM, "The topic of the target cluster that keeps each stream partition's next "
                 "offset, written in the records' transaction")
         .define("offset.storage.replication.factor", Type.SHORT, "-1", None, Importance.LOW,
                 "Replication factor of offset.storage.topic (-1: the cluster's default)"))
    return _policy_keys(d, "source")


def remote_topic(settings: Mapping[str, Any], topic: str) -> str:
    """The mirrored name of ``topic`` by ``replication.policy.class`` (MM2's ``formatRemoteTopic``)."""
    policy = settings["replication.policy.class"]
    if policy in (IDENTITY_POLICY, IDENTITY_POLICY.rsplit(".", 1)[-1]):
        return topic
    if policy not in (DEFAULT_POLICY, DEFAULT_POLICY.rsplit(".", 1)[-1]):
        fail(ErrorCode.INVALID_CONFIG, f"replication.policy.class {policy!r}: expected {DEFAULT_POLICY} or "
             f"{IDENTITY_POLICY}")
    return f"{settings['source.cluster.alias']}{settings['replication.policy.separator']}{topic}"


def client_conf(props: Mapping[str, str], cluster: str, client: str) -> dict[str, str]:
    """MM2's layering of a client's settings: ``<cluster>.cluster.*``, then ``<client>.*``, then
    ``<cluster>.<client>.*`` (e.g. source.cluster.*, consumer.*, source.consumer.*)."""
    conf = {k: v for k, v in prefixed(props, f"{cluster}.cluster.").items() if k not in _NOT_CLIENT_KEYS}
    return {**conf, **prefixed(props, f"{client}."), **prefixed(props, f"{cluster}.{client}.")}


def _admin_conf(props: Mapping[str, str], cluster: str) -> dict[str, Any]:
    return {k: v for k, v in client_conf(props, cluster, "admin").items() if k != "max.poll.records"}


def encode_partition(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def decode_partition(text: str) -> tuple[str, int]:
    topic, _, partition = text.strip().rpartition("-")
    if not topic or not partition.isdigit():
        fail(ErrorCode.INVALID_CONFIG, f"{ASSIGNED}: {text!r} is not <topic>-<partition>")
    return topic, int(partition)


def source_partition(alias: str, topic: str, partition: int) -> dict[str, Any]:
    """MM2's wrapped source partition."""
    return {"cluster": alias, "partition": partition, "topic": topic}


# -- Kafka -> onceflow ---------------------------------------------------------------------------------------------


class MirrorSourceConnector(SourceConnector):
    """Shares the matching topics' partitions out among up to ``tasks.max`` tasks; see the module docstring."""

    def __init__(self) -> None:
        self._props: dict[str, str] = {}
        self._partitions: list[tuple[str, int]] = []
        self._stopped = threading.Event()
        self._refresher: threading.Thread | None = None

    def version(self) -> str:
        return __version__

    def config(self) -> ConfigDef:
        return _source_def()

    def start(self, props: Mapping[str, str]) -> None:
        settings = _source_def().parse(props)
        self._props = dict(props)
        counts = self._source_topics(settings)
        self._partitions = sorted((t, p) for t, n in counts.items() for p in range(n))
        if settings["target.cluster.store.url"]:
            self._create_streams(settings, counts)
        self._stopped.clear()
        if settings["refresh.topics.enabled"]:
            interval = settings["refresh.topics.interval.seconds"]
            self._refresher = threading.Thread(target=self._refresh, args=(settings, interval), daemon=True,
                                               name=f"mirror-refresh-{props.get('name', '')}")
            self._refresher.start()

    def _source_topics(self, settings: Mapping[str, Any]) -> dict[str, int]:
        """Partition count of each topic of the source cluster to mirror."""
        admin = KafkaAdminClient(_admin_conf(self._props, "source"))
        with translating("MirrorSource: listing the source cluster's topics"):
            metadata = admin.list_topics(timeout=_TIMEOUT_S)
        included = [re.compile(p.strip()) for p in settings["topics"] if p.strip()]
        excluded = [re.compile(p.strip()) for p in settings["topics.exclude"] if p.strip()]
        return {name: len(topic.partitions) for name, topic in metadata.topics.items()
                if topic.error is None and any(p.fullmatch(name) for p in included)
                and not any(p.fullmatch(name) for p in excluded)}

    def _create_streams(self, settings: Mapping[str, Any], counts: Mapping[str, int]) -> None:
        admin = AdminClient({"store.url": settings["target.cluster.store.url"]})
        existing = set(admin.list_topics().topics)
        missing = [NewTopic(remote_topic(settings, t), n) for t, n in counts.items()
                   if remote_topic(settings, t) not in existing]
        if not missing:
            return
        for topic, future in admin.create_topics(missing).items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise KafkaException(KafkaError(exc.code, f"MirrorSource: creating stream {topic}: {exc}")) from exc

    def _refresh(self, settings: Mapping[str, Any], interval_s: float) -> None:
        """New topics or partitions of the source cluster: new task configs (MM2's topic refresh)."""
        while not self._stopped.wait(interval_s):
            try:
                counts = self._source_topics(settings)
                found = sorted((t, p) for t, n in counts.items() for p in range(n))
                if found != self._partitions:
                    if settings["target.cluster.store.url"]:
                        self._create_streams(settings, counts)
                    self._partitions = found
                    self.context.request_task_reconfiguration()
            except KafkaException:  # the source cluster is away for now: the next look tries again
                continue

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        """MM2's round-robin: partition i goes to task i mod n."""
        partitions = self._partitions  # read once: the refresh thread may replace it meanwhile
        count = min(max_tasks, len(partitions))
        shares: list[list[str]] = [[] for _ in range(count)]
        for i, (topic, partition) in enumerate(partitions):
            shares[i % count].append(encode_partition(topic, partition))
        return [{**self._props, ASSIGNED: ",".join(share), TASK_INDEX: str(i)} for i, share in enumerate(shares)]

    def task_class(self) -> type[MirrorSourceTask]:
        return MirrorSourceTask

    def stop(self) -> None:
        self._stopped.set()

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport:
        return ExactlyOnceSupport.SUPPORTED

    def alter_offsets(self, props: Mapping[str, str], offsets: Mapping[str, Any]) -> bool:
        """MM2's checks: each partition has cluster, topic and partition; each offset is an ``offset`` >= 0."""
        for partition, offset in offsets.items():
            wrapped = json.loads(partition) if isinstance(partition, str) else partition
            if not isinstance(wrapped, dict) or not {"cluster", "topic", "partition"} <= set(wrapped):
                fail(ErrorCode.INVALID_REQUEST, f"Source partition {partition} must have the keys cluster, topic "
                     "and partition")
            value = offset.get("offset") if isinstance(offset, dict) else None
            if offset is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                fail(ErrorCode.INVALID_REQUEST, f"The value for the 'offset' key in the offset of partition "
                     f"{partition} is expected to be a non-negative integer, got {value!r}")
        return True


class MirrorSourceTask(SourceTask):
    """Reads its partitions from the committed offsets on; see the module docstring."""

    def __init__(self) -> None:
        self._consumer: ck.Consumer | None = None
        self._stopped = threading.Event()

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self._settings = _source_def().parse(props)
        self._alias = self._settings["source.cluster.alias"]
        conf = client_conf(props, "source", "consumer")
        self._batch = int(conf.pop("max.poll.records", MAX_POLL_RECORDS))
        conf.setdefault("group.id", f"onceflow-mirror-{props.get('name', '')}")  # never joined nor committed
        conf.setdefault("isolation.level", "read_committed")
        reset = conf.pop("auto.offset.reset", "earliest")
        conf["enable.auto.commit"] = "false"
        self._topics: dict[str, str] = {}
        assigned = [decode_partition(p) for p in props.get(ASSIGNED, "").split(",") if p.strip()]
        reader = self.context.offset_storage_reader()
        start = ck.OFFSET_BEGINNING if reset in ("earliest", "smallest", "beginning") else ck.OFFSET_END
        positions = []
        for topic, partition in assigned:
            committed = reader.offset(source_partition(self._alias, topic, partition))
            offset = committed.get("offset") if committed else None
            positions.append(ck.TopicPartition(topic, partition, offset + 1 if isinstance(offset, int) else start))
            self._topics[topic] = remote_topic(self._settings, topic)
        with translating("MirrorSource: starting the source cluster's consumer"):
            self._consumer = ck.Consumer(conf)
            self._consumer.assign(positions)

    def poll(self) -> list[SourceRecord] | None:
        consumer = self._consumer
        if consumer is None or not self._topics:
            self._stopped.wait(_POLL_WAIT_S)  # no partitions (yet): idle until stopped or reconfigured
            return None
        with translating("MirrorSource: reading the source cluster"):
            messages = consumer.consume(self._batch, _POLL_WAIT_S)
        records = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal() or not (error.retriable() or error.code() in _PASSING):
                    raise translate(error, f"MirrorSource: reading {message.topic()}[{message.partition()}]")
                if error.code() != ck.KafkaError._PARTITION_EOF:
                    log.warning("MirrorSource: the source cluster: %s (the consumer recovers)", error.str())
                continue
            records.append(self._record(message))
        return records

    def _record(self, message: ck.Message) -> SourceRecord:
        topic, partition = message.topic() or "", message.partition() or 0
        kind, when = message.timestamp()
        return SourceRecord(source_partition=source_partition(self._alias, topic, partition),
                            source_offset={"offset": message.offset()}, topic=self._topics[topic],
                            kafka_partition=partition, key_schema=OPTIONAL_BYTES_SCHEMA, key=message.key(),
                            value_schema=OPTIONAL_BYTES_SCHEMA, value=message.value(),
                            timestamp=when if kind != ck.TIMESTAMP_NOT_AVAILABLE else None,
                            headers=_headers(message))

    def stop(self) -> None:
        self._stopped.set()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _headers(message: ck.Message) -> tuple[tuple[str, bytes | None], ...]:
    raw = message.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple((name, as_bytes(value)) for name, value in items)


# -- onceflow -> Kafka ---------------------------------------------------------------------------------------------


class MirrorSinkConnector(SinkConnector):
    """Up to ``tasks.max`` tasks, each with a ``task.index`` for its transactional.id; see the module docstring."""

    def __init__(self) -> None:
        self._props: dict[str, str] = {}

    def version(self) -> str:
        return __version__

    def config(self) -> ConfigDef:
        return _sink_def()

    def start(self, props: Mapping[str, str]) -> None:
        remote_topic(_sink_def().parse(props), "t")  # the policy is one we know
        self._props = dict(props)

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [{**self._props, TASK_INDEX: str(i)} for i in range(max_tasks)]

    def task_class(self) -> type[MirrorSinkTask]:
        return MirrorSinkTask

    def stop(self) -> None:
        """Nothing to release: the tasks do the work."""


def _as_bytes(data: Any) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def offsets_key(connector: str, topic: str, partition: int) -> bytes:
    return json.dumps([connector, topic, partition], separators=(",", ":")).encode()


class MirrorSinkTask(SinkTask):
    """Each ``put`` is one Kafka transaction with the records and their offsets; see the module docstring."""

    def __init__(self) -> None:
        self._producer: ck.Producer | None = None

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self._settings = _sink_def().parse(props)
        self._connector = props.get("name", "")
        self._offsets_topic: str = self._settings["offset.storage.topic"]
        self._admin = KafkaAdminClient(_admin_conf(props, "target"))
        self._consumer_conf = client_conf(props, "target", "consumer")
        self._consumer_conf.pop("max.poll.records", None)
        self._stored: dict[tuple[str, int], int] = {}  # stream partition -> next offset, as the target holds it
        self._resuming: set[tuple[str, int]] = set()  # opened, the consumer not yet known to be at the stored offset
        self._partitions: dict[str, int] = {}  # target topic -> partitions known
        with translating(f"MirrorSink: the offsets topic {self._offsets_topic}"):
            ensure_topic(self._admin, self._offsets_topic, 1, TopicSettings(
                replication_factor=self._settings["offset.storage.replication.factor"],
                config={"cleanup.policy": "compact"}))
        conf = {**client_conf(props, "target", "producer"),
                "transactional.id": f"onceflow-mirror-{self._connector}-{props.get(TASK_INDEX, '0')}"}
        conf.pop("max.poll.records", None)
        with translating("MirrorSink: starting the target cluster's transactional producer"):
            self._producer = ck.Producer(conf)
            self._producer.init_transactions(_TIMEOUT_S)  # fences the zombie, aborts its open transaction

    def open(self, partitions: Sequence[TopicPartition]) -> None:
        """Resume these partitions where the target cluster's offsets say (read now: another task may have
        moved them since this one started)."""
        stored = self._read_offsets()
        rewinds = {}
        for tp in partitions:
            where = (tp.topic, tp.partition)
            if where in stored:
                self._stored[where] = stored[where]
                self._resuming.add(where)
                rewinds[TopicPartition(tp.topic, tp.partition)] = stored[where]
        if rewinds:
            self.context.offset(rewinds)

    def close(self, partitions: Sequence[TopicPartition]) -> None:
        for tp in partitions:
            self._stored.pop((tp.topic, tp.partition), None)
            self._resuming.discard((tp.topic, tp.partition))

    def _read_offsets(self) -> dict[tuple[str, int], int]:
        """This connector's committed offsets in the offsets topic, read to its end (read_committed)."""
        ends = self._ends()
        found: dict[tuple[str, int], int] = {}
        if not any(ends.values()):
            return found
        consumer = ck.Consumer({**self._consumer_conf, "group.id": f"onceflow-mirror-offsets-{uuid.uuid4().hex}",
                                "enable.auto.commit": "false", "isolation.level": "read_committed",
                                "enable.partition.eof": "true"})
        try:
            consumer.assign([ck.TopicPartition(self._offsets_topic, p, ck.OFFSET_BEGINNING) for p in ends])
            waiting = {p for p, end in ends.items() if end > 0}
            deadline = time.monotonic() + _OFFSETS_READ_TIMEOUT_S
            while waiting:
                if time.monotonic() > deadline:
                    fail(ErrorCode._TIMED_OUT, f"MirrorSink: {self._offsets_topic} not read to its end within "
                         f"{_OFFSETS_READ_TIMEOUT_S:.0f}s (a transaction open on it?)", retriable=True)
                for message in consumer.consume(1000, _POLL_WAIT_S):
                    self._offsets_entry(message, ends, waiting, found)
        finally:
            consumer.close()
        return found

    def _ends(self) -> dict[int, int]:
        """Each partition's high watermark of the offsets topic."""
        client = offsets_client(self._consumer_conf)
        try:
            with translating(f"MirrorSink: the end of {self._offsets_topic}"):
                topic = client.list_topics(self._offsets_topic, timeout=_TIMEOUT_S).topics[self._offsets_topic]
                return {p: client.get_watermark_offsets(ck.TopicPartition(self._offsets_topic, p), _TIMEOUT_S,
                                                        cached=False)[1] for p in topic.partitions}
        finally:
            client.close()

    def _offsets_entry(self, message: ck.Message, ends: Mapping[int, int], waiting: set[int],
                       found: dict[tuple[str, int], int]) -> None:
        error = message.error()
        if error is not None:
            if error.code() != ck.KafkaError._PARTITION_EOF:
                raise translate(error, f"MirrorSink: reading {self._offsets_topic}")
            if (message.offset() or 0) >= ends[message.partition() or 0]:
                waiting.discard(message.partition() or 0)
            return
        try:
            connector, topic, partition = json.loads(message.key() or b"")
            offset = json.loads(message.value() or b"null")
        except (ValueError, TypeError):
            return  # not an entry of ours
        if connector == self._connector and isinstance(offset, dict) and isinstance(offset.get("offset"), int):
            found[(topic, partition)] = offset["offset"]

    def put(self, records: Sequence[SinkRecord]) -> None:
        producer = self._producer
        if producer is None:
            fail(ErrorCode._STATE, "MirrorSinkTask: not started")
        chosen = self._new_records(records)
        if not chosen:
            return
        reached: dict[tuple[str, int], int] = {}
        self._delivery_error: ck.KafkaError | None = None
        try:
            producer.begin_transaction()
            for record in chosen:
                self._produce(producer, record)
                reached[(record.topic, record.kafka_partition or 0)] = record.kafka_offset + 1
            for (topic, partition), offset in reached.items():
                self._send(producer, self._offsets_topic, json.dumps({"offset": offset}).encode(),
                           offsets_key(self._connector, topic, partition))
            producer.commit_transaction(_TIMEOUT_S)
        except ck.KafkaException as exc:
            self._abort(producer, exc)
            first = f" (first: {self._delivery_error.str()})" if self._delivery_error is not None else ""
            raise translate(exc, f"MirrorSink: writing to {self._settings['target.cluster.bootstrap.servers']}"
                            f"{first}") from exc
        self._stored.update(reached)

    def _new_records(self, records: Sequence[SinkRecord]) -> list[SinkRecord]:
        """The records not written yet. A partition just opened whose first record lies beyond its stored offset
        was consumed from further on (the group's offsets are ahead): its records wait for the rewind to the
        stored offset that ``open`` asked for."""
        chosen: list[SinkRecord] = []
        skipped: set[tuple[str, int]] = set()
        resumed: dict[tuple[str, int], int] = {}
        for record in records:
            where = (record.topic, record.kafka_partition or 0)
            stored = self._stored.get(where)
            if where in self._resuming:
                self._resuming.discard(where)
                resumed[where] = stored if stored is not None else record.kafka_offset
                if stored is not None and record.kafka_offset > stored:
                    skipped.add(where)
            if where in skipped or (stored is not None and record.kafka_offset < stored):
                continue
            chosen.append(record)
            if where in resumed:
                resumed[where] = record.kafka_offset + 1
        resumed = {w: o for w, o in resumed.items() if w not in skipped}
        if resumed:  # the consumer is past the stored offset already: the rewind open() asked for is not needed
            self.context.offset({TopicPartition(t, p): o for (t, p), o in resumed.items()})
        return chosen

    def _produce(self, producer: ck.Producer, record: SinkRecord) -> None:
        topic = remote_topic(self._settings, record.topic)
        partition = record.kafka_partition or 0
        self._ensure_partition(producer, topic, partition)
        self._send(producer, topic, _as_bytes(record.value), _as_bytes(record.key), partition=partition,
                   headers=list(record.headers) or None, timestamp=record.timestamp or 0)

    def _delivered(self, error: ck.KafkaError | None, message: ck.Message) -> None:
        if error is not None and self._delivery_error is None:
            self._delivery_error = error

    def _send(self, producer: ck.Producer, topic: str, value: bytes | None, key: bytes | None, **kwargs: Any) -> None:
        """``produce()``, waiting for room while the producer's queue is full."""
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=self._delivered, **kwargs)
                return
            except BufferError:
                producer.poll(_POLL_WAIT_S)

    def _ensure_partition(self, producer: ck.Producer, topic: str, partition: int) -> None:
        """The target topic exists with ``partition``: created with as many partitions as this task's assignment
        of the stream implies, or grown; then the producer is shown the new partitions (it fails a record for a
        partition its metadata does not have at once, without asking again)."""
        if self._partitions.get(topic, 0) > partition:
            return
        with translating(f"MirrorSink: the target topic {topic}"):
            wanted = max([partition + 1, *(tp.partition + 1 for tp in self.context.assignment())])
            if self._partition_count(topic) == 0:
                ensure_topic(self._admin, topic, wanted)  # another task may create it first, with fewer
            if self._partition_count(topic) <= partition:
                future = self._admin.create_partitions([NewPartitions(topic, wanted)])[topic]
                try:
                    future.result(timeout=_TIMEOUT_S)
                except ck.KafkaException as exc:
                    if exc.args[0].code() != ck.KafkaError.INVALID_PARTITIONS:  # another task grew it first
                        raise
            self._partitions[topic] = self._await_partition(producer, topic, partition)

    def _partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` on the target cluster (0: none). All topics are asked for: a metadata request
        naming the topic would have the broker auto-create it."""
        found = self._admin.list_topics(timeout=_TIMEOUT_S).topics.get(topic)
        return len(found.partitions) if found is not None and found.error is None else 0

    @staticmethod
    def _await_partition(producer: ck.Producer, topic: str, partition: int) -> int:
        """The partition count of ``topic`` once the producer's metadata has ``partition``."""
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            found = producer.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
            if found is not None and found.error is None and len(found.partitions) > partition:
                return len(found.partitions)
            if time.monotonic() > deadline:
                fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"MirrorSink: {topic}[{partition}] not known to the producer "
                     f"after {_TIMEOUT_S:.0f}s", retriable=True)
            time.sleep(_POLL_WAIT_S)

    @staticmethod
    def _abort(producer: ck.Producer, exc: ck.KafkaException) -> None:
        """Abort the failed transaction if it can be (a fenced producer cannot: it ends here)."""
        error = exc.args[0]
        if isinstance(error, ck.KafkaError) and error.txn_requires_abort():
            with contextlib.suppress(ck.KafkaException):  # else it times out on the broker; the first error fails
                producer.abort_transaction(_TIMEOUT_S)

    def pre_commit(self, current_offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The target cluster holds the offsets; the group's copy (committed next) only shows progress."""
        return {tp: self._stored[(tp.topic, tp.partition)] for tp in current_offsets
                if (tp.topic, tp.partition) in self._stored}

    def stop(self) -> None:
        if self._producer is not None:
            self._producer.close()  # nothing is pending: each put committed or aborted its transaction
            self._producer = None
