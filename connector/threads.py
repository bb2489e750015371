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
