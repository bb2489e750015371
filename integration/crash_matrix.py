"""The crash matrix: every failpoint and backend, a multi-process workload, a SIGKILL, a restart, the checker.

Each cell starts the processes of :mod:`onceflow.integration.workload` (fenced appenders, one of them overtaken by a
second instance while it writes, CAS racers, a bank of transfers, a transaction written by three processes, the
exactly-once sink's protocol, a scale of a stream, readers in a group) with one failpoint armed as
``crash@N`` across all of them, so exactly one process is SIGKILLed at its N-th passage. The killed process is
started again; when every writer is done the readers stop, one more reader reads every stream whole, and the
history of all operations goes to :func:`onceflow.integration.checker.check`.

    python -m onceflow.integration.crash_matrix                          # the full matrix, on SQLite and Kafka
    python -m onceflow.integration.crash_matrix --short --backend sqlite  # what CI runs per backend
    python -m onceflow.integration.crash_matrix --soak 120               # random kills for two minutes

Kafka cells run against :func:`onceflow.integration.brokers.kafka_broker` (``KAFKA_BOOTSTRAP``, Apache Kafka, Docker, or
Tansu); a local Apache Kafka keeps a memberless group's offsets for one minute, not seven days
(``SHORT_OFFSETS_RETENTION``). Eight processes commit in the default transaction group (seven ``bank`` processes
of two Producer threads each, and the holder of open transactions), each truncating after every merged entry.
The table is printed and written to ``--out`` (Markdown, plus the same rows as JSON next to it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from onceflow.connector.failpoints import ENV_VAR as FAILPOINTS_VAR
from onceflow.connector.failpoints import FAILPOINTS, HITS_DIR_VAR
from onceflow.connector.store import open_store
from onceflow.integration.brokers import SHORT_OFFSETS_RETENTION, kafka_broker
from onceflow.integration.checker import Report, check
from onceflow.integration.history import load
from onceflow.integration.workload import STREAMS, read_everything

BACKENDS = ("sqlite", "kafka")
DEFAULT_OPS = {"sqlite": 30, "kafka": 10}  # per process; a Kafka transaction costs ~100 ms, a sink batch ~2 s
# role -> process names. "zombie" is a second instance of an appender, started while the first writes: it
# fences the first.
PROCESSES = {"appender": ("app0", "app1"), "cas": ("cas0", "cas1"), "bank": tuple(f"bank{i}" for i in range(7)),
             "multi": ("multi0",), "sink": ("sink0",), "scaler": ("scaler",), "open-txn": ("open0",),
             "reader": ("reader0", "reader1"), "zombie": ("app0",)}
# What Tansu cannot show correct (integration/PEER.md): it shows aborted transactional writes, and a refused Kafka
# CAS aborts its write, so one CAS writer runs, uncontended; and a transactional.id fenced while other producers'
# transactions are in flight can hide records they committed, so no zombie.
TANSU_PROCESSES = {**{r: n for r, n in PROCESSES.items() if r != "zombie"}, "cas": ("cas0",)}
ZOMBIE_AFTER_S = 0.1  # after the start, plus its own start-up: while the first instance writes
CELL_TIMEOUT_S = 240.0
READERS_STOP_S = 60.0
LINGERING = frozenset({"reader", "open-txn"})  # roles that run until they are told to stop
OFF_THE_WORKLOAD = {  # failpoints the workload never passes, and the tests that stop a process there instead
    "txn.commit.after_claim": "tests/crash/test_member_fencing.py (no workload process is a group member that "
                              "sends offsets)",
}
# Failpoints the workload passes once (a scale, a transactional producer's start): they kill at the first passage.
PASSED_ONCE = frozenset({"sqlite.scale.after_seal", "kafka.scale.before_seal", "producer.init.after_fence"})


def applies(failpoint: str, backend: str) -> bool:
    """Whether a failpoint is on the code path of a backend's workload."""
    if failpoint in OFF_THE_WORKLOAD:
        return False
    if failpoint.startswith("sqlite."):
        return backend == "sqlite"
    if failpoint.startswith("kafka."):
        return backend == "kafka"
    return True


@dataclasses.dataclass(frozen=True)
class Cell:
    backend: str
    failpoint: str | None  # None: a soak run, killing at random
    hit: int = 2  # the passage (across all processes) at which the failpoint kills


@dataclasses.dataclass
class CellResult:
    cell: Cell
    killed: list[str]
    report: Report | None
    seconds: float
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.killed) and self.report is not None and self.report.valid

    def row(self) -> dict[str, object]:
        ops = self.report.operations if self.report else {}
        return {
            "backend": self.cell.backend, "failpoint": self.cell.failpoint or "random kills",
            "killed": ", ".join(self.killed) if len(self.killed) <= 3 else f"{len(self.killed)} processes",
            "ok": sum(n for k, n in ops.items() if k.endswith(" ok") and not k.startswith("read")),
            "fail": sum(n for k, n in ops.items() if k.endswith(" fail")),
            "info": sum(n for k, n in ops.items() if k.endswith(" info")),
            "reads": ops.get("read ok", 0),
            "result": "pass" if self.passed else "FAIL",
            "detail": self.error or ("" if self.report is None or self.report.valid else self.report.summary())
            or ("" if self.killed else "the failpoint was never reached"),
            "seconds": round(self.seconds, 1),
        }


class _Workload:
    """The processes of one cell, started again whenever one is killed."""

    def __init__(self, store_url: str, workdir: Path, env: dict[str, str], ops: int) -> None:
        self.store_url, self.workdir, self.env, self.ops = store_url, workdir, env, ops
        self.running: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}  # process -> (role, popen)
        self.incarnations: dict[str, int] = {}
        self.killed: list[str] = []

    def start(self, role: str, process: str) -> None:
        incarnation = self.incarnations.get(process, -1) + 1
        self.incarnations[process] = incarnation
        name = f"{process}.{incarnation}"
        with open(self.workdir / f"{name}.stderr", "wb") as stderr:
            popen = subprocess.Popen(
                [sys.executable, "-m", "onceflow.integration.workload", role, self.store_url, str(self.workdir),
                 process, str(incarnation), str(self.ops)], env=self.env, stdout=subprocess.DEVNULL, stderr=stderr)
        self.running[name] = (role, popen)

    def supervise(self) -> list[str]:
        """Restart processes that were killed; returns the roles still running. Raises on any other exit."""
        for name, (role, popen) in list(self.running.items()):
            code = popen.poll()
            if code is None:
                continue
            del self.running[name]
            if code == -signal.SIGKILL:
                self.killed.append(name)
                self.start(role, name.rsplit(".", 1)[0])
            elif code != 0:
                stderr = (self.workdir / f"{name}.stderr").read_text()[-2000:]
                raise RuntimeError(f"{name} ({role}) exited {code}: {stderr}")
        return [role for role, _ in self.running.values()]

    def kill_one_at_random(self, rng: random.Random) -> None:
        candidates = [popen for role, popen in self.running.values() if role != "reader"]
        if candidates:
            with contextlib.suppress(ProcessLookupError):
                rng.choice(candidates).send_signal(signal.SIGKILL)

    def stop_all(self) -> None:
        for _role, popen in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait()


def run_cell(cell: Cell, store_url: str, workdir: Path, ops: int, soak_s: float = 0.0, seed: int = 0,
             processes: dict[str, tuple[str, ...]] = PROCESSES) -> CellResult:
    """Run one cell's workload against a fresh store and check its history."""
    started = time.monotonic()
    store = open_store(store_url)
    for stream, partitions in STREAMS.items():
        store.create_stream(stream, partitions)
    store.close()
    (workdir / "hits").mkdir()
    env = {**os.environ, HITS_DIR_VAR: str(workdir / "hits"),
           FAILPOINTS_VAR: f"{cell.failpoint}=crash@{cell.hit}" if cell.failpoint else ""}
    workload = _Workload(store_url, workdir, env, ops)
    try:
        _drive(workload, processes, started, soak_s, random.Random(seed))
        read_everything(store_url, workdir)
        return CellResult(cell, workload.killed, check(load(workdir)), time.monotonic() - started)
    except (RuntimeError, TimeoutError) as exc:
        return CellResult(cell, workload.killed, None, time.monotonic() - started, str(exc))
    finally:
        workload.stop_all()


def _drive(workload: _Workload, processes: dict[str, tuple[str, ...]], started: float, soak_s: float,
           rng: random.Random) -> None:
    for role, names in processes.items():
        for process in names if role != "zombie" else ():
            workload.start(role, process)
    _start_together(workload, len(workload.running))
    go = time.monotonic()
    zombies, next_kill = list(processes.get("zombie", ())), go + 1.0
    while True:
        roles = workload.supervise()
        now = time.monotonic()
        if zombies and now - go > ZOMBIE_AFTER_S:
            workload.start("appender", zombies.pop())  # fences the running instance of its writer.id
        if soak_s:
            if now - started >= soak_s:
                (workload.workdir / "writers.stop").touch()
            elif now >= next_kill:
                workload.kill_one_at_random(rng)
                next_kill = now + rng.uniform(0.5, 2.0)
        if all(role in LINGERING for role in roles) and not zombies:
            break
        if now - started > CELL_TIMEOUT_S + soak_s:
            raise TimeoutError(f"the workload did not finish in {CELL_TIMEOUT_S + soak_s:.0f} s: {roles}")
        time.sleep(0.05)
    (workload.workdir / "writers.stop").touch()  # the open transactions' holder leaves
    (workload.workdir / "readers.stop").touch()
    deadline = time.monotonic() + READERS_STOP_S
    while workload.supervise():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{workload.supervise()} still running {READERS_STOP_S:.0f} s after they were told to "
                               "stop")
        time.sleep(0.05)


def _start_together(workload: _Workload, processes: int) -> None:
    """Wait until every process is ready (or died trying: it is restarted), then let them all go."""
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while len(list(workload.workdir.glob("ready.*"))) < processes:
        workload.supervise()
        if time.monotonic() > deadline:
            raise TimeoutError("the workload's processes did not get ready")
        time.sleep(0.02)
    (workload.workdir / "go").touch()


def plan(backends: list[str], short: bool) -> list[Cell]:
    """Every failpoint that applies to each backend; the short plan keeps one per family of failpoints."""
    cells = [Cell(b, f, 1 if f in PASSED_ONCE else 2) for b in backends for f in FAILPOINTS if applies(f, b)]
    if short:
        families: set[tuple[str, str]] = set()
        kept = []
        for cell in cells:
            family = (cell.backend, ".".join((cell.failpoint or "").split(".")[:2]))
            if family not in families:
                families.add(family)
                kept.append(cell)
        cells = kept
    return cells


@contextlib.contextmanager
def _stores(backend: str, workdir: Path) -> Iterator[tuple[Iterator[str], dict[str, tuple[str, ...]]]]:
    """Fresh store URLs for a backend's cells (Kafka: one broker, a namespace per cell), and the processes
    its workload can run."""
    if backend == "sqlite":
        yield (f"sqlite://{workdir / f'cell{i}.db'}" for i in range(10**6)), PROCESSES
        return
    with kafka_broker(settings=SHORT_OFFSETS_RETENTION) as broker:
        urls = (f"kafka://{broker.bootstrap}/m{uuid.uuid4().hex[:10]}" for _ in range(10**6))
        yield urls, TANSU_PROCESSES if broker.kind == "tansu" else PROCESSES


def run(cells: list[Cell], ops: int | None, soak_s: float, console: Console,
        keep: Path | None = None) -> list[CellResult]:
    """Run the cells, backend by backend; ``ops`` per process (None: the backend's default; unbounded in a
    soak, which runs until ``soak_s`` is over)."""
    results: list[CellResult] = []
    with contextlib.ExitStack() as stack:
        tmp = str(keep) if keep else stack.enter_context(tempfile.TemporaryDirectory(prefix="onceflow-matrix-"))
        for backend in dict.fromkeys(c.backend for c in cells):
            with _stores(backend, Path(tmp)) as (urls, processes):
                if processes is not PROCESSES:
                    console.log(f"{backend}: the peer is Tansu: one CAS writer, no zombie (integration/PEER.md)")
                for n, cell in enumerate(c for c in cells if c.backend == backend):
                    workdir = Path(tmp) / f"{backend}-{n}"
                    workdir.mkdir(parents=True)
                    with console.status(f"{backend}: {cell.failpoint or 'random kills'}"):
                        per_process = 10**9 if soak_s else ops or DEFAULT_OPS[backend]
                        result = run_cell(cell, next(urls), workdir, per_process, soak_s, n, processes)
                    row = result.row()
                    console.log(f"{row['result']} {backend} {row['failpoint']} killed={row['killed']} "
                                f"ok={row['ok']} in {row['seconds']} s {row['detail']}")
                    results.append(result)
    return results


def table(results: list[CellResult]) -> Table:
    t = Table(title="crash matrix")
    columns = ("backend", "failpoint", "killed", "ok", "fail", "info", "reads", "result", "seconds")
    for column in columns:
        t.add_column(column)
    for result in results:
        row = result.row()
        t.add_row(*(str(row[c]) for c in columns))
    return t


def markdown(results: list[CellResult]) -> str:
    columns = ("backend", "failpoint", "killed", "ok", "fail", "info", "reads", "result", "seconds", "detail")
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for result in results:
        row = result.row()
        lines.append("| " + " | ".join(str(row[c]).replace("|", "/").replace("\n", " ") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onceflow.integration.crash_matrix",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: both")
    parser.add_argument("--short", action="store_true", help="one failpoint per family (what CI runs)")
    parser.add_argument("--failpoint", action="append", help="only these failpoints")
    parser.add_argument("--ops", type=int, help=f"operations per process (default {DEFAULT_OPS})")
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                        help="instead of the matrix: kill random processes at random times for this long")
    parser.add_argument("--out", type=Path, default=Path("crash-matrix.md"))
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each cell's histories, stores and process logs under DIR (default: deleted)")
    args = parser.parse_args(argv)
    backends = args.backend or list(BACKENDS)
    if args.soak:
        cells = [Cell(b, None) for b in backends]
    else:
        cells = [c for c in plan(backends, args.short) if not args.failpoint or c.failpoint in args.failpoint]
    console = Console(stderr=True)
    results = run(cells, args.ops, args.soak, console, args.keep)
    Console().print(table(results))
    args.out.write_text(markdown(results))
    args.out.with_suffix(".json").write_text(json.dumps([r.row() for r in results], indent=1))
    failed = [r for r in results if not r.passed]
    console.print(f"{len(results) - len(failed)} of {len(results)} cells passed; table in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
