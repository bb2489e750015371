"""The per-record work of reading Kafka: a fetch split into runs of records of one partition (and its errors), and
confluent-kafka's records as onceflow's :class:`Message`\\ s of a stream's partition (the stream's name and
partition, not the topic's; onceflow's own header hidden).

Every record a Consumer reads passes through both, so they are a hot path: ``_messages.c`` does them where pip
built it, this module's loops everywhere else (and they stay the reference the tests compare the compiled ones
with)."""

from __future__ import annotations

import confluent_kafka as ck

from onceflow.connector.message import Message
from onceflow.connector.store.kafka.clients import record_headers

try:  # built by pip where a C compiler is (see _messages.c); else the loop below does it all
    from onceflow.connector.store.kafka import _messages as _compiled  # type: ignore[attr-defined]
except ImportError:
    _compiled = None


Run = tuple[tuple[str, int], list[ck.Message]]
FetchError = tuple[ck.Message, ck.KafkaError]


def drain(consumer: ck.Consumer, timeout_s: float, limit: int = 10_000) -> tuple[list[Run], list[FetchError]]:
    """The next message (waiting up to ``timeout_s``) and whatever else is already fetched: its records in runs of
    one partition each, and its errors with the message that carried each (its topic and partition).

    Apart, so that a caller takes every record before it acts on an error: the consumer's position is past each
    message it returned, so a record dropped because an error came before it in the batch is never read again
    (a reader raising at the first error skipped commit-log entries fetched behind a truncated partition's).
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return [], []
    return in_runs([first, *consumer.consume(limit, timeout=0)])


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
