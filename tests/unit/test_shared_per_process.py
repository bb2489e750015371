"""Objects shared by the users of one process (stores, transaction groups): opened once, closed with the last."""

from __future__ import annotations

import threading

import pytest

from onceflow.connector.store.shared import SharedPerProcess


class Opened:
    def __init__(self, key: object) -> None:
        self.key = key
        self.closed = False


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
