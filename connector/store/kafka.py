"""The Kafka backend (``kafka://host:port[,host:port...][/namespace]``), on confluent-kafka.

Mapping:
- A stream's epoch 0 is the Kafka topic of the stream's name (prefixed ``namespace.`` if the URL has one), so
  plain Kafka consumers read it as usual; epoch ``e`` >= 1 is the topic ``<that name>.epoch-<e>``. Partition ids
  are global across epochs, as on every backend. A scale records each old partition's end offset in the
  catalog (:mod:`onceflow.connector.store.kafka_catalog`); records that land past it are hidden from onceflow readers
  and their writer is told ``PARTITION_SEALED``.
- Plain appends use Kafka's idempotent producer. A ``writer.id`` is a ``transactional.id``: a newer writer
  fences the older one at ``init_transactions``, and each append is one Kafka transaction.
- CAS appends go through a fenced owner per partition (``transactional.id`` ``onceflow-cas-<topic>-<p>``): it
  reads the tail after fencing and checks the expectation before each transactional write, so of two racing
  writers at least one fails. A writer keeps its ownership until a rival takes it, and checks an expectation
  that matches what its own last append left without reading the tail again (a rival must fence it first; a
  plain append in between makes the write land elsewhere, which aborts it). A commit whose outcome the broker
  does not tell (an EndTxn error, a timeout) is decided by reading the transaction's first record back.
  Offsets are Kafka's: a transactional write is followed by a commit marker, so offsets after one are not dense.
- Consumer groups are Kafka's own (:mod:`onceflow.connector.store.kafka_group`); committed offsets live in Kafka's group
  coordinator.

Needs Kafka 2.5+ features: idempotent and transactional producers, ``read_committed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.message import Message
from onceflow.connector.store import batch_codec
from onceflow.connector.store.contract import (
    NO_SEQUENCE,
    AppendCallback,
    AppendResult,
    Batch,
    Condition,
    EpochDescription,
    GroupSettings,
    OffsetCommit,
    PartitionKey,
    PartitionState,
    Record,
    StreamDescription,
    TopicSettings,
    check_atomic_batches,
    check_partition_count,
    first_epoch,
)
from onceflow.connector.store.kafka_catalog import (
    TIMEOUT_S,
    Catalog,
    delivery_error,
    drain,
    ensure_topic,
    is_internal,
    offset_of,
    offsets_client,
    refresh_metadata,
    through_leader_changes,
    translate,
)
from onceflow.connector.store.kafka_group import KafkaGroupMember
from onceflow.connector.store.kafka_probe import require_hidden_aborts
from onceflow.connector.threads import one_at_a_time

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger(f"{__name__}.librdkafka")

SEQUENCE_HEADER = "onceflow.sequence"
OWNER_COMMIT_TIMEOUT_S = 10.0
"""A fenced owner's commit that takes longer is given up (it is retried with a fresh owner): a fenced owner's
commit can hang instead of failing (Tansu, integration/PEER.md)."""
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_EPOCH_SUFFIX = re.compile(r"\.epoch-\d+$")


class KafkaStore:
    """A store on a Kafka cluster; see the module docstring for the mapping."""

    def __init__(self, location: str, config: StoreConfig) -> None:
        bootstrap, _, namespace = location.partition("/")
        self._url = f"kafka://{location}"
        self._prefix = f"{namespace}." if namespace else ""
        self._config = config
        self._conf: dict[str, Any] = {"socket.connection.setup.timeout.ms": config.connect_timeout_ms,
                                      **dict(config.kafka_settings), "bootstrap.servers": bootstrap}
        self._admin = _check_reachable(self._conf, config.connect_timeout_ms / 1000)  # topics, truncation
        self._catalog = Catalog(self._conf, self._admin, f"__onceflow_catalog{'.' + namespace if namespace else ''}")
        self._group_consumers: dict[str, ck.Consumer] = {}
        self._uncommitted_offsets: ck.Consumer | None = None  # high watermarks, for seals
        self._open_readers()

    @property
    def url(self) -> str:
        return self._url

    @property
    def atomic_conditions(self) -> int:
        return 1  # checked by the fenced owner of what it is about (KafkaWriter._guard)

    def _require_hidden_aborts(self, doing: str) -> None:
        """Before a first transactional producer: refuse a broker that shows aborted records (kafka_probe)."""
        require_hidden_aborts(self._conf, self._config.allow_visible_aborts, doing)

    def _open_readers(self) -> None:
        self._reader = _Reader(self._conf)  # sequential reads of the clients
        self._tail = _Reader(self._conf)  # end offsets and last sequences, without moving the reader

    def _close_readers(self) -> None:
        for consumer in self._group_consumers.values():
            consumer.close()
        self._group_consumers.clear()
        self._reader.close()
        self._tail.close()
        if self._uncommitted_offsets is not None:
            self._uncommitted_offsets.close()
            self._uncommitted_offsets = None

    # -- streams -------------------------------------------------------------------------------------

    def _stream(self, name: str, refresh: bool = True) -> StreamDescription:
        if refresh:
            self._catalog.refresh()
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
        if self._uncommitted_offsets is None:
            self._uncommitted_offsets = offsets_client({**self._conf, "isolation.level": "read_uncommitted"})
        offsets = self._uncommitted_offsets
        return int(through_leader_changes(
            lambda: offsets.get_watermark_offsets(ck.TopicPartition(topic, local), timeout=TIMEOUT_S),
            f"reading the high watermark of {topic}[{local}]", refresh=lambda: refresh_metadata(offsets, [topic]))[1])

    def create_stream(self, name: str, partitions: int, settings: TopicSettings | None = None,
                      validate_only: bool = False) -> StreamDescription:
        if not isinstance(name, str) or not _TOPIC_NAME.match(name) or _EPOCH_SUFFIX.search(name):
            fail(ErrorCode.TOPIC_EXCEPTION, f"invalid topic name {name!r}: 1-200 of [A-Za-z0-9._-], "
                 "not ending in .epoch-N")
        check_partition_count(name, partitions)
        settings = settings or TopicSettings()
        self._catalog.refresh()
        if self._catalog.get(f"stream:{name}"):
            fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        topic = self._prefix + name
        ensure_topic(self._admin, topic, partitions, settings, validate_only)
        if validate_only:
            return first_epoch(name, partitions)
        epoch = {"epoch": 0, "first": 0, "count": partitions, "topic": topic, "sealed_ends": None}
        entry = {"epochs": [epoch], "replication_factor": settings.replication_factor, "config": dict(settings.config)}
        if not self._catalog.propose(f"stream:{name}", entry):
            fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} was created concurrently")
        return self._stream(name, refresh=False)

    def delete_stream(self, name: str) -> None:
        self._stream(name)
        stream_entry = self._catalog.get(f"stream:{name}")
        if not self._catalog.propose(f"stream:{name}", None):
            fail(ErrorCode.CONCURRENT_TRANSACTIONS, f"topic {name!r} changed concurrently; retry", retriable=True)
        topics = [epoch["topic"] for epoch in stream_entry["epochs"]]
        self._close_readers()  # a consumer that knew a deleted topic crashes librdkafka on Tansu (PEER.md)
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
        topic, local, sealed_end = self._topic_of(stream, partition)
        start, end = self._tail.end_offset(topic, local) if sealed_end is None else (
            self._reader.watermarks(topic, local)[0], sealed_end)
        return PartitionState(start, end, self._tail.last_sequence(topic, local, start, end), sealed_end is not None)

    def read(self, stream: str, partition: int, offset: int, max_records: int) -> list[Message]:
        topic, local, sealed_end = self._topic_of(stream, partition, refresh=False)
        messages = self._reader.read(topic, local, offset, max_records)
        out = []
        for m in messages:  # a hot path: librdkafka's keys and values are bytes already
            offset = offset_of(m)
            if sealed_end is not None and offset >= sealed_end:
                break
            kind, timestamp = m.timestamp()
            headers = m.headers()
            out.append(Message(stream, partition, offset, m.key(), m.value(), _headers(headers) if headers else None,
                               timestamp if kind else -1))
        return out

    def truncate_before(self, stream: str, partition: int, offset: int) -> int:
        topic, local, _ = self._topic_of(stream, partition)
        start, end = self._tail.end_offset(topic, local)
        if offset > end:
            fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{stream}[{partition}]: cannot truncate before {offset}, past the "
                 f"end offset {end}")
        if offset <= start:
            return start
        future = next(iter(self._admin.delete_records([ck.TopicPartition(topic, local, offset)],
                                                request_timeout=TIMEOUT_S).values()))
        try:
            low: int = future.result(timeout=TIMEOUT_S).low_watermark
            return low
        except ck.KafkaException as exc:
            raise translate(exc, f"truncating {stream}[{partition}] (DeleteRecords)") from exc

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

    def _group_consumer(self, group: str) -> ck.Consumer:
        consumer = self._group_consumers.get(group)
        if consumer is None:
            consumer = self._group_consumers[group] = ck.Consumer(
                {**self._conf, "group.id": self._prefix + group, "enable.auto.commit": False})
        return consumer

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
            self._group_consumer(group).commit(offsets=kafka_offsets, asynchronous=False)
        except ck.KafkaException as exc:
            raise translate(exc, f"committing offsets of group {group!r}") from exc

    def committed_offsets(self, group: str, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        wanted = {key: self._topic_of(key[0], key[1]) for key in partitions}
        if not wanted:
            return {}
        asked = [ck.TopicPartition(topic, local) for topic, local, _ in wanted.values()]
        consumer = self._group_consumer(group)
        found = through_leader_changes(lambda: consumer.committed(asked, timeout=TIMEOUT_S),
                                       f"reading committed offsets of group {group!r}")
        by_topic = {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
        return {key: by_topic[(t, p)] for key, (t, p, _) in wanted.items() if (t, p) in by_topic}

    def close(self) -> None:
        self._close_readers()
        self._catalog.close()


class KafkaWriter:
    """An appending session: idempotent producer, or a fenced transactional one for a ``writer.id``."""

    def __init__(self, store: KafkaStore, writer_id: str | None, epoch: int,
                 delivery_timeout_ms: int | None = None) -> None:
        self._store = store
        self._writer_id = writer_id
        self._epoch = epoch
        conf = {**store._conf, "enable.idempotence": True, "linger.ms": 5}
        if writer_id is not None:  # its appends are transactions, complete before they return
            store._require_hidden_aborts(f"writer.id {writer_id!r}")
            conf["transactional.id"] = f"onceflow-writer-{store._prefix}{writer_id}"  # per namespace
        elif delivery_timeout_ms is not None:  # librdkafka gives up when the caller stops waiting
            conf["delivery.timeout.ms"] = delivery_timeout_ms
        self._producer = ck.Producer(conf)
        if writer_id is not None:
            _call(self._producer.init_transactions, TIMEOUT_S, doing=f"fencing older writers of {writer_id!r}")
        self._owners: dict[str, ck.Producer] = {}
        self._wrote: dict[str, _Wrote] = {}  # per owned partition: where this owner's last CAS append left it
        self._session = uuid.uuid4().hex
        self._in_flight: list[_InFlight] = []  # asynchronous appends, in the order they were made
        self._carrier: str | None = None  # the internal topic of offsets-only transactions, once created
        self._closed = False

    @property
    def writer_id(self) -> str | None:
        return self._writer_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def append(
        self,
        stream: str,
        partition: int,
        records: Sequence[Record],
        *,
        expected_offset: int | None = None,
        expected_sequence: int | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        batch = Batch(stream, partition, records)
        where = f"{stream}[{partition}]"
        condition = Condition(expected_offset, expected_sequence, sequence)
        # A stale view of the catalog is fine: what was written is checked against seals before it commits
        # (_produce), so only a writer.id's fencing, checked next, needs a fresh look.
        topic, local = self._target(batch, refresh=self._writer_id is not None)
        self._check_not_fenced(where)
        if condition.unconditional:
            offsets = self._produce(self._producer, [(topic, local, records, None)], (), where, [batch])[0]
        else:
            owner_key = f"{topic}-{local}"
            owner = self._owner(owner_key)
            last_sequence = self._check_as_owner(owner_key, topic, local, condition, where)
            failpoint("kafka.cas.after_check")
            land_at = None if condition.expected_offset is None else (0, condition.expected_offset)
            offsets = self._as_owner(owner_key, where, lambda: self._produce(
                owner, [(topic, local, records, condition.new_sequence)], (), where, [batch], land_at=land_at))[0]
            written = condition.new_sequence
            if self._owners.get(owner_key) is owner:  # still the owner that wrote it (not one a failure dropped)
                self._wrote[owner_key] = _Wrote(offsets[-1] + 2, written if written is not None else last_sequence)
        return _result(offsets)

    def append_atomic(self, batches: Sequence[Batch], offsets: Sequence[OffsetCommit] = ()) -> list[AppendResult]:
        """One Kafka transaction; its condition, if any, is checked by the fenced owner of what it is about."""
        check_atomic_batches(batches, offsets)
        where = ", ".join(f"{b.stream}[{b.partition}]" for b in batches)
        self._store._catalog.refresh()  # one look for all the batches (and one after writing them)
        items = [(*self._target(b, refresh=False), b.records, None) for b in batches]
        guard = self._guard(batches, items, offsets, where)
        self._check_not_fenced(where)
        if guard is None:
            produced = self._produce(self._transactional(), items, offsets, where, batches)
        else:
            owner = self._owner(guard.owner_key)
            self._wrote.pop(guard.owner_key, None)  # it writes to the partition: what the owner knew is stale
            guard.check()  # after taking ownership: every rival that could still write is fenced
            produced = self._as_owner(guard.owner_key, where, lambda: self._produce(
                owner, items, offsets, where, batches, land_at=guard.land_at))
        return [_result(landed) for landed in produced]

    def _guard(self, batches: Sequence[Batch], items: Sequence[tuple[str, int, Sequence[Record], int | None]],
               offsets: Sequence[OffsetCommit], where: str) -> _Guard | None:
        """How an atomic append's one condition is checked: by the fenced owner of a conditional offset commit's
        group, or of a conditional batch's partition (then the batch must also land at the expected offset)."""
        conditional = {i: b.expected_offset for i, b in enumerate(batches) if b.expected_offset is not None}
        commits = [commit for commit in offsets if commit.expected]
        if len(conditional) + len(commits) > 1:
            fail(ErrorCode.INVALID_REQUEST, f"{where}: on Kafka an atomic append may have one condition (a batch's "
                 f"expected offset or an offset commit's expected offsets), got {len(conditional) + len(commits)}")
        if commits:
            commit = commits[0]
            return _Guard(f"group-{self._store._prefix}{commit.group}", lambda: commit.check(
                self._store.committed_offsets(commit.group, list(commit.expected or {}))))
        if not conditional:
            return None
        (index, expected), = conditional.items()
        topic, local, _, _ = items[index]
        if not is_internal(batches[index].stream):
            fail(ErrorCode.INVALID_REQUEST, f"{where}: Kafka cannot check a partition's end offset inside a "
                 "transaction; a conditional batch needs the embedded store or one of onceflow's own streams, "
                 "which only their fenced owner writes")
        return _Guard(f"{topic}-{local}", lambda: Condition(expected).check(
            where, self._store._tail.end_offset(topic, local)[1], lambda: NO_SEQUENCE), (index, expected))

    def append_async(self, stream: str, partition: int, records: Sequence[Record], callback: AppendCallback) -> None:
        """Produce without waiting (the idempotent producer pipelines batches); a writer.id's appends are
        transactions, so they complete before this returns."""
        if self._writer_id is not None:
            callback(self.append(stream, partition, records), None)
            return
        batch = Batch(stream, partition, records)
        topic, local = self._target(batch, refresh=False)  # a stale view is caught after delivery
        pending = _InFlight(batch, callback, len(records))
        self._in_flight.append(pending)
        self._send(self._producer, topic, local, records, None, pending.report)
        self._producer.poll(0)

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # librdkafka batches and pipelines appends itself

    def poll(self, timeout: float = 0) -> None:
        if self._in_flight:
            self._producer.poll(timeout)
            self._complete()

    def flush(self, timeout: float) -> None:
        if self._in_flight:
            self._producer.flush(timeout)
            self._complete()
        for pending in self._in_flight:  # librdkafka may still deliver them: never retriable
            pending.callback(None, _unacknowledged(ErrorCode._TIMED_OUT, pending.batch, f"within {timeout:g}s"))
        self._in_flight.clear()

    def _complete(self) -> None:
        """Run the callbacks of delivered batches, in order, after one look at the catalog for seals."""
        done = 0
        while done < len(self._in_flight) and self._in_flight[done].delivered:
            done += 1
        if not done:
            return
        finished, self._in_flight = self._in_flight[:done], self._in_flight[done:]
        unchecked = self._refresh_for_seals(finished)
        for pending in finished:
            try:
                if pending.error is not None and pending.error.code() == ck.KafkaError._MSG_TIMED_OUT:
                    raise KafkaException(_unacknowledged(ErrorCode._MSG_TIMED_OUT, pending.batch,
                                                         "within delivery.timeout.ms"))
                if pending.error is not None:
                    raise translate(pending.error, f"{pending.batch.stream}[{pending.batch.partition}]: appending")
                if unchecked is not None:
                    raise KafkaException(_unacknowledged(unchecked.code(), pending.batch, "as open: the catalog "
                                                         f"could not be read to check for a seal ({unchecked.str()})"))
                self._check_still_open([pending.batch], [pending.offsets])
            except KafkaException as exc:
                pending.callback(None, exc.error)
                continue
            pending.callback(_result(pending.offsets), None)

    def _refresh_for_seals(self, finished: Sequence[_InFlight]) -> KafkaError | None:
        """One look at the catalog before delivered batches are reported (a scale may have sealed their partition
        under them); its error, if the catalog could not be read: every batch still gets its report."""
        if all(pending.error is not None for pending in finished):
            return None  # nothing landed: nothing to check
        try:
            self._store._catalog.refresh()
        except KafkaException as exc:
            return exc.error
        return None

    def _target(self, batch: Batch, refresh: bool = True) -> tuple[str, int]:
        """The Kafka topic and partition of an open partition, after checking the records."""
        where = f"{batch.stream}[{batch.partition}]"
        if not batch.records or not isinstance(batch.records, batch_codec.Encoded):  # checked when encoded
            batch_codec.check(batch.records, self._store._config.message_max_bytes, where)
        try:
            topic, local, sealed_end = self._store._topic_of(batch.stream, batch.partition, refresh)
        except KafkaException as exc:
            if refresh or exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART:
                raise
            topic, local, sealed_end = self._store._topic_of(batch.stream, batch.partition)  # made since last look
        if sealed_end is not None:
            fail(ErrorCode.PARTITION_SEALED, f"{where} is sealed: its epoch was scaled; append to the current epoch")
        return topic, local

    def _check_still_open(self, batches: Sequence[Batch], produced: Sequence[list[int]]) -> None:
        """PARTITION_SEALED if a scale sealed a partition below what this append wrote, by the catalog as last
        refreshed."""
        for batch, landed in zip(batches, produced, strict=True):
            _, _, sealed_end = self._store._topic_of(batch.stream, batch.partition, refresh=False)
            if sealed_end is not None and landed[-1] >= sealed_end:
                fail(ErrorCode.PARTITION_SEALED, f"{batch.stream}[{batch.partition}] was sealed while this append "
                     "was in flight: none of it is visible to onceflow readers; append to the current epoch")

    def check_not_fenced(self) -> None:
        self._store._catalog.refresh()
        self._check_not_fenced(f"writer.id {self._writer_id!r}")

    def _check_not_fenced(self, where: str) -> None:
        if self._writer_id is not None:
            current = self._store._catalog.get(f"writer:{self._writer_id}")
            if current and current["epoch"] != self._epoch:
                fail(ErrorCode.PRODUCER_FENCED, f"{where}: writer.id {self._writer_id!r} epoch {self._epoch} was "
                     f"fenced by epoch {current['epoch']}", fatal=True)

    def _check_as_owner(self, owner_key: str, topic: str, local: int, condition: Condition, where: str) -> int | None:
        """Check a CAS append's expectation once owning the partition; the partition's last sequence, if read.

        An owner that is still the owner knows what its last append left: no rival writes without fencing it
        first, and a fenced owner's next transaction fails (then CAS_MISMATCH, see _as_owner). So an expectation
        that matches what it last wrote is checked without reading the tail; a plain producer that appended
        meanwhile is caught by the write itself (land_at: the batch must land at the expected offset). Anything
        else — the first append, an expectation that does not match — is checked against the tail, read now.
        """
        wrote = self._wrote.get(owner_key)
        if wrote is not None and (wrote.last_sequence is not None or condition.new_sequence is None):
            known = wrote.last_sequence
            try:
                condition.check(where, wrote.end, lambda: known if known is not None else NO_SEQUENCE)
                return known
            except KafkaException:
                pass  # perhaps only stale (a plain producer appended): look at the tail
        reader = self._store._tail
        start, end = reader.end_offset(topic, local)
        read: list[int] = []

        def last_sequence() -> int:
            read.append(reader.last_sequence(topic, local, start, end))
            return read[0]

        condition.check(where, end, last_sequence)
        return read[0] if read else None

    def _as_owner(self, owner_key: str, where: str, write: Callable[[], list[list[int]]]) -> list[list[int]]:
        """Run a write of a fenced owner; being fenced means a rival took over and won: CAS_MISMATCH. After any
        other failure the owner is dropped too (its transaction may hang, as a fenced one does on Tansu): the
        next write takes ownership afresh, which settles the old transaction first."""
        try:
            return write()
        except KafkaException as exc:
            self._owners.pop(owner_key, None)
            self._wrote.pop(owner_key, None)
            if exc.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH) or exc.error.fatal():
                fail(ErrorCode.CAS_MISMATCH, f"{where}: another writer took over during this conditional append")
            raise

    def _owner(self, owner_key: str) -> ck.Producer:
        """The fenced owner of a partition or a group's offsets: taking it over fences every rival."""
        owner = self._owners.get(owner_key)
        if owner is None:
            self._store._require_hidden_aborts(f"a CAS or atomic append ({owner_key})")
            owner = ck.Producer({"logger": _LibrdkafkaLog(), **self._store._conf,
                                 "transactional.id": f"onceflow-cas-{owner_key}", "linger.ms": 0})
            _call(owner.init_transactions, TIMEOUT_S, doing=f"taking ownership of {owner_key}")
            self._owners[owner_key] = owner
            self._wrote.pop(owner_key, None)  # a new owner knows nothing yet: rivals may have written meanwhile
        return owner

    def _transactional(self) -> ck.Producer:
        """A transactional producer for atomic appends: the writer.id's own, else one of this session's."""
        if self._writer_id is not None:
            return self._producer
        return self._owner(f"atomic-{self._session}")

    def _produce(self, producer: ck.Producer, items: Sequence[tuple[str, int, Sequence[Record], int | None]],
                 offsets: Sequence[OffsetCommit], where: str, batches: Sequence[Batch],
                 land_at: tuple[int, int] | None = None) -> list[list[int]]:
        """Write ``batches`` (their Kafka targets: ``items``; one transaction unless ``producer`` is the idempotent
        one); their offsets, in order.

        A scale may seal a partition while its records are on their way: a transaction is checked against the
        seals after its records landed and before it commits, and aborts with PARTITION_SEALED if one landed
        past a sealed end. Past that look a seal ends above every record landed (see ``_finish_seal``), so what
        commits is visible; a merge's progress, stored in the same transaction, never moves past records that
        readers cannot see. The idempotent producer's records cannot be taken back: they are checked after they
        landed.

        ``land_at``: (item, offset): that item's batch must land at that offset, else the transaction aborts with
        CAS_MISMATCH: a plain producer may append between a CAS owner's look at the tail and its write.
        """
        transactional = producer is not self._producer or self._writer_id is not None
        landed: list[list[int]] = [[] for _ in items]
        carried: list[int] = []  # the offset of the carrier record, in a transaction that only commits offsets
        errors: list[ck.KafkaError] = []
        if transactional:
            _call(producer.begin_transaction, doing=f"{where}: beginning a transaction")
            failpoint("kafka.txn.before_send")
        try:
            for (topic, local, records, sequence), got in zip(items, landed, strict=True):
                self._send(producer, topic, local, records, sequence, _reporter(got, errors))
            if transactional and offsets and not items:
                self._send_carrier(producer, _reporter(carried, errors))
            _call(producer.flush, TIMEOUT_S, doing=f"{where}: writing")
            if land_at is not None and landed[land_at[0]] and landed[land_at[0]][0] != land_at[1]:
                fail(ErrorCode.CAS_MISMATCH, f"{where}: expected end offset {land_at[1]}, but another writer "
                     f"appended first (the batch would land at {landed[land_at[0]][0]}); not written")
            _raise_failed_delivery(errors, landed, items, where)  # before the commit: the except aborts
            self._store._catalog.refresh()
            self._check_still_open(batches, landed)
            if transactional:
                for commit in offsets:
                    self._send_offsets(producer, commit, where)
        except KafkaException as exc:  # the commit was never asked for: nothing of this transaction lands
            if transactional and not exc.error.fatal():
                with contextlib.suppress(ck.KafkaException):
                    producer.abort_transaction(TIMEOUT_S)
                    self._await_aborted(_ends(items, landed), where)
            raise
        if transactional:
            ends = _ends(items, landed)
            witness = next((_Witness(topic, local, got[0], records[0].key, records[0].value)
                            for (topic, local, records, _), got in zip(items, landed, strict=True) if got), None)
            if witness is None and carried and self._carrier is not None:
                witness = _Witness(self._carrier, 0, carried[0], None, b"")
            self._commit(producer, witness, ends, where)
        return landed

    def _commit(self, producer: ck.Producer, witness: _Witness | None, ends: Mapping[tuple[str, int], int],
                where: str) -> None:
        """Commit the producer's open transaction and wait until its records are readable.

        When the commit's outcome is not known — an EndTxn error (Apache Kafka answers a commit that races a
        rival's fencing with UNKNOWN_SERVER_ERROR, librdkafka's "Unknown broker error"; a fenced reply may answer
        a retried EndTxn whose first attempt committed), a timeout, markers not readable in time — the log decides:
        the transaction's first record, read back (read_committed) at the offset it was written to, is visible
        exactly when the transaction committed. Committed: this returns, as a success. Not committed: the error,
        PRODUCER_FENCED if a rival fenced the producer meanwhile, else retriable (nothing was written). Only when
        the read-back cannot decide either is the error flagged outcome-unknown.
        """
        owned = any(producer is owner for owner in self._owners.values())
        try:
            _call(producer.commit_transaction, OWNER_COMMIT_TIMEOUT_S if owned else TIMEOUT_S,
                  doing=f"{where}: committing")
            self._store._tail.await_stable(ends, where)
            return
        except KafkaException as exc:
            failed = exc
        fenced, fatal, aborted = failed.code in _FENCED_CODES, failed.error.fatal(), False
        if not fatal:  # settles a transaction still open; a decided one refuses (then: fatal)
            try:
                _call(producer.abort_transaction, TIMEOUT_S, doing=f"{where}: aborting after a failed commit")
                aborted = True
                self._await_aborted(ends, where)
            except KafkaException as exc:
                fenced, fatal = fenced or exc.code in _FENCED_CODES, exc.error.fatal()
        self._forget(producer)  # in an error state whatever the outcome: the next write takes ownership afresh
        if not aborted and self._read_back(witness, where, failed):
            log.info("%s: the commit reported %s, but its records landed (read back: %s)", where, failed.error, witness)
            self._store._tail.await_stable(ends, where)  # the other partitions' markers too (one transaction)
            return
        reason = f"{failed.error.str()}; read back: not written"
        log.info("%s: the commit reported %s; read back: not written", where, failed.error)
        if fenced:  # a rival took over: for a fenced owner, CAS_MISMATCH (_as_owner)
            raise KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, reason, fatal=True)) from failed
        raise KafkaException(KafkaError(failed.code, reason, fatal=fatal, retriable=not fatal)) from failed

    def _await_aborted(self, ends: Mapping[tuple[str, int], int], where: str) -> None:
        """Wait until an aborted transaction's records are decided: its abort markers are written after
        abort_transaction returns, and until then the end offset the store reports stops before them (the last
        stable offset), so an expectation taken from it right after a refused CAS append would be stale."""
        if not ends:
            return
        try:
            self._store._tail.await_stable(ends, f"{where}: aborting")
        except KafkaException as exc:  # the abort stands (the caller's error says so); only the reported end lags
            log.info("%s: aborted, but its markers were not seen: %s", where, exc.error)

    def _read_back(self, witness: _Witness | None, where: str, failed: KafkaException) -> bool:
        """True if the transaction whose first record is ``witness`` committed, False if it aborted; an
        outcome-unknown error when the partition does not tell within the timeout (its transaction still open)."""
        if witness is None:  # a transaction without records: nothing to read back
            fail(failed.code, f"{where}: the commit's outcome is unknown: {failed.error.str()}", outcome_unknown=True)
        reader = self._store._tail
        try:
            reader.await_stable({(witness.topic, witness.local): witness.offset + 1}, where)
            found = reader.read_range(witness.topic, witness.local, witness.offset, witness.offset + 1)
        except KafkaException as exc:
            raise KafkaException(KafkaError(
                exc.code, f"{where}: the commit's outcome is unknown ({failed.error.str()}) and reading it back "
                f"failed: {exc.error.str()}", outcome_unknown=True)) from exc
        if not found or offset_of(found[0]) != witness.offset:
            return False  # below the last stable offset and not visible: aborted
        message = found[0]
        if _bytes(message.key()) != witness.key or _bytes(message.value()) != witness.value:
            fail(ErrorCode.UNKNOWN, f"{where}: the commit's outcome is unknown ({failed.error.str()}): offset "
                 f"{witness.offset} of {witness.topic}[{witness.local}], where this write's first record was "
                 "acknowledged, holds another record", outcome_unknown=True)
        return True

    def _forget(self, producer: ck.Producer) -> None:
        """Drop a fenced owner whose transaction failed (the writer.id's own producer stays: it is the writer)."""
        for key, owner in list(self._owners.items()):
            if owner is producer:
                del self._owners[key]
                self._wrote.pop(key, None)

    def _send_carrier(self, producer: ck.Producer, report: Callable[[ck.KafkaError | None, ck.Message], None]) -> None:
        """An empty record to an internal topic, so a transaction that only commits offsets is not empty: Tansu
        drops the offsets of an empty transaction after a producer's first (integration/PEER.md)."""
        if self._carrier is None:
            self._carrier = f"__onceflow_offsets_carrier.{self._store._prefix}".rstrip(".")
            ensure_topic(self._store._admin, self._carrier, 1)
        _call(producer.produce, self._carrier, b"", partition=0, on_delivery=report,
              doing=f"{self._carrier}: appending")

    @staticmethod
    def _send(producer: ck.Producer, topic: str, local: int, records: Sequence[Record], sequence: int | None,
              report: Callable[[ck.KafkaError | None, ck.Message], None]) -> None:
        produce = producer.produce  # a hot path: one produce() per record, errors translated once
        last = len(records) - 1
        with _translating(f"{topic}[{local}]: appending"):
            for i, r in enumerate(records):
                headers = r.headers
                if sequence is not None and i == last:
                    headers = [*(headers or ()), (SEQUENCE_HEADER, str(sequence).encode())]
                produce(topic, r.value, r.key, partition=local, headers=list(headers) if headers else None,
                        timestamp=r.timestamp if r.timestamp > 0 else 0, on_delivery=report)

    def _send_offsets(self, producer: ck.Producer, commit: OffsetCommit, where: str) -> None:
        positions = self._store._kafka_offsets(commit.offsets)
        metadata = self._store._group_consumer(commit.group).consumer_group_metadata()
        _call(producer.send_offsets_to_transaction, positions, metadata, TIMEOUT_S,
              doing=f"{where}: committing offsets of group {commit.group!r}")

    def close(self) -> None:
        """Deliver what is pending, then close this writer's producers (the fenced owners it still holds too).
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self.flush(TIMEOUT_S)
        self._producer.flush(TIMEOUT_S)
        for owner in self._owners.values():
            owner.close()
        self._owners.clear()
        self._producer.close()


_FENCED_CODES = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode._FENCED)


@dataclasses.dataclass(frozen=True)
class _Wrote:
    """Where a fenced owner's last CAS append left its partition: the end offset after it (its last record's
    offset + 2: the commit marker takes one) and the last application sequence number (None: not known)."""

    end: int
    last_sequence: int | None


@dataclasses.dataclass(frozen=True)
class _Witness:
    """A transaction's first record as written: where the broker acknowledged it, and its key and value. After a
    commit with an unknown outcome, it is visible to a read_committed reader at that offset exactly when the
    transaction committed (an offset holds one record; an aborted one is never shown)."""

    topic: str
    local: int
    offset: int
    key: bytes | None
    value: bytes | None


class _LibrdkafkaLog:
    """The ``logger`` of a fenced owner: librdkafka's lines as DEBUG records of ``<this module>.librdkafka``.

    Losing a CAS race makes librdkafka print FATAL lines ("This instance has been fenced by a newer instance"),
    hundreds in a busy race; the race's outcome reaches the caller as CAS_MISMATCH, so the lines are kept for
    debugging, not printed to stderr.
    """

    def log(self, level: int, msg: str, *args: object) -> None:
        if _librdkafka_log.isEnabledFor(logging.DEBUG):
            _librdkafka_log.debug(f"%s {msg}", logging.getLevelName(level), *args)


@dataclasses.dataclass(frozen=True)
class _Guard:
    """An atomic append's condition: whose fenced owner writes it, what to check once owning, and where its
    conditional batch must land ((item, offset), if it has one)."""

    owner_key: str
    check: Callable[[], None]
    land_at: tuple[int, int] | None = None


class _InFlight:
    """An asynchronous append waiting for its records' delivery reports."""

    __slots__ = ("batch", "callback", "error", "offsets", "remaining")

    def __init__(self, batch: Batch, callback: AppendCallback, count: int) -> None:
        self.batch = batch
        self.callback = callback
        self.remaining = count
        self.offsets: list[int] = []
        self.error: ck.KafkaError | None = None

    @property
    def delivered(self) -> bool:
        return self.remaining == 0

    def report(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        self.remaining -= 1
        offset = msg.offset()
        if err is None and offset is not None:
            self.offsets.append(offset)
        else:
            self.error = self.error or delivery_error(err, msg)


def _reporter(landed: list[int], errors: list[ck.KafkaError]) -> Callable[[ck.KafkaError | None, ck.Message], None]:
    """The delivery callback of one batch's records: notes where each landed, or why it did not (a hot path: one
    call per record)."""
    def report(err: ck.KafkaError | None, msg: ck.Message) -> None:
        offset = msg.offset()
        if err is None and offset is not None:
            landed.append(offset)
            return
        error = delivery_error(err, msg)
        if error is not None:  # always, here
            errors.append(error)

    return report


def _unacknowledged(code: ErrorCode, batch: Batch, when: str) -> KafkaError:
    """An asynchronous append not acknowledged in time: sent, perhaps written, so its outcome is unknown and
    sending it again could write it twice."""
    return KafkaError(code, f"{batch.stream}[{batch.partition}]: {len(batch.records)} record(s) not acknowledged "
                      f"{when}; they may or may not be written (outcome unknown: read the partition before "
                      "appending them again)", outcome_unknown=True)


def _raise_failed_delivery(errors: list[ck.KafkaError], landed: list[list[int]],
                           items: Sequence[tuple[str, int, Sequence[Record], int | None]], where: str) -> None:
    if errors or any(len(got) != len(item[2]) for got, item in zip(landed, items, strict=True)):
        raise translate(errors[0] if errors else ck.KafkaError(ck.KafkaError._TIMED_OUT), f"{where}: appending")


def _ends(items: Sequence[tuple[str, int, Sequence[Record], int | None]],
          landed: Sequence[list[int]]) -> dict[tuple[str, int], int]:
    """One past the last offset each written partition got (partitions nothing landed in are left out)."""
    ends: dict[tuple[str, int], int] = {}
    for (topic, local, _, _), got in zip(items, landed, strict=True):
        if got:
            ends[(topic, local)] = max(ends.get((topic, local), 0), max(got) + 1)
    return ends


def _result(offsets: list[int]) -> AppendResult:
    dense = offsets[-1] - offsets[0] == len(offsets) - 1
    return AppendResult(offsets[0], len(offsets), offsets=None if dense else tuple(offsets))


READ_AHEAD = 10_000
"""Records a reader holds per partition beyond what was asked before it stops fetching that partition."""


class _Reader:
    """Reads partitions by offset through one assign-mode consumer, fetching ahead sequentially.

    A partition stays assigned after a read, so reading on is one fetch away; one that holds
    :data:`READ_AHEAD` records nobody asked for yet is paused until they are read (a partition read once and
    then left would otherwise be fetched into memory for as long as the reader lives).

    Thread-safe (a store is shared by the threads of a process, as a TransactionGroup is): reads take turns,
    since two at once would re-position the one consumer and take each other's buffered records.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._consumer = ck.Consumer({**conf, "group.id": f"onceflow-reader-{uuid.uuid4().hex}",
                                      "enable.auto.commit": False, "isolation.level": "read_committed",
                                      "auto.offset.reset": "error", "fetch.wait.max.ms": 10})
        self._offsets = offsets_client(conf)
        self._admin = AdminClient(dict(conf))
        self._next: dict[tuple[str, int], int] = {}
        self._ends: dict[tuple[str, int], int] = {}  # last stable offset last looked at: records below are decided
        self._true_ends: dict[tuple[str, int], tuple[int, int]] = {}  # high watermark -> end offset read
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}  # (offset scanned to, last sequence)
        self._buffers: dict[tuple[str, int], deque[ck.Message]] = {}
        self._paused: set[tuple[str, int]] = set()
        self._lock = threading.RLock()

    def watermarks(self, topic: str, local: int) -> tuple[int, int]:
        low, high = through_leader_changes(
            lambda: self._offsets.get_watermark_offsets(ck.TopicPartition(topic, local), timeout=TIMEOUT_S),
            f"reading the offsets of {topic}[{local}]", refresh=lambda: refresh_metadata(self._offsets, [topic]))
        return int(low), int(high)

    def stable_ends(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's last stable offset: records below it are committed or aborted, so a read_committed
        reader gets every committed one of them; it stops at the first record of an open transaction."""
        wanted = {ck.TopicPartition(t, p): (t, p) for t, p in partitions}
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]

        def ask() -> dict[tuple[str, int], int]:
            futures = self._admin.list_offsets({tp: latest for tp in wanted},
                                               isolation_level=ck.IsolationLevel.READ_COMMITTED,
                                               request_timeout=TIMEOUT_S)
            return {wanted[tp]: int(f.result(timeout=TIMEOUT_S).offset) for tp, f in futures.items()}

        return through_leader_changes(ask, f"reading the last stable offsets of {sorted(wanted.values())}",
                                      refresh=lambda: refresh_metadata(self._admin, {t for t, _ in wanted.values()}))

    def await_stable(self, ends: Mapping[tuple[str, int], int], where: str) -> None:
        """Wait until committed records below ``ends`` are readable: a broker may write a transaction's commit
        markers after it acknowledged the commit, and a commit is promised to be visible when it returns."""
        deadline = time.monotonic() + TIMEOUT_S
        pending = dict(ends)
        while pending:
            stable = self.stable_ends(pending)
            pending = {tp: end for tp, end in pending.items() if stable[tp] < end}
            if pending and time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{where}: committed, but not readable within {TIMEOUT_S:g}s: {pending}")
            if pending:
                time.sleep(0.001)  # markers follow the commit within a few ms: every ms waited is the commit's

    @one_at_a_time
    def end_offset(self, topic: str, local: int) -> tuple[int, int]:
        """(start, end) where end is one past the last record, read from the tail.

        The high watermark alone is not trusted: Tansu reports the last batch's base offset + 1 (PEER.md).
        """
        key = (topic, local)
        low, high = self.watermarks(topic, local)
        cached = self._true_ends.get(key)
        if cached is not None and cached[0] == high:
            return low, cached[1]
        if high <= low:
            return low, high
        position = self._next.get(key)  # read on from where the last look stopped: no re-positioning
        first = position if position is not None and low <= position < high else high - 1
        tail = self.read_range(topic, local, first, high)
        self._scanned_on(key, first, high, tail)
        last = max([offset_of(m) for m in tail] + [offset_of(m) for m in self._buffers.get(key, ())],
                   default=high - 1)
        self._true_ends[key] = (high, max(high, last + 1))
        return low, max(high, last + 1)

    @one_at_a_time
    def read(self, topic: str, local: int, offset: int, max_records: int) -> list[ck.Message]:
        """Records from ``offset``; waits (up to the timeout) for records known to exist, [] at the end."""
        key = (topic, local)
        if self._next.get(key) != offset:
            low, high = self.watermarks(topic, local)
            if not low <= offset <= high and not (offset > high and offset <= self.end_offset(topic, local)[1]):
                fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{topic}[{local}]: offset {offset} is outside [{low}, {high}]")
            if key in self._next:
                self._consumer.incremental_unassign([ck.TopicPartition(topic, local)])
                self._paused.discard(key)
            self._consumer.incremental_assign([ck.TopicPartition(topic, local, offset)])
            self._next[key], self._buffers[key] = offset, deque()
            self._ends[key] = self.stable_ends([key])[key]
        buffer = self._buffers[key]
        deadline = time.monotonic() + TIMEOUT_S
        while not buffer:
            self._pump()
            if buffer:
                break
            if offset >= self._ends[key]:  # nothing decided left when last looked: look again, once
                self._ends[key] = self.stable_ends([key])[key]
                if offset >= self._ends[key]:
                    break
            elif self._caught_up(topic, local, self._ends[key]):
                break
            if time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{topic}[{local}]: no record from offset {offset} within {TIMEOUT_S}s")
        out = [buffer.popleft() for _ in range(min(max_records, len(buffer)))]
        if out:
            self._next[key] = offset_of(out[-1]) + 1
        if key in self._paused and len(buffer) < READ_AHEAD // 2:
            self._paused.discard(key)
            self._consumer.resume([ck.TopicPartition(topic, local)])
        return out

    @one_at_a_time
    def read_range(self, topic: str, local: int, first: int, end: int) -> list[ck.Message]:
        """Every record in [first, end) still stored (fewer offsets where transaction markers sit; what another
        process truncated meanwhile is skipped: these are reads of a partition's tail)."""
        out: list[ck.Message] = []
        position = first
        while position < end and not (position > first and self._caught_up(topic, local, end)):
            try:
                batch = self.read(topic, local, position, end - position)
            except KafkaException as exc:
                low = self.watermarks(topic, local)[0]
                if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE or low <= position:
                    raise
                position = low  # truncated while read: a read of the tail goes on from the new start
                continue
            if not batch:
                break
            out += batch
            position = offset_of(batch[-1]) + 1
        return out

    def _caught_up(self, topic: str, local: int, end: int) -> bool:
        """True when the consumer's fetch position reached ``end`` (only markers were left)."""
        position = self._consumer.position([ck.TopicPartition(topic, local)])[0].offset
        return position >= end and not self._buffers[(topic, local)]

    def _pump(self) -> None:
        # A short wait: a tail often ends in a commit marker, which a poll consumes without returning anything
        # (a long poll waited its whole timeout there); read() then finds the position past it (_caught_up).
        for message in drain(self._consumer, 0.005):
            error = message.error()
            if error is not None:
                if error.code() == ck.KafkaError._PARTITION_EOF:
                    continue
                where = f"reading {message.topic()}[{message.partition()}]"
                if error.code() == ck.KafkaError._AUTO_OFFSET_RESET:  # truncated under the fetch position
                    self._next[(message.topic() or "", message.partition() or 0)] = -1  # re-positioned next read
                    fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{where}: {error.str()}")
                raise translate(error, where)
            key = (message.topic() or "", message.partition() or 0)
            buffer = self._buffers.get(key)
            if buffer is None:
                continue
            buffer.append(message)
            if len(buffer) >= READ_AHEAD and key not in self._paused:
                self._paused.add(key)
                self._consumer.pause([ck.TopicPartition(*key)])

    @one_at_a_time
    def last_sequence(self, topic: str, local: int, start: int, end: int) -> int:
        """The application sequence number of the last record carrying one (NO_SEQUENCE if none does).

        Remembers how far it looked, so later calls read only the records appended since.
        """
        key = (topic, local)
        scanned, found = self._sequences.get(key, (None, NO_SEQUENCE))
        if scanned is not None and start <= scanned <= end:
            found = _sequence_in(self.read_range(topic, local, scanned, end), found)
        else:  # first look: back from the end, in growing windows, until one carries a sequence
            window, found = 8, NO_SEQUENCE
            while found == NO_SEQUENCE:
                first = max(start, end - window)
                found = _sequence_in(self.read_range(topic, local, first, end), NO_SEQUENCE)
                if first == start:
                    break
                window *= 4
        self._sequences[key] = (end, found)
        return found

    def _scanned_on(self, key: tuple[str, int], first: int, end: int, messages: list[ck.Message]) -> None:
        """Carry :meth:`last_sequence`'s scan over ``messages``, just read: every record of [first, end). If it
        had scanned to within that range, it has now scanned to ``end`` (re-reading those records for it moved
        the consumer back and fetched them again: two fetches per partition_state)."""
        scanned = self._sequences.get(key)
        if scanned is not None and first <= scanned[0] <= end:
            self._sequences[key] = (end, _sequence_in(messages, scanned[1]))

    @one_at_a_time
    def close(self) -> None:
        self._consumer.close()
        self._offsets.close()


def _sequence_in(messages: list[ck.Message], default: int) -> int:
    """The last application sequence number among these records, else ``default``."""
    found = default
    for message in messages:
        for name, value in _headers(message.headers(), keep_sequence=True) or []:
            if name == SEQUENCE_HEADER and value is not None:
                found = int(value)
    return found


def _settings(entry: Mapping[str, Any]) -> TopicSettings:
    """A stream's topic settings, as its catalog entry keeps them (none in entries written before they were)."""
    return TopicSettings(entry.get("replication_factor", -1), entry.get("config", {}))


def _describe(name: str, entry: Mapping[str, Any]) -> StreamDescription:
    epochs = tuple(
        EpochDescription(e["epoch"], tuple(range(e["first"], e["first"] + e["count"])), e["sealed_ends"] is not None)
        for e in entry["epochs"]
    )
    return StreamDescription(name, epochs)


def _bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _headers(
    headers: Mapping[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
    keep_sequence: bool = False,
) -> list[tuple[str, bytes | None]] | None:
    """Record headers as onceflow gives them (a list of (name, bytes)); onceflow's own header hidden."""
    items = headers.items() if isinstance(headers, Mapping) else headers or []
    kept = [(k, _bytes(v)) for k, v in items if keep_sequence or k != SEQUENCE_HEADER]
    return kept or None


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


def _call(fn: Any, *args: Any, doing: str, **kwargs: Any) -> None:
    """Call a confluent-kafka method; its errors as onceflow's (see :func:`_translating`)."""
    with _translating(doing):
        fn(*args, **kwargs)


@contextlib.contextmanager
def _translating(doing: str) -> Iterator[None]:
    """confluent-kafka's errors raised inside, as onceflow's (a fenced producer: PRODUCER_FENCED, fatal; a
    produce() on a producer that a rival fenced meanwhile fails with _FATAL, fatal)."""
    try:
        try:
            yield
        except SystemError as exc:  # a fatal error confluent-kafka raised while it served a delivery callback
            if isinstance(exc.__cause__, ck.KafkaException):
                raise exc.__cause__ from exc
            raise
    except ck.KafkaException as exc:
        error = exc.args[0]
        if error.code() in (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                            ck.KafkaError.INVALID_PRODUCER_EPOCH):
            raise KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, f"{doing}: {error.str()}", fatal=True)) from exc
        if error.code() == ck.KafkaError._FATAL:  # the producer is unusable, whatever the flag says
            raise KafkaException(KafkaError(ErrorCode._FATAL, f"{doing}: {error.str()}", fatal=True)) from exc
        raise translate(exc, doing) from exc
