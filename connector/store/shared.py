"""Stores shared by the clients of one process that name the same store.

A Kafka store holds ten librdkafka clients (its catalog's, its readers', an admin), each with threads of its own,
and reads the catalog for every writer.id's fencing look. With a store each, 64 Producers of one process ran 3067
OS threads and each looked at the catalog on its own for every transaction. Producers sharing one store share
those clients, and one look serves every commit waiting for it. Writers stay each client's own (a ``writer.id``
is fenced alone), and a shared store is closed with the last client that uses it.

Stores are keyed by process id, so a forked child opens its own, and by the working directory, which a relative
``sqlite://`` path depends on.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from onceflow.connector.config import StoreConfig
from onceflow.connector.store import Store, open_store

_Key = tuple[int, str, StoreConfig]


@dataclasses.dataclass
class _Shared:
    store: Store
    users: int


_lock = threading.Lock()
_stores: dict[_Key, _Shared] = {}


def acquire(config: StoreConfig) -> Store:
    """The process's store for ``config``, opened if no one uses it; :func:`release` it."""
    key = (os.getpid(), os.getcwd(), config)
    with _lock:
        shared = _stores.get(key)
        if shared is None:
            shared = _stores[key] = _Shared(open_store(config), 0)
        shared.users += 1
        return shared.store


def release(store: Store) -> None:
    """One user less of ``store``; the last one closes it."""
    with _lock:
        key = next(key for key, shared in _stores.items() if shared.store is store)
        shared = _stores[key]
        shared.users -= 1
        if shared.users:
            return
        del _stores[key]
    store.close()
