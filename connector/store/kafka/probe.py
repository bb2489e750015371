"""Does the broker hide aborted transactional records from read_committed readers? Asked once per cluster.

onceflow's CAS appends and transactions on Kafka rest on Kafka's transactions: a write refused or fenced is
aborted, and readers never see it. A Kafka-protocol broker that shows aborted records to read_committed
readers (Tansu does: integration/PEER.md) would make refused writes visible, so the Kafka backend asks before
its first transactional write and refuses CAS and transactions there, unless the user opts in with
``store.kafka.allow.visible.aborts`` (knowing they do not hold).

The question is one experiment: a transaction writes a record and aborts, a second writes one and commits, and a
read_committed consumer reads the partition from the aborted record's offset: the first record it returns must
not be the aborted one (records of other processes' probes may come between; their aborted ones are hidden too).

The answer is recorded in the cluster (:data:`ANSWER_TOPIC`, written without transactions), and a process that
finds one there does not experiment: a prober killed mid-experiment leaves its transaction open, and until the
broker times it out (:data:`PROBE_TXN_TIMEOUT_MS`) no read_committed reader gets past it, so processes starting
then would all wait for the experiment's record.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import confluent_kafka as ck

# Bound at import: a test that wraps ck.Producer to script the broker's replies to onceflow's producers leaves
# the probe's own alone.
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.store.kafka.clients import TIMEOUT_S, ensure_topic, translate

PROBE_TOPIC = "__onceflow_probe"
ANSWER_TOPIC = "__onceflow_probe_answer"
PROBE_TXN_TIMEOUT_MS = 10_000  # how long a killed prober's open transaction can hold back the experiment's reads
_ABORTED, _COMMITTED = b"aborted", b"committed"
_VISIBLE, _HIDDEN = b"aborts visible", b"aborts hidden"

_answers: dict[str, bool] = {}  # bootstrap.servers -> whether that cluster shows aborted records
_lock = threading.Lock()


def aborts_visible(conf: Mapping[str, Any]) -> bool:
    """True if the cluster ``conf`` reaches shows aborted records to read_committed readers (asked once per
    cluster and process)."""
    bootstrap = str(conf["bootstrap.servers"])
    with _lock:
        if bootstrap not in _answers:
            _answers[bootstrap] = _ask(conf)
        return _answers[bootstrap]


def require_hidden_aborts(conf: Mapping[str, Any], allowed: bool, doing: str) -> None:
    """_UNSUPPORTED_FEATURE for ``doing`` on a broker that shows aborted records, unless ``allowed``."""
    if not allowed and aborts_visible(conf):
        fail(ErrorCode._UNSUPPORTED_FEATURE, f"{doing}: the broker at {conf['bootstrap.servers']} shows aborted "
             "transactional records to read_committed readers, so refused and fenced writes would become visible "
             "and neither CAS nor transactions can be exactly-once there; use Apache Kafka, or set "
             "store.kafka.allow.visible.aborts=true to use them anyway", fatal=True)


def _ask(conf: Mapping[str, Any]) -> bool:
    """The answer recorded in the cluster, else the experiment's, recorded for the next process."""
    admin = AdminClient(dict(conf))
    ensure_topic(admin, ANSWER_TOPIC, 1)
    recorded = _recorded(conf)
    if recorded is not None:
        return recorded
    ensure_topic(admin, PROBE_TOPIC, 1)
    visible = _experiment(conf)
    _record(conf, visible)
    return visible


def _recorded(conf: Mapping[str, Any]) -> bool | None:
    """The last answer recorded in :data:`ANSWER_TOPIC`; None if there is none yet."""
    consumer = Consumer({**conf, "group.id": f"onceflow-probe-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})
    try:
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(ANSWER_TOPIC, 0), timeout=TIMEOUT_S)
        if high <= low:
            return None
        return _first_readable(consumer, ANSWER_TOPIC, high - 1) == _VISIBLE
    except ck.KafkaException as exc:
        raise translate(exc, f"reading the recorded answer in {ANSWER_TOPIC}") from exc
    finally:
        consumer.close()


def _record(conf: Mapping[str, Any], visible: bool) -> None:
    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 0})
    producer.produce(ANSWER_TOPIC, _VISIBLE if visible else _HIDDEN, partition=0)
    if producer.flush(TIMEOUT_S):
        fail(ErrorCode._TIMED_OUT, f"the probe's answer was not delivered to {ANSWER_TOPIC}", retriable=True)


def _experiment(conf: Mapping[str, Any]) -> bool:
    """True if a read_committed reader gets this process's aborted record."""
    producer = Producer({**conf, "transactional.id": f"onceflow-probe-{uuid.uuid4().hex}", "linger.ms": 0,
                         "transaction.timeout.ms": PROBE_TXN_TIMEOUT_MS})
    try:
        producer.init_transactions(TIMEOUT_S)
        first = _write(producer, _ABORTED, commit=False)
        _write(producer, _COMMITTED, commit=True)
    except ck.KafkaException as exc:
        raise translate(exc, "asking the broker whether it hides aborted records") from exc
    finally:
        producer.flush(0)
    consumer = Consumer({**conf, "group.id": f"onceflow-probe-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        return _first_readable(consumer, PROBE_TOPIC, first) == _ABORTED
    finally:
        consumer.close()


def _write(producer: Producer, value: bytes, commit: bool) -> int:
    """One transaction of one record; the offset it landed at."""
    landed: list[int] = []
    producer.begin_transaction()
    producer.produce(PROBE_TOPIC, value, partition=0, on_delivery=lambda err, msg: landed.append(
        -1 if err is not None else msg.offset() or 0))
    producer.flush(TIMEOUT_S)
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.abort_transaction(TIMEOUT_S)
    if not landed or landed[0] < 0:
        fail(ErrorCode._TIMED_OUT, f"the probe record was not delivered to {PROBE_TOPIC}", retriable=True)
    return landed[0]


def _first_readable(consumer: Consumer, topic: str, offset: int) -> bytes:
    """The value of the first record ``consumer`` returns from ``offset`` of the topic's partition 0 on."""
    consumer.assign([ck.TopicPartition(topic, 0, offset)])
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            return message.value() or b""
    raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, f"the probe's record at {topic}[0] offset {offset} was "
                                    f"not readable within {TIMEOUT_S:.0f}s", retriable=True))
