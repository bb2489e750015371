"""confluent-kafka's records as onceflow's :class:`Message`\\ s of a stream's partition (the stream's name and
partition, not the topic's; onceflow's own header hidden).

A Consumer makes one per record it reads, so this is a hot path: ``_messages.c`` does it where pip built it, this
module's loop everywhere else (and it stays the reference the tests compare the compiled one with)."""

from __future__ import annotations

import confluent_kafka as ck

from onceflow.connector.message import Message
from onceflow.connector.store.kafka.clients import record_headers

try:  # built by pip where a C compiler is (see _messages.c); else the loop below does it all
    from onceflow.connector.store.kafka import _messages as _compiled  # type: ignore[attr-defined]
except ImportError:
    _compiled = None


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
