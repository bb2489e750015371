"""Stores shared by the clients of one process that name the same store.

A Kafka store holds ten librdkafka clients (its catalog's, its readers', an admin), each with threads of its own,
and reads the catalog for every writer.id's fencing look. With a store each, 64 Producers of one process ran 3067
OS threads and each looked at the catalog on its own for every transaction. Producers sharing one store share
those clients, and one look serves every commit waiting for it. Writers stay each client's own (a ``writer.id``
is fenced alone), and a shared store is closed with the last client that uses it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from onceflow.connector.config import StoreConfig
from onceflow.connector.store import Store, open_store

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedPerProcess(Generic[K, V]):
    """Objects shared by the users of one process: opened by the first :meth:`acquire` of a key, closed by the last
    :meth:`release`. Keyed by process id too, so a forked child opens its own, and by the working directory, which
    a relative ``sqlite://`` path depends on."""

    def __init__(self, open_one: Callable[[K], V], close_one: Callable[[V], None]) -> None:
        self._open = open_one
        self._close = close_one
        self._lock = threading.Lock()
        self._shared: dict[tuple[int, str, K], tuple[V, int]] = {}  # the object and its users

    def acquire(self, key: K) -> V:
        """The process's object for ``key``, opened if no one uses it; :meth:`release` it."""
        full_key = (os.getpid(), os.getcwd(), key)
        with self._lock:
            value, users = self._shared.get(full_key) or (self._open(key), 0)
            self._shared[full_key] = (value, users + 1)
            return value

    def release(self, value: V) -> None:
        """One user less of ``value``; the last one closes it."""
        with self._lock:
            key = next(key for key, (shared, _) in self._shared.items() if shared is value)
            users = self._shared[key][1] - 1
            if users:
                self._shared[key] = (value, users)
                return
            del self._shared[key]
        self._close(value)

    def __contains__(self, value: object) -> bool:
        with self._lock:
            return any(shared is value for shared, _ in self._shared.values())


stores: SharedPerProcess[StoreConfig, Store] = SharedPerProcess(open_store, lambda store: store.close())
