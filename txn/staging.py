"""Staged writes: a transaction's records, written by any number of writers in any processes before COMMIT.

A staged record is an ordinary record of the group's staging stream. Its value is a batch of the
transaction's records for one target, in the store's batch format; its headers tag it with (txn id, writer id,
sequence) and the target (stream, partition or -1 to route by key at merge time). A COMMIT names each
included writer's :class:`Participant`, so a writer that failed part-way (a failed Spark task attempt) is
never published, and a retried staged batch is dropped by (writer id, sequence).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.partitioner import partition_for_key
from onceflow.connector.store import Record, Store, StreamDescription, Writer, batch_codec, describe_if_exists
from onceflow.schemas.txn_log_pb2 import Participant as ParticipantProto

TXN = "onceflow.staged.txn"
WRITER = "onceflow.staged.writer"
SEQUENCE = "onceflow.staged.sequence"
STREAM = "onceflow.staged.stream"
PARTITION = "onceflow.staged.partition"
_RECORD_OVERHEAD = 32  # bytes a record adds to a stored batch beyond its key, value and headers


@dataclasses.dataclass(frozen=True)
class Participant:
    """What one writer staged for a transaction; hand it to the committer, which names it in COMMIT.

    ``txn_id``: the transaction it staged in. A COMMIT of another transaction that names it joins that one:
    both are decided together, and only if both are still open.
    """

    writer_id: str
    staging_partition: int
    first_offset: int
    last_offset: int
    first_sequence: int
    last_sequence: int
    txn_id: str = ""

    def to_proto(self) -> ParticipantProto:
        return ParticipantProto(**dataclasses.asdict(self))

    @classmethod
    def from_proto(cls, proto: ParticipantProto) -> Participant:
        return cls(proto.writer_id, proto.staging_partition, proto.first_offset, proto.last_offset,
                   proto.first_sequence, proto.last_sequence, proto.txn_id)

    def staged_in(self, committing_txn_id: str) -> str:
        """The transaction whose staged records this participant names."""
        return self.txn_id or committing_txn_id


@dataclasses.dataclass(frozen=True)
class StagedBatch:
    """A staged batch read back: its tags and its records."""

    writer_id: str
    sequence: int
    stream: str
    partition: int
    records: batch_codec.Encoded


def check_keys(store: Store, described: dict[str, StreamDescription | None], stream: str,
               keys: Iterable[bytes | None]) -> None:
    """Refuse a transaction's records that ``stream`` would refuse whenever the merge wrote them (a record without a
    key bound for a compacted stream: INVALID_RECORD), before the transaction commits; ``described`` caches the
    streams' descriptions."""
    if stream not in described:
        described[stream] = describe_if_exists(store, stream)
    description = described[stream]
    if description is not None:
        description.check_keys(keys)


class StagingWriter:
    """One writer's records in one transaction, buffered per target and staged on :meth:`flush`; for one thread
    at a time.

    A flush cuts the buffers into staged batches (each under ``message.max.bytes``), numbers them, and stages them
    together in one append (one durable write; on Kafka, one request). A failed flush is retried by flushing
    again: it appends the same batches under the same sequence numbers (and any buffered since, numbered after
    them), so a batch stored although its append reported a failure is read once.
    """

    def __init__(self, store: Store, staging_stream: str, txn_id: str, writer_id: str, writer: Writer,
                 max_bytes: int, *, owns_writer: bool = False) -> None:
        partitions = store.describe_stream(staging_stream).current.partitions
        self._store = store
        self._staging_stream = staging_stream
        self._partition = partitions[zlib.crc32(writer_id.encode()) % len(partitions)]
        self._txn_id = txn_id
        self._writer_id = writer_id
        self._writer = writer
        self._owns_writer = owns_writer  # close() closes it
        self._max_bytes = max_bytes  # message.max.bytes: a staged batch is one record
        self._buffers: dict[tuple[str, int], list[Record]] = {}
        # Each stream's open partitions as first looked up (None: it does not exist yet, and the merge routes its
        # records)
        self._open_partitions: dict[str, tuple[int, ...] | None] = {}
        self._described: dict[str, StreamDescription | None] = {}  # for check_keys
        self._unstaged: list[Record] = []  # staged batches cut and numbered, not yet stored
        self._next_sequence = 0
        self._first_offset: int | None = None
        self._last_offset = -1

    @property
    def txn_id(self) -> str:
        return self._txn_id

    def produce(self, stream: str, record: Record, partition: int = -1) -> None:
        """Buffer a record for ``stream`` (``partition`` -1: by key).

        A keyed record goes by its key into the stream's partitions open now, here in the writer (in parallel,
        where a Spark sink's tasks stage), so the merge moves its staged batch unchanged; if the stream scales
        before the merge, the merge routes it again by key, as it routes records staged for a sealed partition.
        A hot path: one call per record of a Spark sink (the stream's open partitions kept, not its description)."""
        if partition == -1:
            partitions = self._open_partitions.get(stream, ())  # (): not looked up yet
            if partitions == ():
                described = self._described[stream] = describe_if_exists(self._store, stream)  # (check_keys's too)
                partitions = self._open_partitions[stream] = None if described is None else described.current.partitions
            if partitions is not None:
                partition = partition_for_key(record.key or b"", partitions)
        buffer = self._buffers.get((stream, partition))
        if buffer is None:
            buffer = self._buffers[stream, partition] = []
        buffer.append(record)

    def flush(self) -> None:
        """Stage everything buffered, in one append; raises what the store raised (flush again to retry: nothing
        duplicates)."""
        for (stream, _), records in self._buffers.items():
            check_keys(self._store, self._described, stream, (record.key for record in records))
        cut = [(stream, partition, chunk) for (stream, partition), records in self._buffers.items()
               for chunk in self._chunks(records)]
        # Encoded before anything changes: a record the batch format refuses fails every flush, staging nothing
        # twice under another sequence number.
        staged = [self._staged_record(stream, partition, chunk, self._next_sequence + i)
                  for i, (stream, partition, chunk) in enumerate(cut)]
        self._next_sequence += len(staged)
        self._unstaged.extend(staged)
        self._buffers.clear()
        if self._unstaged:
            result = self._writer.append(self._staging_stream, self._partition, self._unstaged)
            self._unstaged = []
            if self._first_offset is None:
                self._first_offset = result.base_offset
            self._last_offset = result.last_offset

    def close(self) -> None:
        """Close the store writer if this one opened it; what is buffered and not flushed is dropped."""
        if self._owns_writer:
            self._writer.close()

    def participant(self) -> Participant | None:
        """Flush, then what a COMMIT must name to include this writer's records (None if it staged none)."""
        self.flush()
        if self._first_offset is None:
            return None
        return Participant(self._writer_id, self._partition, self._first_offset, self._last_offset, 0,
                           self._next_sequence - 1, self._txn_id)

    def _staged_record(self, stream: str, partition: int, records: list[Record], sequence: int) -> Record:
        """A staged batch: the records for one target, tagged with its sequence number."""
        blob = batch_codec.encode(records, self._max_bytes, f"transaction {self._txn_id} staging for {stream}")
        headers: list[tuple[str, bytes | None]] = [
            (TXN, self._txn_id.encode()), (WRITER, self._writer_id.encode()),
            (SEQUENCE, str(sequence).encode()), (STREAM, stream.encode()), (PARTITION, str(partition).encode())]
        return Record(None, blob, headers)

    def _chunks(self, records: list[Record]) -> Iterator[list[Record]]:
        """Runs of records whose staged batch stays under message.max.bytes (a hot path: sized in one pass)."""
        budget = self._max_bytes - 512  # the staged record's own headers
        costs = [batch_codec.record_size(key, value, headers) + _RECORD_OVERHEAD + 6 * len(headers or ())
                 for key, value, headers, _ in records]
        if sum(costs) <= budget:
            yield records
            return
        start, size = 0, 0
        for end, cost in enumerate(costs):
            if end > start and size + cost > budget:
                yield records[start:end]
                start, size = end, 0
            size += cost
        yield records[start:]


def read_staged(store: Store, staging_stream: str, txn_id: str, participant: Participant) -> list[StagedBatch]:
    """A participant's staged batches of ``txn_id`` in sequence order, each sequence once."""
    found: dict[int, StagedBatch] = {}
    offset = participant.first_offset
    where = f"transaction {txn_id} writer {participant.writer_id!r}"
    while offset <= participant.last_offset:
        messages = store.read(staging_stream, participant.staging_partition, offset, 100)
        if not messages:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: staged data ends at {offset}, before {participant.last_offset}")
        for message in messages:
            at = message.offset() or 0
            if at > participant.last_offset:
                break
            tags = dict(message.headers() or [])
            if tags.get(TXN) != txn_id.encode() or tags.get(WRITER) != participant.writer_id.encode():
                continue  # another writer's or transaction's record in the same staging partition
            staged = _staged_batch(tags, message.value() or b"", f"{where} staged record {at}")
            if participant.first_sequence <= staged.sequence <= participant.last_sequence:
                found.setdefault(staged.sequence, staged)
        offset = (messages[-1].offset() or 0) + 1
    missing = set(range(participant.first_sequence, participant.last_sequence + 1)) - set(found)
    if missing:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: staged sequences {sorted(missing)[:5]} are missing")
    return [found[s] for s in sorted(found)]


def _staged_batch(tags: dict[str, bytes | None], value: bytes, where: str) -> StagedBatch:
    try:
        sequence = int(tags[SEQUENCE] or b"")
        stream = (tags[STREAM] or b"").decode()
        partition = int(tags[PARTITION] or b"")
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: bad staging tags ({exc})")
    return StagedBatch((tags[WRITER] or b"").decode(), sequence, stream, partition,
                       batch_codec.Encoded.stored(value, where))

