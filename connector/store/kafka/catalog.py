"""The Kafka backend's catalog: streams' epochs and writers' epochs, kept in one single-partition topic.

Each catalog record is ``{"name", "base", "value"}``: a new version of one entry, valid only if ``base`` is
the catalog offset of the version it replaces (-1 for a new name). Every reader applies records in log order
and skips any whose base is stale, so of two racing changes exactly the first one in the log wins and every
process agrees which, without relying on Kafka transactions or their abort markers.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.store.kafka.clients import (
    ATTEMPT_S,
    TIMEOUT_S,
    ensure_topic,
    offset_of,
    offsets_client,
    refresh_metadata,
    through_leader_changes,
    translate,
)
from onceflow.connector.store.kafka.messages import drain
from onceflow.connector.threads import SharedWork, one_at_a_time


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
        self._looked_at = -math.inf  # monotonic time the last complete refresh asked for the end
        self.lost: KafkaError | None = None  # set once the catalog went back: this view is unusable for good
        self._lock = threading.RLock()
        self._looks = SharedWork(self._lock)

    def refresh(self, since: float | None = None) -> None:
        """Apply every catalog record up to the current end of the catalog topic, as a refresh that asks for the
        end strictly after monotonic time ``since`` (default: now) reads it; nothing if one did already (a look
        that only has to come after an event, or whose staleness costs at most a retry; strictly: on a coarse
        clock an equal reading may come before).

        Callers share refreshes (:class:`SharedWork`: 64 producers of a process, each looking for fencing twice a
        transaction, waited ~8 ms a look taking turns, and merges' looks at the seals behind them). ``_looked_at``
        is set only once what a refresh read is applied."""
        self.require_not_lost()
        since = time.monotonic() if since is None else since
        self._looks.share(lambda: self._looked_at > since, self._read_to_end, TIMEOUT_S)
        self.require_not_lost()  # a later look found the catalog gone back: nothing read from it counts now

    def _read_to_end(self) -> None:
        """One refresh; under the lock."""
        self.require_not_lost()
        asked = time.monotonic()
        _, high = through_leader_changes(lambda: self._offsets.get_watermark_offsets(self._tp, timeout=ATTEMPT_S),
                                         "reading the catalog's end offset",
                                         refresh=lambda: refresh_metadata(self._offsets, [self._topic]))
        if high < self._position:
            self.lost = KafkaError(
                ErrorCode._STATE, f"catalog {self._topic} went back from offset {self._position} to {high}: the "
                "cluster lost acknowledged data (a memory-only broker restarted?); reopen the store", fatal=True)
            raise KafkaException(self.lost)
        deadline = time.monotonic() + TIMEOUT_S
        while self._position < high:
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"catalog {self._topic}: reading to offset "
                                                f"{high} took over {TIMEOUT_S}s", retriable=True))
            runs, errors = drain(self._consumer, 1.0)
            for message in (message for _, run in runs for message in run):
                self._apply(offset_of(message), json.loads(message.value() or b"null"))
                self._position = offset_of(message) + 1
            for _, error in errors:  # after the records: one taken and not applied would be skipped for good
                raise translate(error, "reading the catalog")
        self._looked_at = asked

    def require_not_lost(self) -> None:
        """The catalog went back once: this view mixes what was lost with what follows, for good (a catalog grown
        again past where this view stood would otherwise be read on top of it)."""
        if self.lost is not None:
            raise KafkaException(self.lost)

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
        self.require_not_lost()
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
        try:
            # What is still queued was reported to its proposer as timed out; close() would wait for it without a
            # limit (librdkafka's message timeout: 300 s) after the brokers went away.
            self._producer.purge()
            self._producer.close()
        finally:
            self._consumer.close()
            self._offsets.close()
