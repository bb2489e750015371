"""Store backends behind one contract; :func:`open_store` picks one from ``store.url``."""

from __future__ import annotations

from collections.abc import Iterator

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.message import Message
from onceflow.connector.store.contract import (
    NO_SEQUENCE,
    AppendCallback,
    AppendResult,
    Batch,
    Condition,
    EpochDescription,
    GiveUp,
    GroupMember,
    GroupSettings,
    OffsetCommit,
    PartitionKey,
    PartitionState,
    Record,
    Store,
    StreamDescription,
    Writer,
)

SCHEMES = ("sqlite", "kafka")


def read_range(store: Store, stream: str, partition: int, start: int | None = None,
               end: int | None = None) -> Iterator[Message]:
    """The records of a partition from ``start`` (default: its first) to ``end`` (default: its end now), in
    order, read in chunks (on Kafka fewer offsets than end - start: transaction markers take some)."""
    state = store.partition_state(stream, partition)
    offset = state.start_offset if start is None else start
    stop = state.end_offset if end is None else end
    while offset < stop:
        messages = store.read(stream, partition, offset, min(10_000, stop - offset))
        if not messages:
            return  # only transaction markers were left (Kafka)
        for message in messages:
            if (message.offset() or 0) >= stop:
                return
            yield message
        offset = (messages[-1].offset() or offset) + 1


def open_store(config: StoreConfig | str) -> Store:
    """Open the store a ``store.url`` names: ``sqlite://PATH`` (relative to the working directory) or
    ``kafka://HOST:PORT[,HOST:PORT...][/NAMESPACE]``."""
    if isinstance(config, str):
        config = StoreConfig(url=config)
    scheme, sep, location = config.url.partition("://")
    if not sep or scheme not in SCHEMES or not location:
        fail(ErrorCode.INVALID_CONFIG, f"store.url {config.url!r}: expected one of "
             f"{[s + '://...' for s in SCHEMES]}")
    if scheme == "kafka":
        from onceflow.connector.store.kafka import KafkaStore

        return KafkaStore(location, config)
    from onceflow.connector.store.sqlite import SqliteStore

    return SqliteStore(location, config)


__all__ = [
    "NO_SEQUENCE",
    "AppendCallback",
    "AppendResult",
    "Batch",
    "Condition",
    "EpochDescription",
    "GiveUp",
    "GroupMember",
    "GroupSettings",
    "OffsetCommit",
    "PartitionKey",
    "PartitionState",
    "Record",
    "Store",
    "StreamDescription",
    "Writer",
    "open_store",
    "read_range",
]
