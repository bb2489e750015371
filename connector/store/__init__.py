"""Store backends behind one contract; :func:`open_store` picks one from ``store.url``."""

from __future__ import annotations

from connector.config import StoreConfig
from connector.errors import ErrorCode, fail
from connector.store.contract import (
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
        from connector.store.kafka import KafkaStore

        return KafkaStore(location, config)
    from connector.store.sqlite import SqliteStore

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
]
