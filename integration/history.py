"""A history of client operations, recorded by any number of processes, for :mod:`onceflow.integration.checker`.

The model is Jepsen's: an operation is an *invoke* event followed by at most one completion — ``ok``,
``fail`` (it definitely had no effect) or ``info`` (unknown: it may or may not have taken effect). A process
killed mid-operation leaves only the invoke, which the checker reads as ``info``. Each process appends JSON
lines to a file of its own, one ``write`` per event on an ``O_APPEND`` descriptor, so a SIGKILL can cut off
at most the event being written (a torn last line is dropped when the history is loaded).

Operations (``f``) and what they carry; values must be unique across a history (they identify writes):

- ``append`` — invoke ``stream``, ``value`` (and ``writer``, ``incarnation`` for a fenced writer);
  ok ``partition``, ``offset``.
- ``cas`` — invoke ``stream``, ``partition``, ``expected``, ``value``; ok ``offset``.
- ``fence`` — invoke ``writer``, ``incarnation``: a new instance of a writer id fenced the older ones.
- ``txn`` — invoke ``txn`` (a name), ``writes`` (``[stream, value]`` or ``[stream, value, delta]`` for a bank
  transfer), ``participants`` (``[txn, writer]`` pairs whose ``stage`` writes it commits); ok ``outcome``
  (``committed`` or ``aborted``); fail: aborted.
- ``stage`` — invoke ``txn``, ``writer``, ``writes``: staged, not visible until a ``txn`` commits it.
- ``read`` — ok ``records`` (``[stream, partition, offset, value]``) seen by ``reader``; ``complete`` names the
  streams this reader has now read entirely, from their start to their end after every writer finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException

# Errors after which onceflow guarantees the operation changed nothing; any other error leaves it unknown.
DEFINITE_FAILURES = frozenset({
    ErrorCode.CAS_MISMATCH, ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_TXN_STATE, ErrorCode.TRANSACTION_TIMED_OUT,
    ErrorCode.PARTITION_SEALED, ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_RECORD, ErrorCode.MSG_SIZE_TOO_LARGE,
    ErrorCode.UNKNOWN_TOPIC_OR_PART, ErrorCode.SINK_ID_IN_USE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
})


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a history: its invoke and its completion (``info`` with no end if there was none)."""

    process: str
    id: int
    f: str
    type: str  # ok | fail | info
    start: float
    end: float | None
    args: dict[str, Any]
    result: dict[str, Any]


def _dump(line: dict[str, Any]) -> bytes:
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()


class Recorder:
    """Records the operations of one process into ``<directory>/<process>.jsonl``."""

    def __init__(self, directory: str | Path, process: str) -> None:
        self.process = process
        self._fd = os.open(Path(directory) / f"{process}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._next_id = 0

    def invoke(self, f: str, **args: Any) -> int:
        """Record that an operation starts; returns its id for the completion."""
        self._next_id += 1
        self._write({"id": self._next_id, "type": "invoke", "f": f, **args})
        return self._next_id

    def ok(self, op: int, **result: Any) -> None:
        self._write({"id": op, "type": "ok", **result})

    def fail(self, op: int, error: str, **result: Any) -> None:
        """The operation definitely had no effect."""
        self._write({"id": op, "type": "fail", "error": error, **result})

    def info(self, op: int, error: str) -> None:
        """The operation may or may not have taken effect."""
        self._write({"id": op, "type": "info", "error": error})

    def failed(self, op: int, exc: BaseException | KafkaError) -> None:
        """Complete an operation that failed: ``fail`` if onceflow guarantees it changed nothing, else ``info``."""
        error = exc if isinstance(exc, KafkaError) else exc.error if isinstance(exc, KafkaException) else None
        if error is not None and error.code() in DEFINITE_FAILURES:
            self.fail(op, error.name())
        else:
            self.info(op, repr(exc))

    @contextlib.contextmanager
    def operation(self, f: str, **args: Any) -> Iterator[dict[str, Any]]:
        """Record the operation the block performs; the block puts its ok result into the yielded dict."""
        op = self.invoke(f, **args)
        result: dict[str, Any] = {}
        try:
            yield result
        except BaseException as exc:
            self.failed(op, exc)
            raise
        self.ok(op, **result)

    def read(self, reader: str, records: Sequence[Sequence[Any]], complete: Iterable[str] = ()) -> None:
        """Record what a reader saw in one poll (``[stream, partition, offset, value]`` each)."""
        op = self.invoke("read", reader=reader)
        self.ok(op, records=[list(r) for r in records], complete=list(complete))

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, event: dict[str, Any]) -> None:
        os.write(self._fd, _dump({"process": self.process, "time": time.time(), **event}))


def load(directory: str | Path) -> list[Op]:
    """Every operation recorded in ``directory``, in invoke order."""
    ops: list[Op] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        ops.extend(_ops_of(path.read_text().splitlines()))
    return sorted(ops, key=lambda op: op.start)


def _ops_of(lines: list[str]) -> Iterator[Op]:
    invoked: dict[tuple[str, int], dict[str, Any]] = {}
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a SIGKILL cut off
        key = (event["process"], event["id"])
        (invoked if event["type"] == "invoke" else done)[key] = event
    for key, start in invoked.items():
        end = done.get(key)
        args = {k: v for k, v in start.items() if k not in ("process", "id", "type", "f", "time")}
        result = {k: v for k, v in (end or {}).items() if k not in ("process", "id", "type", "time")}
        yield Op(key[0], key[1], start["f"], end["type"] if end else "info", start["time"],
                 end["time"] if end else None, args, result)
