"""Where source offsets are kept: a stream (``offset.storage.topic``), as Kafka Connect keeps them in a topic, or a
local file (standalone without exactly-once, ``offset.storage.file.filename``).

An entry's key is the JSON array ``[connector, source partition]`` and its value the JSON source offset (null:
forgotten), as Kafka Connect writes them. In the stream the latest entry of a key wins. With exactly-once, a
source task writes its entries with its records, in the same transaction (:mod:`onceflow.connect.source_runner`);
:class:`StreamOffsets` reads what was committed.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import threading
import time
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.store import Record, Store, TopicSettings, Writer, ensure_stream

log = logging.getLogger(__name__)

COMPACT_AFTER = 10_000
"""Superseded entries an offsets partition may hold before the worker compacts it, where the store does not
(the embedded store keeps every record): an exactly-once source writes an entry per transaction, and a worker
that runs for months would keep (and read at each start) every one."""
MAINTAIN_EVERY_S = 60.0

Offsets = dict[str, dict[str, Any] | None]
"""A connector's offsets: canonical JSON of a source partition -> its offset (None: forgotten)."""


def canonical(partition: Mapping[str, Any]) -> str:
    """One text per source partition, whatever the order of its keys."""
    return json.dumps(partition, sort_keys=True, separators=(",", ":"))


def entry_key(connector: str, partition: Mapping[str, Any]) -> bytes:
    """The stream key of a connector's source partition (Kafka Connect's ``["name",{...}]``)."""
    return json.dumps([connector, partition], sort_keys=True, separators=(",", ":")).encode()


def entry_value(offset: Mapping[str, Any] | None) -> bytes | None:
    return None if offset is None else json.dumps(offset, sort_keys=True, separators=(",", ":")).encode()


class Deliveries:
    """The delivery callback of writes whose caller must learn of a failure: a record the store refused (its
    stream deleted meanwhile, a fenced writer, ...) is reported only through the callback, never raised, so a
    write without one fails silently. Give it as ``on_delivery``, flush, then :meth:`check`."""

    def __init__(self) -> None:
        self.failed: list[tuple[KafkaError, Message]] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed.append((error, message))

    def check(self, what: str) -> None:
        """Raise the first failure (its code and flags kept) naming ``what`` was not written; forget them all."""
        if not self.failed:
            return
        failed, self.failed = self.failed, []
        error, message = failed[0]
        raise KafkaException(KafkaError(
            error.code(), f"{what}: {len(failed)} record(s) to {message.topic()} failed delivery: {error.str()}",
            retriable=error.retriable(), fatal=error.fatal(), outcome_unknown=error.outcome_unknown()))


def _decode(key: bytes | None, value: bytes | None) -> tuple[str, str, dict[str, Any] | None] | None:
    """(connector, canonical partition, offset) of an entry; None for one that is not a valid entry."""
    try:
        connector, partition = json.loads(key or b"")
        offset = json.loads(value) if value is not None else None
    except (ValueError, TypeError):
        return None
    if not isinstance(connector, str) or not isinstance(partition, dict) or not isinstance(offset, dict | None):
        return None
    return connector, canonical(partition), offset


class OffsetStore(abc.ABC):
    """Committed source offsets of every connector."""

    stream: str | None = None
    """The stream the offsets are kept in (a transaction can write there), or None."""

    @abc.abstractmethod
    def offsets(self, connector: str) -> Offsets:
        """The connector's committed offsets (forgotten partitions left out)."""

    @abc.abstractmethod
    def write(self, connector: str, offsets: Offsets) -> None:
        """Store offsets outside any transaction (at-least-once, and the REST API's changes)."""

    def maintain(self) -> None:  # noqa: B027 - an optional hook
        """Keep the store bounded (call it now and then; nothing by default)."""

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the store holds (nothing by default)."""


class StreamOffsets(OffsetStore):
    """Offsets in a stream of the store, read incrementally (each call reads only what was added since).

    Where the stream is not compacted by the store (the embedded store), :meth:`maintain` compacts a partition
    once it holds :data:`COMPACT_AFTER` superseded entries: its live entries are appended again on the condition
    that the partition still ends where it was read to (an entry written meanwhile makes it wait for the next
    time), then everything before them is cut. Entries written later come after them, so the latest still wins.
    """

    def __init__(self, store: Store, stream: str, partitions: int, settings: TopicSettings,
                 client_conf: Mapping[str, Any]) -> None:
        self.stream: str | None = stream
        self._name = stream
        self._store = store
        self._client_conf = dict(client_conf)
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}
        self._latest: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._held_in: dict[tuple[str, str], int] = {}  # the partition holding each entry's latest version
        self._entries: dict[int, int] = {}  # entries read of each partition since its start (or its last compaction)
        self._producer: Producer | None = None
        self._compacting_writer: Writer | None = None
        self._compacted_by_store = settings.config.get("cleanup.policy") == "compact"
        self._next_maintenance = time.monotonic() + MAINTAIN_EVERY_S
        self._deliveries = Deliveries()
        ensure_stream(store, stream, partitions, settings)

    def offsets(self, connector: str) -> Offsets:
        with self._lock:
            self._catch_up()
            return {p: o for (c, p), o in self._latest.items() if c == connector and o is not None}

    def _catch_up(self) -> None:
        stream = self._name
        for partition in self._store.describe_stream(stream).partitions:
            position = self._positions.get(partition)
            state = self._store.partition_state(stream, partition)
            end = state.end_offset
            if position is None or position < state.start_offset:  # first read, or another worker compacted it
                self._forget(partition)  # what was cut is superseded by what follows, which is read whole again
                position = state.start_offset
            while position < end:
                messages = self._store.read(stream, partition, position, 10_000)
                if not messages:
                    break
                for message in messages:
                    entry = _decode(message.key(), message.value())
                    if entry is not None:
                        self._latest[(entry[0], entry[1])] = entry[2]
                        self._held_in[(entry[0], entry[1])] = partition
                self._entries[partition] = self._entries.get(partition, 0) + len(messages)
                position = (messages[-1].offset() or position) + 1
            self._positions[partition] = max(position, end)

    def write(self, connector: str, offsets: Offsets) -> None:
        """Store the offsets, or raise (the store then keeps the offsets it had: a restart repeats records)."""
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self._client_conf)
            stream = self._name
            for partition, offset in offsets.items():
                self._producer.produce(stream, entry_value(offset), key=entry_key(connector, json.loads(partition)),
                                       on_delivery=self._deliveries)
            self._producer.flush()
            self._deliveries.check(f"connector {connector}: source offsets")
        self.maintain()

    def maintain(self) -> None:
        """At most every :data:`MAINTAIN_EVERY_S`, compact the partitions that hold too many superseded entries
        (see the class docstring). A failure is logged: offsets stay as they were, only longer."""
        if self._compacted_by_store or time.monotonic() < self._next_maintenance:
            return
        with self._lock:
            self._next_maintenance = time.monotonic() + MAINTAIN_EVERY_S
            try:
                self._catch_up()
                for partition, entries in list(self._entries.items()):
                    live = {key: offset for key, offset in self._latest.items()
                            if self._held_in[key] == partition and offset is not None}
                    if entries - len(live) >= COMPACT_AFTER:
                        self._compact(partition, live)
            except KafkaException as exc:
                log.warning("offsets stream %s: compacting failed, tried again later: %s", self._name, exc)

    def _compact(self, partition: int, live: Mapping[tuple[str, str], dict[str, Any]]) -> None:
        """Append ``live`` (the partition's entries in force, as read up to its end) if the partition still ends
        there, then cut everything before them."""
        end = self._positions[partition]
        if live:
            if self._compacting_writer is None:
                self._compacting_writer = self._store.open_writer()
            records = [Record(entry_key(c, json.loads(p)), entry_value(o)) for (c, p), o in live.items()]
            try:
                self._compacting_writer.append(self._name, partition, records, expected_offset=end)
            except KafkaException as exc:
                if exc.code == ErrorCode.CAS_MISMATCH:
                    return  # an entry was written meanwhile: the next maintenance reads it first
                raise
        self._store.truncate_before(self._name, partition, end)
        self._forget(partition, keep=live)  # forgotten partitions' entries (None) are gone now
        log.info("offsets stream %s[%d]: compacted to %d entries", self._name, partition, len(live))

    def _forget(self, partition: int, keep: Container[tuple[str, str]] = ()) -> None:
        """Drop what was read of ``partition`` (but ``keep``): it is read again, or was cut."""
        for key in [k for k, held in self._held_in.items() if held == partition and k not in keep]:
            del self._held_in[key]
            del self._latest[key]
        self._entries[partition] = 0  # what stays is counted when read back

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        if self._compacting_writer is not None:
            self._compacting_writer.close()


class FileOffsets(OffsetStore):
    """Offsets in a JSON file, replaced atomically on each write (standalone, without exactly-once)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._data: dict[str, Offsets] = self._load()

    def _load(self) -> dict[str, Offsets]:
        if not self._path.exists():
            return {}
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError) as exc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"offset.storage.file.filename {self._path}: not an offsets file: {exc}")
        if not isinstance(data, dict):
            fail(ErrorCode.CORRUPT_MESSAGE, f"offset.storage.file.filename {self._path}: not an offsets file")
        return data

    def offsets(self, connector: str) -> Offsets:
        with self._lock:
            return {p: o for p, o in self._data.get(connector, {}).items() if o is not None}

    def write(self, connector: str, offsets: Offsets) -> None:
        with self._lock:
            mine = self._data.setdefault(connector, {})
            mine.update(offsets)
            for partition in [p for p, o in mine.items() if o is None]:
                del mine[partition]
            temporary = self._path.with_name(self._path.name + ".tmp")
            with open(temporary, "w") as out:
                json.dump(self._data, out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._path)


def compacted(store: Store, replication_factor: int) -> TopicSettings:
    """The settings of a worker's config, offsets and status streams: compacted on Kafka, as Kafka Connect creates
    its topics. The cluster's default policy deletes records older than ``retention.ms`` (7 days on Apache Kafka):
    connector configs and source offsets that are still in force would be gone, and with them the connectors and
    where their sources stood. The embedded store keeps every record: nothing to set there."""
    config = {"cleanup.policy": "compact"} if store.url.startswith("kafka://") else {}
    return TopicSettings(replication_factor=replication_factor, config=config)

