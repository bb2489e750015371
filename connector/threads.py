"""What objects shared by a process's threads use to take turns."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar


class _Locked(Protocol):
    _lock: threading.RLock


_S = TypeVar("_S", bound=_Locked)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def one_at_a_time(method: Callable[Concatenate[_S, _P], _T]) -> Callable[Concatenate[_S, _P], _T]:
    """A method of an object shared by a process's threads (its ``_lock``, re-entrant) that callers run in
    turn."""
    def serialized(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self._lock:
            return method(self, *args, **kwargs)
    serialized.__doc__ = method.__doc__
    return serialized


class SharedWork:
    """Work that a process's threads share, as a group commit shares a write: one caller does it under ``lock``
    while the others wait for it to end, not for their turn at the lock; then each looks whether that served it,
    and one of those it did not serve does the work again for all of them.

    Taking turns at the lock instead, each waiter woke the next only once it had the interpreter back: 64 threads
    looking at Kafka for one answer waited ~8 ms a turn, although the looks held the lock a quarter of the time.
    Others may hold ``lock`` for other work; a caller then takes its turn as before. ``work`` must not share this
    same work again (it would wait for itself)."""

    def __init__(self, lock: threading.Lock | threading.RLock) -> None:
        self._lock = lock
        self._on_its_way: threading.Event | None = None  # set once the work in flight ended and the lock is free

    def share(self, served: Callable[[], bool], work: Callable[[], object], wait_s: float) -> bool:
        """``work()`` under the lock unless ``served()``, which is asked again after each wait for work already on
        its way (``wait_s`` at most each); returns whether this caller was served, after its own work at most."""
        while not served():
            on_its_way = self._on_its_way
            if on_its_way is not None:
                on_its_way.wait(wait_s)
                continue
            done = None
            try:
                with self._lock:
                    if served():
                        return True
                    done = threading.Event()
                    try:
                        self._on_its_way = done
                        work()
                    finally:
                        self._on_its_way = None
            finally:
                if done is not None:
                    done.set()
            return served()
        return True
