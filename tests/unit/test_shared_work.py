"""SharedWork: threads that need the same work done (a look at the catalog, a read of the commit log) share it."""

from __future__ import annotations

import threading
import time

from onceflow.connector.threads import SharedWork


class Looks:
    """Looks at something (as the catalog's end), counted; while ``hold`` is set, the next look is held on its way
    until ``release`` is set."""

    def __init__(self, hold: bool) -> None:
        self.lock = threading.Lock()
        self.shared = SharedWork(self.lock)
        self.made = 0
        self.looked_at = float("-inf")  # when the last look asked
        self.hold, self.on_its_way, self.release = hold, threading.Event(), threading.Event()

    def look(self) -> None:
        asked = time.monotonic()
        self.made += 1
        if self.hold:
            self.hold = False
            self.on_its_way.set()
            assert self.release.wait(30)
        self.looked_at = asked

    def fresh(self, since: float | None = None) -> bool:
        after = time.monotonic() if since is None else since
        return self.shared.share(lambda: self.looked_at > after, self.look, 30)


def started(work: object) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_callers_waiting_for_work_on_its_way_share_the_next_run() -> None:
    looks = Looks(hold=True)
    first = started(looks.fresh)
    assert looks.on_its_way.wait(10)
    calling = threading.Semaphore(0)
    served: list[bool] = []
    threads = [started(lambda: (calling.release(), served.append(looks.fresh()))) for _ in range(16)]
    for _ in threads:
        assert calling.acquire(timeout=10)
    time.sleep(0.2)  # each asks as it calls, right after it counted itself in
    looks.release.set()
    for thread in [first, *threads]:
        thread.join(10)
        assert not thread.is_alive()
    assert served == [True] * 16
    assert looks.made <= 3  # the held one, then one for all sixteen (one more for a thread slow to ask)


def test_a_caller_already_served_does_not_wait_for_work_on_its_way() -> None:
    looks = Looks(hold=False)
    since = time.monotonic()
    looks.fresh()
    looks.hold = True
    held = started(looks.fresh)
    assert looks.on_its_way.wait(10)
    served: list[bool] = []
    answered = started(lambda: served.append(looks.fresh(since)))
    answered.join(10)
    assert not answered.is_alive() and served == [True]
    assert looks.made == 2
    looks.release.set()
    held.join(10)


def test_work_that_fails_leaves_its_waiters_to_do_their_own() -> None:
    lock = threading.Lock()
    shared = SharedWork(lock)
    on_its_way, release = threading.Event(), threading.Event()
    done: list[str] = []

    def failing() -> None:
        on_its_way.set()
        assert release.wait(10)
        raise OSError("the look failed")

    errors: list[BaseException] = []

    def first() -> None:
        try:
            shared.share(lambda: False, failing, 10)
        except OSError as exc:
            errors.append(exc)

    failer = started(first)
    assert on_its_way.wait(10)
    waiter = started(lambda: shared.share(lambda: bool(done), lambda: done.append("own"), 10))
    time.sleep(0.1)
    release.set()
    failer.join(10)
    waiter.join(10)
    assert len(errors) == 1 and done == ["own"]
