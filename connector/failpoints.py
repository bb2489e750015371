"""Named crash points, armed only through the ``ONCEFLOW_FAILPOINTS`` environment variable.

Code marks each step where a crash matters with ``failpoint("sqlite.append.before_commit")``. Unarmed (the
normal case) that is one truthiness test of an empty dict. Tests arm points in a child process::

    ONCEFLOW_FAILPOINTS="sqlite.append.before_commit=crash@3,producer.before_delivery=raise"

Actions: ``crash`` (SIGKILL this process: no cleanup, no flush, as a power cut for the process),
``crash-session`` (SIGKILL the process group of this session's leader, then this process: a Spark driver that
leads its session and called :func:`allow_session_crash` dies with its JVM, though the failpoint fires in one
of its Python workers; without that call only this process dies),
``raise`` (a retriable store error, as a transient I/O failure), ``sleep:MS``, ``pause`` (the thread that hit it
waits, its process's other threads go on, until the file ``ONCEFLOW_FAILPOINT_RELEASE`` names exists; it makes
that file's ``.paused`` twin first, so a test knows it is there: a stall of as long as the test needs).
``@N`` fires on the N-th hit only (1-based); without it every hit fires. ``*N`` fires on the first N hits. Hits
are counted per process, or across all processes when ``ONCEFLOW_FAILPOINT_HITS_DIR`` names a directory.

Every failpoint name in the code is listed in :data:`FAILPOINTS`, so the crash tests can iterate over them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time

from onceflow.connector.errors import ErrorCode, fail

ENV_VAR = "ONCEFLOW_FAILPOINTS"
HITS_DIR_VAR = "ONCEFLOW_FAILPOINT_HITS_DIR"  # count hits across processes, in files of this directory
SESSION_VAR = "ONCEFLOW_CRASH_SESSION"  # the pid of a session leader that crash-session may kill, group and all
RELEASE_VAR = "ONCEFLOW_FAILPOINT_RELEASE"  # the file whose existence ends a pause

FAILPOINTS: dict[str, str] = {
    "sqlite.append.after_checks": "an append validated (CAS, fencing, sequence) but nothing written yet",
    "sqlite.append.after_batch_insert": "the batch row is written, the partition's end offset not yet moved",
    "sqlite.append.before_commit": "every row of the append is written, the database transaction not committed",
    "sqlite.append.after_commit": "the append is durable, the caller not yet told",
    "sqlite.scale.after_seal": "the old epoch is sealed, the new epoch not yet created",
    "sqlite.writer.after_epoch_bump": "a writer.id got its new epoch, not yet committed",
    "sqlite.group.after_commit_offsets": "group offsets written, not yet committed",
    "kafka.scale.before_seal": "a Kafka scale wrote its new epoch, the old one not yet sealed",
    "kafka.cas.after_check": "a Kafka CAS owner found the partition's end as expected, nothing written yet",
    "kafka.txn.before_send": "a Kafka transaction chose its partitions from the catalog, nothing sent yet",
    "kafka.txn.before_commit": "a Kafka transaction's records landed, its commit not yet asked for",
    "producer.before_delivery": "a batch is appended, its delivery reports not yet queued",
    "producer.init.after_fence": "a new transactional producer fenced older ones, their open transaction not aborted",
    "txn.log.after_flush": "a commit-log entry is stored, its callers not yet told their positions",
    "txn.commit.after_claim": "a transaction claimed its offsets' partitions and its member is in its group, no "
                              "COMMIT yet",
    "txn.commit.after_commit_record": "a COMMIT is in the commit log, nothing merged yet",
    "txn.merge.before_append": "a merge pass collected its transactions, nothing appended yet",
    "txn.merge.after_append": "a merge pass appended its data and progress, its caller not yet told",
    "txn.commit.after_merge": "a transaction is merged, commit() has not returned",
    "txn.commit.after_one_step": "a transaction was begun, committed and merged in one step, commit() has not returned",
    "sink.task.after_stage": "a sink task staged its part of a batch, the driver not yet told",
    "sink.batch.before_commit": "every task of a batch staged its part, the driver has not committed the batch",
    "sink.batch.after_commit": "a batch is committed and merged, the caller (Spark) not yet told",
}


@dataclasses.dataclass
class _Arming:
    action: str
    argument: int = 0
    only_hit: int | None = None  # fire on exactly this hit
    first_hits: int | None = None  # fire on the first N hits
    hits: int = 0


def _parse(spec: str) -> dict[str, _Arming]:
    armed: dict[str, _Arming] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        if not sep or name not in FAILPOINTS:
            fail(ErrorCode.INVALID_CONFIG, f"{ENV_VAR}: unknown failpoint in {item!r}; known: {sorted(FAILPOINTS)}")
        arming = _Arming(action="")
        if "@" in action:
            action, _, nth = action.partition("@")
            arming.only_hit = int(nth)
        elif "*" in action:
            action, _, count = action.partition("*")
            arming.first_hits = int(count)
        action, _, argument = action.partition(":")
        if action not in ("crash", "crash-session", "raise", "sleep", "pause"):
            fail(ErrorCode.INVALID_CONFIG, f"{ENV_VAR}: unknown action {action!r} in {item!r}")
        arming.action, arming.argument = action, int(argument or 0)
        armed[name] = arming
    return armed


_ARMED: dict[str, _Arming] = _parse(os.environ.get(ENV_VAR, ""))
_LOCK = threading.Lock()


def _next_hit(name: str, arming: _Arming) -> int:
    """This hit's number: counted in this process, or across processes when ``HITS_DIR_VAR`` names a directory
    (a Spark task retried in a fresh Python worker must not count its first hit again)."""
    shared = os.environ.get(HITS_DIR_VAR)
    if not shared:
        with _LOCK:
            arming.hits += 1
            return arming.hits
    hit = 1
    while True:
        try:
            os.close(os.open(os.path.join(shared, f"{name}.{hit}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return hit
        except FileExistsError:
            hit += 1


def allow_session_crash() -> None:
    """Let ``crash-session`` take this process's whole process group down, if it leads its session (its
    children inherit the permission through the environment)."""
    if os.getsid(0) == os.getpid():
        os.environ[SESSION_VAR] = str(os.getpid())


def failpoint(name: str) -> None:
    """Mark a crash point; does nothing unless ``name`` is armed in the environment."""
    if _ARMED:
        _trigger(name)


def _trigger(name: str) -> None:
    arming = _ARMED.get(name)
    if arming is None:
        return
    hit = _next_hit(name, arming)
    if arming.only_hit is not None and hit != arming.only_hit:
        return
    if arming.first_hits is not None and hit > arming.first_hits:
        return
    leader = int(os.environ.get(SESSION_VAR, "0"))
    if arming.action == "crash-session" and leader and os.getsid(0) == leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    if arming.action in ("crash", "crash-session"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif arming.action == "sleep":
        time.sleep(arming.argument / 1000)
    elif arming.action == "pause":
        _pause(name)
    else:
        fail(ErrorCode._FS, f"failpoint {name} raised (hit {hit})", retriable=True)


def _pause(name: str) -> None:
    release = os.environ.get(RELEASE_VAR)
    if not release:
        fail(ErrorCode.INVALID_CONFIG, f"failpoint {name}: pause needs {RELEASE_VAR}, the file that ends it")
    open(release + ".paused", "w").close()
    while not os.path.exists(release):
        time.sleep(0.01)
