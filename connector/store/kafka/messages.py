"""The per-record work of reading Kafka: a fetch split into runs of records of one partition (and its errors), and
confluent-kafka's records as onceflow's :class:`Message`\\ s of a stream's partition (the stream's name and
partition, not the topic's; onceflow's own header hidden). And of writing it: :func:`send`, each record handed to
confluent-kafka's produce, and :class:`Reporter`, the delivery callback of each record written.

Every record a Consumer reads passes through the first two, and every record written through the last two, so they
are a hot path: ``_messages.c`` does them where pip built it, this module everywhere else (and it stays the
reference the tests compare the compiled ones with)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import confluent_kafka as ck

from onceflow.connector.message import Message
from onceflow.connector.store.contract import RecordFields
from onceflow.connector.store.kafka.clients import delivery_error, record_headers

try:  # built by pip where a C compiler is (see _messages.c); else the loop below does it all
    from onceflow.connector.store.kafka import _messages as _compiled  # type: ignore[attr-defined]
except ImportError:
    _compiled = None


def _read_fields() -> bool:
    """Whether the compiled conversion reads the fields of confluent-kafka's Message itself rather than calling its
    eight getters a record (``KafkaMessage`` in _messages.c): decided once, by a record whose every field is set
    and told apart from the others, so a release that moved one is refused and asked through its getters."""
    if _compiled is None:
        return False
    try:
        probe = ck.Message(topic="onceflow.probe", partition=1357, offset=0x12_3456_789A, key=b"probe-key",
                           value=b"probe-value", headers=[("probe", b"1")],
                           timestamp=(ck.TIMESTAMP_CREATE_TIME, 0x246_8ACE_0135),
                           error=ck.KafkaError(ck.KafkaError._PARTITION_EOF))
        return bool(_compiled.read_fields_of(ck.Message, probe))
    except (TypeError, ValueError, AttributeError):  # a Message that cannot be made or asked so: its getters, then
        return False


READS_FIELDS = _read_fields()
"""Whether confluent-kafka's Message fields are read directly (see :func:`_read_fields`)."""

UNTRACKED_CHUNK = 100
"""confluent-kafka's records taken by one consume() while draining a fetch (see :func:`drain`)."""

Run = tuple[tuple[str, int], list[ck.Message]]
FetchError = tuple[ck.Message, ck.KafkaError]


def drain(consumer: ck.Consumer, timeout_s: float, limit: int = 10_000) -> tuple[list[Run], list[FetchError]]:
    """The next message (waiting up to ``timeout_s``) and whatever else is already fetched: its records in runs of
    one partition each, and its errors with the message that carried each (its topic and partition).

    Apart, so that a caller takes every record before it acts on an error: the consumer's position is past each
    message it returned, so a record dropped because an error came before it in the batch is never read again
    (a reader raising at the first error skipped commit-log entries fetched behind a truncated partition's).

    Taken :data:`UNTRACKED_CHUNK` at a time: each of confluent-kafka's records is tracked by the garbage collector
    until :func:`in_runs` untracks it, and collections while thousands were (one consume of 10,000) carried them
    into the oldest generation, whose growth set off full collections, four per 200,000 records read, ~11 ms each.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return [], []
    runs, errors = in_runs([first])
    taken = 1
    while taken < limit:
        asked = min(UNTRACKED_CHUNK, limit - taken)
        chunk = consumer.consume(asked, timeout=0)
        more_runs, more_errors = in_runs(chunk)
        runs += more_runs
        errors += more_errors
        taken += len(chunk)
        if len(chunk) < asked:
            break
    return runs, errors


def in_runs(messages: list[ck.Message]) -> tuple[list[Run], list[FetchError]]:
    """A fetch's records in runs of consecutive records of one (topic, partition), and its errors with the message
    that carried each, in the order fetched."""
    if _compiled is not None:
        split: tuple[list[Run], list[FetchError]] = _compiled.in_runs(messages, ck.Message)
        return split
    runs: list[Run] = []
    errors: list[FetchError] = []
    run: list[ck.Message] = []
    key = None
    for message in messages:
        error = message.error()
        if error is not None:
            errors.append((message, error))
            continue
        if key is None or key[1] != message.partition() or key[0] != message.topic():
            key, run = (message.topic(), message.partition()), []
            runs.append((key, run))  # type: ignore[arg-type]
        run.append(message)
    return runs, errors


def as_messages(records: list[ck.Message], stream: str, partition: int) -> list[Message]:
    """``records`` (each a record, none an error) as Messages of ``stream``'s ``partition``."""
    if _compiled is not None:
        messages: list[Message] | None = _compiled.as_messages(records, stream, partition, Message, ck.Message,
                                                                    record_headers)
        if messages is not None:
            return messages
    out: list[Message] = []
    append = out.append
    for m in records:  # librdkafka's keys and values are bytes already
        kind, timestamp = m.timestamp()
        headers = m.headers()
        append(Message(stream, partition, m.offset(), m.key(), m.value(),
                       record_headers(headers) if headers else None, timestamp if kind else -1))
    return out


Report = Callable[[ck.KafkaError | None, ck.Message], None]


def send(produce: Callable[..., None], topic: str, partition: int, records: Sequence[RecordFields], report: Report,
         start: int = 0) -> tuple[int, BaseException | None]:
    """Hand ``records[start:]`` to ``produce`` (a confluent-kafka Producer's) until one is refused: the index of the
    first record not handed over (``len(records)`` when all were), and the exception that refused it (None).

    Returned, not raised (a KeyboardInterrupt too), so that the caller knows how many are on their way: a
    BufferError is librdkafka's queue full (it bounds records and bytes held: queue.buffering.max.messages and
    .kbytes), and the caller sends the rest once delivery reports made room."""
    if _compiled is not None:
        sent: tuple[int, BaseException | None] = _compiled.send(produce, topic, partition, records, report, start)
        return sent
    index = max(start, 0)
    for record in itertools.islice(records, index, None):
        try:
            key, value, headers, timestamp = record
            # Positional, in confluent-kafka's order (topic, value, key, partition, on_delivery, callback,
            # timestamp, headers): keywords took ~0.5 of its ~1.2 us a record.
            produce(topic, value, key, partition, report, None, timestamp if timestamp > 0 else 0,
                    (headers if type(headers) is list else list(headers)) if headers else None)
        except BaseException as exc:  # handed back: see above
            return index, exc
        index += 1
    return len(records), None


class Reporter:
    """The delivery callback of one batch's records: notes where each landed (``landed``, in the order reported), or
    why it did not (``errors``, as ``error_of`` makes them from a report, None for none); ``reported`` counts the
    reports. Written once per record, so compiled where pip built it (see :func:`reporter`): a Python callback
    cost ~0.4 us a record, a third of producing it."""

    __slots__ = ("_error_of", "errors", "landed", "reported")

    def __init__(self, landed: list[int], errors: list[ck.KafkaError],
                 error_of: Callable[[ck.KafkaError | None, ck.Message], ck.KafkaError | None]) -> None:
        self.landed = landed
        self.errors = errors
        self._error_of = error_of
        self.reported = 0

    def __call__(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        self.reported += 1
        if err is None:
            offset = msg.offset()
            if offset is not None:
                self.landed.append(offset)
                return
        error = self._error_of(err, msg)
        if error is not None:
            self.errors.append(error)


def reporter(landed: list[int], errors: list[ck.KafkaError]) -> Reporter:
    """A :class:`Reporter` of delivery errors as :func:`delivery_error` makes them: compiled where pip built it."""
    kind = Reporter if _compiled is None else _compiled.Reporter
    made: Reporter = kind(landed, errors, delivery_error)
    return made
