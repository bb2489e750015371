"""Checks a recorded history (:mod:`onceflow.integration.history`) for the anomalies exactly-once must rule out.

Modelled on Jepsen's queue and transaction analyses of Kafka. What it reports, each with examples:

- ``lost``: an acknowledged write or a committed transaction's write that a reader which read past its
  offset, or read its whole stream, never saw;
- ``duplicate``: one value at two positions of the log;
- ``aborted read``: data of an aborted or never-committed transaction, or of a write that definitely failed;
- ``non-atomic read``: a complete reader saw part of a transaction;
- ``divergence``: two readers saw different values at one offset of a partition, or transactions in different
  orders in two partitions (a cycle in the commit order);
- ``cas``: two winners for one expectation, a win that landed elsewhere, a refused CAS write that landed;
- ``fenced write``: a write by a fenced writer instance, started after the fence, that landed;
- ``non-monotonic``: a reader saw offsets of a partition go backwards or repeat;
- ``bank``: a complete reader whose transfers do not sum to zero (a torn transfer).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator

from onceflow.integration.history import Op

EXAMPLES = 5
KINDS = ("lost", "duplicate", "aborted read", "non-atomic read", "divergence", "cas", "fenced write",
         "non-monotonic", "bank")

Position = tuple[str, int, int]  # stream, partition, offset


@dataclasses.dataclass
class Report:
    """The checker's verdict: operation counts and, per anomaly kind, how many and a few examples."""

    operations: dict[str, int]
    anomalies: dict[str, list[str]]

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values())

    def count(self, kind: str) -> int:
        return len(self.anomalies.get(kind, []))

    def summary(self) -> str:
        if self.valid:
            return "valid: " + ", ".join(f"{k} {n}" for k, n in sorted(self.operations.items()))
        lines = []
        for kind, found in self.anomalies.items():
            if found:
                lines.append(f"{kind}: {len(found)}, e.g. " + "; ".join(found[:EXAMPLES]))
        return "\n".join(lines)


@dataclasses.dataclass
class _Transaction:
    name: str
    status: str  # committed | aborted | unknown
    writes: dict[str, str] = dataclasses.field(default_factory=dict)  # value -> stream
    deltas: dict[str, int] = dataclasses.field(default_factory=dict)


class _Reads:
    """Everything the readers saw, indexed for the analyses."""

    def __init__(self, ops: list[Op]) -> None:
        self.positions: dict[str, set[Position]] = defaultdict(set)  # value -> where it was read
        self.at: dict[Position, set[str]] = defaultdict(set)  # position -> values read there
        self.by_reader: dict[str, list[Position]] = defaultdict(list)  # in the order read
        self.values_of: dict[str, set[str]] = defaultdict(set)  # reader -> values
        self.complete: dict[str, set[str]] = defaultdict(set)  # stream -> readers that read all of it
        self.furthest: dict[tuple[str, int], int] = {}  # partition -> highest offset any reader saw
        for op in ops:
            if op.f != "read" or op.type != "ok":
                continue
            reader = op.args["reader"]
            for stream, partition, offset, value in op.result.get("records", []):
                position = (stream, partition, offset)
                self.positions[value].add(position)
                self.at[position].add(value)
                self.by_reader[reader].append(position)
                self.values_of[reader].add(value)
                key = (stream, partition)
                self.furthest[key] = max(self.furthest.get(key, -1), offset)
            for stream in op.result.get("complete", []):
                self.complete[stream].add(reader)

    def seen(self, value: str) -> bool:
        return value in self.positions

    def complete_readers(self, streams: Iterable[str]) -> set[str]:
        readers: set[str] | None = None
        for stream in streams:
            readers = set(self.complete[stream]) if readers is None else readers & self.complete[stream]
        return readers or set()


def check(ops: Iterable[Op]) -> Report:
    """Analyse a history; the report lists every anomaly found."""
    ops = list(ops)
    reads = _Reads(ops)
    transactions = _transactions(ops)
    anomalies: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for kind, example in _anomalies(ops, reads, transactions):
        anomalies[kind].append(example)
    operations: dict[str, int] = defaultdict(int)
    for op in ops:
        operations[f"{op.f} {op.type}"] += 1
    return Report(dict(operations), anomalies)


def _anomalies(ops: list[Op], reads: _Reads, transactions: dict[str, _Transaction]) -> Iterator[tuple[str, str]]:
    yield from _log_shape(reads)
    yield from _writes(ops, reads)
    yield from _cas(ops, reads)
    yield from _fencing(ops, reads)
    yield from _transaction_visibility(transactions, reads)
    yield from _commit_order(transactions, reads)
    yield from _bank(transactions, reads)


def _log_shape(reads: _Reads) -> Iterator[tuple[str, str]]:
    """Duplicates, readers that disagree on an offset, and readers going backwards."""
    for value, positions in reads.positions.items():
        if len(positions) > 1:
            yield "duplicate", f"{value!r} at {sorted(positions)}"
    for position, values in reads.at.items():
        if len(values) > 1:
            yield "divergence", f"{position} read as {sorted(values)}"
    for reader, read_in_order in reads.by_reader.items():
        last: dict[tuple[str, int], int] = {}
        for stream, partition, offset in read_in_order:
            before = last.get((stream, partition))
            if before is not None and offset <= before:
                yield "non-monotonic", f"reader {reader} read {stream}[{partition}] offset {offset} after {before}"
            last[(stream, partition)] = offset


def _writes(ops: list[Op], reads: _Reads) -> Iterator[tuple[str, str]]:
    """Acknowledged plain appends are where their ack says; definitely failed ones are nowhere."""
    for op in ops:
        if op.f not in ("append", "cas"):
            continue
        value, stream = op.args["value"], op.args["stream"]
        if op.type == "fail" and reads.seen(value):
            kind = "cas" if op.f == "cas" else "fenced write" if op.result.get("error") == "PRODUCER_FENCED" \
                else "aborted read"
            yield kind, f"{op.f} of {value!r} failed ({op.result.get('error')}) but was read at " \
                        f"{sorted(reads.positions[value])}"
        if op.type != "ok":
            continue
        acked: Position = (stream, op.result.get("partition", op.args.get("partition", 0)), op.result["offset"])
        if reads.seen(value):
            if reads.positions[value] != {acked}:
                yield "lost", f"{value!r} acknowledged at {acked} but read at {sorted(reads.positions[value])}"
        elif reads.furthest.get((stream, acked[1]), -1) > acked[2] or reads.complete[stream]:
            yield "lost", f"{value!r} acknowledged at {acked}, never read (readers went past it)"


def _cas(ops: list[Op], reads: _Reads) -> Iterator[tuple[str, str]]:
    winners: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for op in ops:
        if op.f == "cas" and op.type == "ok":
            key = (op.args["stream"], op.args["partition"], op.args["expected"])
            winners[key].append(op.args["value"])
            if op.result["offset"] != op.args["expected"]:
                yield "cas", f"{op.args['value']!r} expected offset {key[2]} but landed at {op.result['offset']}"
    for key, values in winners.items():
        if len(values) > 1:
            yield "cas", f"{len(values)} winners for expected offset {key[2]} of {key[0]}[{key[1]}]: {values}"


def _fencing(ops: list[Op], reads: _Reads) -> Iterator[tuple[str, str]]:
    """A write by an instance of a writer id, started after a newer instance fenced it, must not land. An
    instance is newer if its fence began after the other's fence ended (overlapping fences have no order)."""
    fences: dict[tuple[str, int], tuple[float, float]] = {}  # (writer, instance) -> fence start, end
    for op in ops:
        if op.f == "fence" and op.type == "ok" and op.end is not None:
            fences[(op.args["writer"], op.args["incarnation"])] = (op.start, op.end)
    for op in ops:
        if op.f != "append" or op.type == "fail" or "writer" not in op.args or not reads.seen(op.args["value"]):
            continue  # a failed write that landed is reported with the writes
        writer, instance = op.args["writer"], op.args["incarnation"]
        own = fences.get((writer, instance))
        for (other_writer, other), (start, end) in fences.items():
            if other_writer == writer and other != instance and own and start > own[1] and end < op.start:
                yield "fenced write", (f"{op.args['value']!r} by {writer} instance {instance}, written after "
                                       f"instance {other} fenced it, was read")
                break


def _transactions(ops: list[Op]) -> dict[str, _Transaction]:
    """Each transaction's writes (its own and its participants' staged ones) and what is known of its outcome."""
    staged: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for op in ops:
        if op.f == "stage":
            staged[(op.args["txn"], op.args["writer"])].update({v: s for s, v, *_ in op.args["writes"]})
    transactions: dict[str, _Transaction] = {}
    included: set[tuple[str, str]] = set()
    for op in ops:
        if op.f != "txn":
            continue
        status = {"fail": "aborted", "info": "unknown"}.get(op.type) or op.result.get("outcome", "committed")
        t = transactions[op.args["txn"]] = _Transaction(op.args["txn"], status)
        for stream, value, *delta in op.args.get("writes", []):
            t.writes[value] = stream
            if delta:
                t.deltas[value] = delta[0]
        for txn, writer in op.args.get("participants", []):
            t.writes.update(staged.get((txn, writer), {}))
            included.add((txn, writer))
    for key, writes in staged.items():
        if key not in included:  # staged, never named by a commit
            transactions[f"{key[0]}/{key[1]} (never committed)"] = _Transaction(key[0], "aborted", dict(writes))
    return transactions


def _transaction_visibility(transactions: dict[str, _Transaction], reads: _Reads) -> Iterator[tuple[str, str]]:
    for name, t in transactions.items():
        seen = {v for v in t.writes if reads.seen(v)}
        if t.status == "aborted":
            if seen:
                yield "aborted read", f"transaction {name} aborted, yet {sorted(seen)[:3]} were read"
            continue
        for reader in sorted(reads.complete_readers(set(t.writes.values()))):
            missing = sorted(v for v in t.writes if v not in reads.values_of[reader])
            if missing and len(missing) < len(t.writes):
                yield "non-atomic read", f"reader {reader} saw {len(t.writes) - len(missing)} of " \
                                         f"{len(t.writes)} writes of transaction {name}, missing {missing[:3]}"
            elif missing and t.status == "committed":
                yield "lost", f"committed transaction {name} never read by complete reader {reader}"


def _commit_order(transactions: dict[str, _Transaction], reads: _Reads) -> Iterator[tuple[str, str]]:
    """Transactions must appear in one order in every partition: the order edges must have no cycle."""
    txn_of = {value: name for name, t in transactions.items() for value in t.writes}
    sequences: dict[tuple[str, int], list[str]] = defaultdict(list)
    for (stream, partition, _offset), values in sorted(reads.at.items()):
        for value in values:
            name = txn_of.get(value)
            if name and (not sequences[(stream, partition)] or sequences[(stream, partition)][-1] != name):
                sequences[(stream, partition)].append(name)
    edges: dict[str, set[str]] = defaultdict(set)
    for sequence in sequences.values():
        for before, after in itertools.pairwise(sequence):
            if before != after:
                edges[before].add(after)
    cycle = _find_cycle(edges)
    if cycle:
        yield "divergence", "transactions in different orders in different partitions: " + " -> ".join(cycle)


def _find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """A cycle of the graph, or [] (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in list(edges):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(edges[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return []


def _bank(transactions: dict[str, _Transaction], reads: _Reads) -> Iterator[tuple[str, str]]:
    deltas = {value: delta for t in transactions.values() for value, delta in t.deltas.items()}
    streams = {t.writes[value] for t in transactions.values() for value in t.deltas}
    if not deltas:
        return
    for reader in sorted(reads.complete_readers(streams)):
        total = sum(deltas.get(value, 0) for value in reads.values_of[reader])
        if total != 0:
            yield "bank", f"reader {reader} sees transfers summing to {total}, not 0"
