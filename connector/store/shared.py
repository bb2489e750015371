"""Stores shared by the clients of one process that name the same store.

A Kafka store holds ten librdkafka clients (its catalog's, its readers', an admin), each with threads of its own,
and reads the catalog for every writer.id's fencing look. With a store each, 64 Producers of one process ran 3067
OS threads and each looked at the catalog on its own for every transaction. Producers sharing one store share
those clients, and one look serves every commit waiting for it. Writers stay each client's own (a ``writer.id``
is fenced alone), and a shared store is closed with the last client that uses it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from onceflow.connector.config import StoreConfig
from onceflow.connector.store import Store, open_store

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclasses.dataclass
class _Entry(Generic[V]):
    """One shared object: opened by its first user under ``opening``, which the others wait for."""

    users: int = 0
    value: V | None = None
    opening: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SharedPerProcess(Generic[K, V]):
    """Objects shared by the users of one process: opened by the first :meth:`acquire` of a key, closed by the last
    :meth:`release`. Keyed by process id too, so a forked child opens its own, and by the working directory, which
    a relative ``sqlite://`` path depends on. A key that cannot be hashed (a librdkafka setting given as a dict)
    or a working directory that is gone gets an object of its own, closed by its one release."""

    def __init__(self, open_one: Callable[[K], V], close_one: Callable[[V], None],
                 usable: Callable[[V], bool] = lambda value: True) -> None:
        """``usable``: False for an object that can no longer serve: the next acquire opens a new one, and the
        old one is closed by the last of the users it had."""
        self._open = open_one
        self._close = close_one
        self._usable = usable
        self._lock = threading.Lock()  # guards the registry only: opening one (network round trips) is outside it
        self._shared: dict[tuple[int, str, K], _Entry[V]] = {}
        self._retired: list[_Entry[V]] = []  # unusable ones, until their users release them
        self._parents: list[_Entry[V]] = []  # a forked child's copies of its parents' (see _forget_parents)
        os.register_at_fork(after_in_child=self._forget_parents)

    def acquire(self, key: K) -> V:
        """The process's object for ``key``, opened if no one uses it; :meth:`release` it."""
        try:
            full_key = (os.getpid(), os.getcwd(), key)
            hash(full_key)
        except (TypeError, OSError):
            return self._open(key)
        with self._lock:
            entry = self._shared.setdefault(full_key, _Entry())
            if entry.value is not None and not self._usable(entry.value):
                self._retired.append(self._shared.pop(full_key))
                entry = self._shared[full_key] = _Entry()
            entry.users += 1
        try:
            with entry.opening:
                if entry.value is None:
                    entry.value = self._open(key)
                return entry.value
        except BaseException:
            self._drop_user(entry)  # the next user to come tries to open it again
            raise

    def release(self, value: V) -> None:
        """One user less of ``value``; the last one closes it."""
        with self._lock:
            entry = next((e for e in (*self._shared.values(), *self._retired) if e.value is value), None)
            if entry is None and any(e.value is value for e in self._parents):
                return  # a forked child's copy of its parent's: the parent's to close (see _forget_parents)
        if entry is None or self._drop_user(entry):  # None: never shared (see acquire)
            self._close(value)

    def _drop_user(self, entry: _Entry[V]) -> bool:
        """One user less of ``entry``; True if it was the last (then it is no longer kept, shared or retired)."""
        with self._lock:
            entry.users -= 1
            if entry.users:
                return False
            self._shared = {key: e for key, e in self._shared.items() if e is not entry}
            self._retired = [e for e in self._retired if e is not entry]
            return True

    def __contains__(self, value: object) -> bool:
        with self._lock:
            return any(entry.value is value for entry in self._shared.values())

    def _forget_parents(self) -> None:
        """In a forked child (at the fork, single-threaded): the parent's objects, shared or retired, and a lock
        another thread of the parent may have held then. The objects stay referenced and a child's release leaves
        them alone: freeing or closing a store there would free its librdkafka clients, whose threads the child
        does not have (it crashed the child of the subprocess PySpark starts its JVM with, where at-fork hooks run
        too). A child that ends by interpreter shutdown, rather than exec or ``os._exit``, frees them then."""
        self._parents += [*self._shared.values(), *self._retired]
        self._shared, self._retired = {}, []
        self._lock = threading.Lock()


stores: SharedPerProcess[StoreConfig, Store] = SharedPerProcess(
    open_store, lambda store: store.close(), usable=lambda store: store.unusable is None)
