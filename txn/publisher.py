"""Publishing, in the background, commits whose merge failed after their COMMIT was stored.

A committed transaction is committed whatever its merge does next, so :meth:`TransactionGroup.commit` returns
success even when the merge after it fails (a node down, the store unreachable for a while). Its records must
still become visible without waiting for some later commit: the publisher merges again, with growing pauses,
until the merge reaches every commit handed to it or the group closes (then the next merge in any process
publishes them: the merge rolls forward from the commit log).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from onceflow.connector.errors import KafkaException

log = logging.getLogger(__name__)

_FIRST_PAUSE_S = 0.05
_MAX_PAUSE_S = 5.0
_CLOSE_WAIT_S = 60.0  # a merge attempt in progress is bounded by the store's own timeouts


class Publisher:
    """Retries ``merge(until)`` in one background thread until it reaches the furthest commit handed to it."""

    def __init__(self, name: str, merge: Callable[[int], int]) -> None:
        self._name = name
        self._merge = merge
        self._cond = threading.Condition()
        self._until = 0  # the merge must reach this commit-log offset
        self._closed = False
        self._thread: threading.Thread | None = None

    def publish(self, until: int) -> None:
        """Merge (again, in the background) up to commit-log offset ``until``."""
        with self._cond:
            if self._closed:
                return
            self._until = max(self._until, until)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"txn-publish-{self._name}", daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=_CLOSE_WAIT_S)

    def _run(self) -> None:
        pause = _FIRST_PAUSE_S
        while True:
            with self._cond:
                if self._closed:
                    if self._until:
                        log.warning("group %s closed with commits not yet published (up to log entry %d); the "
                                    "next merge in any process publishes them", self._name, self._until)
                    return
                self._cond.wait(pause)
                if self._closed:
                    continue
                until = self._until
            try:
                reached = self._merge(until)
            except KafkaException as exc:
                log.info("group %s: publishing commits up to log entry %d failed again: %s", self._name, until, exc)
                pause = min(pause * 2, _MAX_PAUSE_S)
                continue
            with self._cond:
                if reached >= self._until:
                    log.info("group %s: commits up to log entry %d are published", self._name, reached)
                    self._until = 0
                    self._thread = None
                    return
            pause = _FIRST_PAUSE_S
