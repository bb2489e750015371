"""The processes of :mod:`onceflow.integration.workload` against the three-node cluster, for tests that kill nodes
from outside while they run. Every process records its operations; :meth:`Workload.check` hands the history to
:func:`onceflow.integration.checker.check`.

A process that exits with an error (an operation's error the role does not expect) is started again with the
next incarnation, as the crash matrix does with a killed one, and named in :attr:`Workload.crashed` with the end
of its stderr, so a test can say what a node's death did to the clients."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from onceflow.connector.store import open_store
from onceflow.integration.brokers import Broker
from onceflow.integration.checker import Report, check
from onceflow.integration.history import Op, load
from onceflow.integration.workload import STREAMS, read_everything, settle

FINAL_READER = "final-reader"  # read_everything's process name


class Stalled(AssertionError):
    """The workload made no progress for a while after a node came back (nothing was lost: the history was
    checked first)."""


class Workload:
    """Workload processes on a fresh namespace of ``broker``, recording into ``history``."""

    def __init__(self, broker: Broker, history: Path, ops: int = 10**6) -> None:
        self.namespace = f"f{uuid.uuid4().hex[:8]}"
        self.url = f"kafka://{broker.bootstrap}/{self.namespace}"
        self.history, self.ops = history, ops
        store = open_store(self.url)
        for stream, partitions in STREAMS.items():
            store.create_stream(stream, partitions)
        store.close()
        self.running: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # name.incarnation -> role, process
        self.incarnations: dict[str, int] = {}
        self.crashed: list[str] = []
        self.killed: list[str] = []

    def topic(self, stream: str) -> str:
        """The Kafka topic of a stream's first epoch."""
        return f"{self.namespace}.{stream}"

    def start(self, role: str, process: str) -> None:
        """Start ``process`` in ``role`` (its next incarnation); started after :meth:`go`, it begins at once."""
        incarnation = self.incarnations[process] = self.incarnations.get(process, -1) + 1
        name = f"{process}.{incarnation}"
        with open(self.history / f"{name}.stderr", "wb") as stderr:
            self.running[name] = (role, subprocess.Popen(
                [sys.executable, "-m", "onceflow.integration.workload", role, self.url, str(self.history), process,
                 str(incarnation), str(self.ops)], stdout=subprocess.DEVNULL, stderr=stderr))

    def go(self, timeout_s: float = 90) -> None:
        """Wait until every started process is ready, then let them all begin at once."""
        self._await(lambda: len(list(self.history.glob("ready.*"))) >= len(self.running), timeout_s,
                    "every process ready")
        (self.history / "go").touch()

    def completed(self, f: str, processes: Iterable[str] = ()) -> int:
        """How many ``f`` operations succeeded so far (of the named processes' incarnations, or of all)."""
        wanted = tuple(f"{p}." for p in processes)
        return sum(1 for op in load(self.history)
                   if op.f == f and op.type == "ok" and (not wanted or op.process.startswith(wanted)))

    def await_completed(self, f: str, n: int, timeout_s: float = 90, processes: Iterable[str] = ()) -> None:
        """Wait until ``n`` ``f`` operations succeeded in all."""
        names = tuple(processes)
        self._await(lambda: self.completed(f, names) >= n, timeout_s, f"{n} {f} operations ok")

    def progresses(self, f: str, more: int, timeout_s: float = 60) -> bool:
        """Whether ``more`` further ``f`` operations succeed within ``timeout_s`` (the workload runs on either way:
        a stall is a finding of its own, reported after the history was checked)."""
        n = self.completed(f) + more
        try:
            self._await(lambda: self.completed(f) >= n, timeout_s, f"{n} {f} operations ok")
        except TimeoutError:
            self.dump_stacks(f"{f}-stalled")
            return False
        return True

    def note(self, what: str) -> None:
        """Record a fault's moment (``faults.txt`` of the history, wall clock as the operations'), to tell a
        stall's time from the outage's."""
        with open(self.history / "faults.txt", "a") as notes:
            notes.write(f"{time.time():.3f} {what}\n")

    def dump_stacks(self, why: str) -> Path:
        """Every running process's Python stacks (py-spy, its children's too) into ``stacks.<why>.txt`` of the
        history, to see where a stalled process waits; the path is printed."""
        out = self.history / f"stacks.{why}.txt"
        with open(out, "w") as dump:
            for name, (role, popen) in sorted(self.running.items()):
                dump.write(f"=== {name} ({role}) pid {popen.pid} at {time.time():.3f}\n")
                dump.flush()
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(["py-spy", "dump", "--subprocesses", "--pid", str(popen.pid)], stdout=dump,
                                   stderr=subprocess.STDOUT, timeout=30, check=False)
        print(f"stacks of the processes: {out}")
        return out

    def leave(self, process: str) -> None:
        """Have a reader leave its group (its consumer closes)."""
        (self.history / f"leave.{process}").touch()

    def kill(self, process: str) -> None:
        """SIGKILL every running incarnation of ``process``; it is not started again."""
        for name, (_role, popen) in list(self.running.items()):
            if name.rsplit(".", 1)[0] == process:
                popen.kill()
                popen.wait()
                del self.running[name]

    def finish_writers(self, grace_s: float = 30) -> None:
        """Tell the writers to stop; SIGKILL those still running after ``grace_s`` (one stuck in a retry: its
        operation in flight stays unknown to the checker, as a crashed process's), named in :attr:`killed`."""
        (self.history / "writers.stop").touch()
        try:
            self._await(lambda: all(role == "reader" for role, _ in self.running.values()), grace_s,
                        "every writer done")
        except TimeoutError:
            self.dump_stacks("writers-stuck")
            for name, (role, popen) in list(self.running.items()):
                if role != "reader":
                    popen.kill()
                    popen.wait()
                    del self.running[name]
                    self.killed.append(name)

    def finish_readers(self, timeout_s: float = 60) -> None:
        """Tell the readers to stop and wait until each has exited; readers started later run again."""
        (self.history / "readers.stop").touch()
        self._await(lambda: not self.running, timeout_s, "every reader done")
        (self.history / "readers.stop").unlink()

    def read_everything(self) -> None:
        """One more reader reads every stream whole (the checker's complete reader), after merging every
        transaction group: a commit whose merge failed during the outage is published by the next merge."""
        settle(self.url)
        read_everything(self.url, self.history)

    def check(self, keep: Callable[[Op], bool] = lambda op: True) -> Report:
        """The checker's report on the history (on the operations ``keep`` selects)."""
        return check(op for op in load(self.history) if keep(op))

    def close(self) -> None:
        for _role, popen in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait()
        self.running.clear()

    def supervise(self) -> None:
        """Start again a process that exited with an error, and say so in :attr:`crashed`."""
        for name, (role, popen) in list(self.running.items()):
            code = popen.poll()
            if code is None:
                continue
            del self.running[name]
            if code == 0:
                continue
            tail = (self.history / f"{name}.stderr").read_text().strip().splitlines()[-1:]
            self.crashed.append(f"{name} ({role}) exited {code}: {' '.join(tail)}")
            process = name.rsplit(".", 1)[0]
            told_to_stop = ("readers.stop", f"leave.{process}") if role == "reader" else ("writers.stop",)
            if not any((self.history / stop).exists() for stop in told_to_stop):
                self.start(role, process)

    def _await(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            self.supervise()
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}; running: {sorted(self.running)}; "
                                   f"crashed: {self.crashed}")
            time.sleep(0.1)
        self.supervise()
