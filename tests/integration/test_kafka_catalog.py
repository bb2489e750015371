"""The catalog on Kafka: a process's threads share their looks at it (each a round trip to the broker), and a look
asked for now sees every change made before it was asked for, even one made while another thread's look was on
its way."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from onceflow.connector.store import Store, open_store
from onceflow.connector.store.kafka import catalog
from onceflow.integration.brokers import Broker

pytestmark = pytest.mark.kafka

END = "reading the catalog's end offset"


@pytest.fixture
def url(kafka_broker: Broker) -> str:
    return f"kafka://{kafka_broker.bootstrap}/cat{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    with contextlib.closing(open_store(url)) as s:
        yield s


class HeldLooks:
    """Looks at the catalog's end, counted; while ``hold`` is clear, one made in a thread named ``held`` waits for
    it (a slow broker) after its answer came, before what it found is read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked = 0
        self.hold = threading.Event()
        self.waiting = threading.Event()
        real = catalog.through_leader_changes

        def look(ask: Callable[[], Any], doing: str, **kw: Any) -> Any:
            answer = real(ask, doing, **kw)
            if doing == END:
                self.asked += 1
                if threading.current_thread().name == "held":
                    self.waiting.set()
                    assert self.hold.wait(30), "a held look was never let go"
            return answer

        monkeypatch.setattr(catalog, "through_leader_changes", look)


def in_thread(work: Callable[[], None], name: str | None = None) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True, name=name)
    thread.start()
    return thread


def looking(catalog_view: catalog.Catalog, calling: threading.Semaphore) -> threading.Thread:
    """A thread that counts itself in (``calling``), then asks for a fresh look."""
    def look() -> None:
        calling.release()
        catalog_view.refresh()
    return in_thread(look)


def held_look(looks: HeldLooks, catalog_view: catalog.Catalog) -> threading.Thread:
    """A fresh look by another thread, on its way: it asked for the catalog's end and is held up there."""
    thread = in_thread(catalog_view.refresh, name="held")
    assert looks.waiting.wait(30)
    return thread


def test_threads_that_look_at_the_catalog_together_share_round_trips(store: Store,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen threads ask for a fresh look while one is on its way: they wait for it to end, then one of them
    looks again for all of them (each of its own, sixteen round trips, was a queue: with 64 producers a look for
    fencing waited ~8 ms)."""
    looks = HeldLooks(monkeypatch)
    first = held_look(looks, store._catalog)  # type: ignore[attr-defined]
    calling = threading.Semaphore(0)
    threads = [looking(store._catalog, calling) for _ in range(16)]  # type: ignore[attr-defined]
    for _ in threads:
        assert calling.acquire(timeout=30)
    time.sleep(0.2)  # (each asks as it calls, right after it counted itself in)
    looks.hold.set()
    for thread in [first, *threads]:
        thread.join(30)
        assert not thread.is_alive()
    # The one on its way, then one asked after the sixteen had asked (a thread slow to ask after counting itself
    # in may need one more): each looking for itself made 17.
    assert looks.asked <= 3


def test_a_look_already_made_since_an_event_does_not_wait_for_a_look_on_its_way(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer's look for fencing only has to come after its BEGIN was stored: one made since serves it, at
    once, even while another thread's look is held up."""
    catalog_view = store._catalog  # type: ignore[attr-defined]
    since = time.monotonic()
    catalog_view.refresh()
    looks = HeldLooks(monkeypatch)
    held = held_look(looks, catalog_view)
    served = in_thread(lambda: catalog_view.refresh(since))
    served.join(30)
    assert not served.is_alive(), "a look already served waited for the held one"
    assert looks.asked == 1
    looks.hold.set()
    held.join(30)


def test_a_fresh_look_sees_a_change_made_while_another_look_was_on_its_way(url: str, store: Store,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A look asked for now is not served by one that asked for the catalog's end before a change landed: the
    stream created meanwhile by another process is seen."""
    catalog_view = store._catalog  # type: ignore[attr-defined]
    with contextlib.closing(open_store(url)) as other:
        looks = HeldLooks(monkeypatch)
        held = held_look(looks, catalog_view)  # it has the catalog's end: what lands now is past it
        other.create_stream("orders", 2)
    calling = threading.Semaphore(0)
    fresh = looking(catalog_view, calling)
    assert calling.acquire(timeout=30)
    time.sleep(0.2)  # it asks while the held look is on its way
    looks.hold.set()
    held.join(30)
    fresh.join(30)
    assert not fresh.is_alive()
    assert catalog_view.get("stream:orders") is not None
