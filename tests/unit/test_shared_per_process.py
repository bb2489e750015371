"""Objects shared by the users of one process (stores, transaction groups): opened once, closed with the last."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
from typing import ClassVar

import pytest

from onceflow.connector.store.shared import SharedPerProcess


class Opened:
    freed: ClassVar[list[object]] = []  # keys of the objects freed (in a forked child: what it would tell its parent)

    def __init__(self, key: object) -> None:
        self.key = key
        self.closed = False

    def __del__(self) -> None:
        Opened.freed.append(self.key)
        Opened.on_free()

    @staticmethod
    def on_free() -> None:
        """Replaced by a test that must see where an object is freed."""


def registry(opening: threading.Event | None = None) -> tuple[SharedPerProcess[object, Opened], list[Opened]]:
    made: list[Opened] = []

    def open_one(key: object) -> Opened:
        if opening is not None and key == "slow":
            opening.wait(10)
        if key == "broken":
            raise OSError("cannot open")
        made.append(Opened(key))
        return made[-1]

    def close_one(value: Opened) -> None:
        value.closed = True

    return SharedPerProcess(open_one, close_one), made


def test_users_of_one_key_share_one_object_closed_by_the_last_release() -> None:
    shared, made = registry()
    first, second = shared.acquire("a"), shared.acquire("a")
    assert first is second and len(made) == 1
    shared.release(first)
    assert not first.closed and first in shared
    shared.release(second)
    assert first.closed and first not in shared
    assert shared.acquire("a") is not first  # opened again for a new user


def test_an_object_that_became_unusable_is_replaced_and_closed_by_its_last_user() -> None:
    """A Kafka store whose catalog went back is unusable for good: a new Producer gets a store opened anew."""
    made: list[Opened] = []
    broken: set[int] = set()
    shared: SharedPerProcess[str, Opened] = SharedPerProcess(
        lambda key: made.append(Opened(key)) or made[-1], lambda value: setattr(value, "closed", True),
        usable=lambda value: id(value) not in broken)
    old, also_old = shared.acquire("a"), shared.acquire("a")
    broken.add(id(old))
    new = shared.acquire("a")
    assert new is not old and old not in shared and new in shared
    shared.release(old)
    assert not old.closed
    shared.release(also_old)
    assert old.closed and not new.closed
    shared.release(new)
    assert new.closed


def test_a_forked_child_leaves_its_parents_retired_objects_alone() -> None:
    broken: set[int] = set()
    shared: SharedPerProcess[str, Opened] = SharedPerProcess(
        Opened, lambda value: setattr(value, "closed", True), usable=lambda value: id(value) not in broken)
    old = shared.acquire("a")
    broken.add(id(old))
    shared.acquire("a")  # retires the old one
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(10)
            shared.release(old)  # the parent's: neither closed nor forgotten in the child
            code = 0 if not old.closed else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_key_that_cannot_be_hashed_gets_an_object_of_its_own() -> None:
    shared, _ = registry()
    key = ("settings", {"acks": "all"})  # a librdkafka setting given as a dict
    first, second = shared.acquire(key), shared.acquire(key)
    assert first is not second
    shared.release(first)
    assert first.closed and not second.closed


def test_an_object_that_fails_to_open_is_not_kept_and_is_tried_again() -> None:
    shared, _ = registry()
    for _ in range(2):
        with pytest.raises(OSError):
            shared.acquire("broken")
    assert not shared._shared


def test_opening_one_object_holds_up_no_other() -> None:
    """A Kafka store's opening makes round trips (up to store.connect.timeout.ms to an unreachable cluster)."""
    opening = threading.Event()
    shared, _ = registry(opening)
    slow = threading.Thread(target=shared.acquire, args=("slow",), daemon=True)
    slow.start()
    other = shared.acquire("fast")
    shared.release(other)
    assert other.closed and slow.is_alive()
    opening.set()
    slow.join(10)


def test_a_forked_child_opens_its_own_though_a_parent_thread_held_the_registry() -> None:
    shared, made = registry()
    parent = id(shared.acquire("a"))
    made.clear()  # the registry's reference only, as for a group whose Producers are all in other objects
    gc.collect()
    Opened.freed.clear()
    with shared._lock:  # another thread of the parent, registering at the fork
        pid = os.fork()
        if pid == 0:  # the child: its own object, not a hang on the parent's lock
            code = 1
            try:
                signal.alarm(10)
                own = shared.acquire("a")
                inherited = next(e.value for e in shared._parents if e.value is not None)
                shared.release(inherited)  # the parent's, not the child's to close
                gc.collect()
                # The parent's object is neither freed nor closed in the child (a store's librdkafka clients
                # crashed it so).
                code = 0 if id(own) != parent and "a" not in Opened.freed and not inherited.closed else 1
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_child_of_a_subprocess_started_with_a_preexec_fn_frees_nothing() -> None:
    """PySpark starts its JVM so, and at-fork hooks run in that child: freeing a shared store's librdkafka clients
    there crashed it (here an object freed in the child ends it before it runs the command)."""
    shared, made = registry()
    shared.acquire("a")
    made.clear()  # the registry's reference only
    creator = os.getpid()
    Opened.on_free = lambda: os._exit(7) if os.getpid() != creator else None
    try:
        done = subprocess.run([sys.executable, "-c", "print('started')"], preexec_fn=lambda: None,
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        Opened.on_free = lambda: None
    assert (done.returncode, done.stdout.strip()) == (0, "started")
