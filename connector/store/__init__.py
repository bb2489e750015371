"""Store backends behind one contract; :func:`open_store` picks one from ``store.url``."""

from __future__ import annotations

from collections.abc import Iterator

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaException, fail
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
    RecordFields,
    Store,
    StreamDescription,
    TopicSettings,
    Writer,
    records_of,
)

SCHEMES = ("sqlite", "kafka")


def read_range(store: Store, stream: str, partition: int, start: int | None = None,
               end: int | None = None) -> Iterator[Message]:
    """Every record of a partition from ``start`` (default: its first) to ``end`` (default: its end now), in
    order (on Kafka fewer than end - start: transaction markers take some offsets).

    The one way to read "everything": ``Store.read`` returns one fetch, which may stop short of the end, so
    this loops until ``end``; a single ``read`` with a large ``max_records`` can silently miss records."""
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


def read_stream(store: Store, stream: str) -> Iterator[Message]:
    """Every record of every partition of ``stream`` (every epoch's), partition after partition, each read
    whole with :func:`read_range`."""
    for partition in store.describe_stream(stream).partitions:
        yield from read_range(store, stream, partition)


def describe_if_exists(store: Store, stream: str) -> StreamDescription | None:
    """The stream's description; None if it does not exist (any other error is raised)."""
    try:
        return store.describe_stream(stream)
    except KafkaException as exc:
        if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART:
            raise
        return None


def ensure_stream(store: Store, name: str, partitions: int, settings: TopicSettings | None = None) -> None:
    """Create the stream unless it exists (whatever its partitions and settings: a stream made by another process
    stands)."""
    try:
        store.create_stream(name, partitions, settings)
    except KafkaException as exc:
        if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise


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
    "RecordFields",
    "Store",
    "StreamDescription",
    "TopicSettings",
    "Writer",
    "describe_if_exists",
    "ensure_stream",
    "open_store",
    "read_range",
    "read_stream",
    "records_of",
]
