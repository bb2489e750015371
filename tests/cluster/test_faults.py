"""Real workload processes (:mod:`onceflow.integration.workload`) against the three-node Apache Kafka cluster
while a node is SIGKILLed and started again, or the whole cluster restarts; the recorded history goes to the
checker: no acknowledged record lost, none duplicated, nothing aborted or uncommitted visible."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.integration.brokers import Broker
from onceflow.integration.history import Op, load
from onceflow.txn.group import stream_names
from tests.cluster.cluster_workload import FINAL_READER, Stalled, Workload
from tests.cluster.test_leader_moves import await_new_leader

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.cluster]

STALLS = pytest.mark.xfail(strict=False, raises=Stalled, reason=(
    "progress after the node is back, not correctness (a Stalled is raised only after the history checked valid): "
    "running processes stalled for minutes (clients kept a dead leader's metadata: FENCED_LEADER_EPOCH on offset "
    "reads) in 4 of 5 runs of the group test until through_leader_changes refreshed metadata before each retry; "
    "one cell of one CI run stalled after that: each attempt of an offset read still waited the whole 30 s at the "
    "dead leader, so no refresh came, and a bare TimeoutError from truncation crashed processes (fixed since: "
    "ATTEMPT_S; in kill/restart cycles the slowest recovery went from 30-38 s in half the cycles to 20 s at most). "
    "Locally no cell stalled in 8 runs, 4 of them before that fix: too few to make a stall a failure yet"))

OUTAGE_S = 12.0  # longer than KRaft's broker.session.timeout.ms (9 s): the controller fences the dead node and
# moves its leaderships, its coordinators and its place in every ISR while the workload runs on


def outage(cluster: Broker, run: Workload, node: int, f: str,
           while_down: Callable[[], None] = lambda: None) -> int:
    """SIGKILL ``node``, keep it down for OUTAGE_S while the workload runs, call ``while_down``, start the node
    again; how many ``f`` operations succeeded meanwhile."""
    before = run.completed(f)
    run.note(f"killing node {node}")
    cluster.kill(node)
    try:
        time.sleep(OUTAGE_S)  # the fault's length, not a wait for a condition
        during = run.completed(f) - before
        while_down()
    finally:  # the next tests need every node
        run.note(f"starting node {node}")
        cluster.start(node)
        run.note(f"node {node} started")
    return during


def stalled(progressed: bool, run: Workload, what: str) -> None:
    """Raise :class:`Stalled` if the workload made no progress after the node came back."""
    if not progressed:
        raise Stalled(f"{what} stalled after the node was back; the processes' errors: {run.crashed}")


def group_caught_up(run: Workload, timeout_s: float = 40) -> bool:
    """Whether the group's members read, within ``timeout_s``, as far as the complete reader did in every
    partition (they commit after each poll, so what the group skipped lies below what it read: the checker sees
    it). The members run on meanwhile; the crashed ones are started again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        furthest: dict[tuple[str, int], int] = {}
        wanted: dict[tuple[str, int], int] = {}
        for op in load(run.history):
            if op.f == "read" and op.type == "ok":
                for stream, partition, offset, _value in op.result["records"]:
                    into = wanted if op.process == FINAL_READER else furthest
                    into[(stream, partition)] = max(into.get((stream, partition), -1), offset)
        if all(furthest.get(p, -1) >= end for p, end in wanted.items()):
            return True
        run.supervise()
        time.sleep(0.2)
    run.dump_stacks("group-behind")
    return False


def by_group_members(op: Op) -> bool:
    """The history without the complete reader: what the group's members read, checked on its own."""
    return op.process != FINAL_READER


@STALLS
@pytest.mark.parametrize("victim", ["follower", "leader"])
def test_racing_cas_writers_lose_and_duplicate_nothing_while_a_node_of_the_raced_partition_dies(
        kafka_cluster: Broker, tmp_path: Path, victim: str) -> None:
    run = Workload(kafka_cluster, tmp_path)
    try:
        for i in range(4):
            run.start("cas", f"cas{i}")
        run.go()
        run.await_completed("cas", 3)
        leader = kafka_cluster.leader(run.topic("cas"), 0)
        node = leader if victim == "leader" else (leader + 1) % len(kafka_cluster.nodes)

        def leadership_moved() -> None:
            """Checked while the node is down: once it is back, the controller's preferred-leader election
            (every leader.imbalance.check.interval.seconds) may hand the partition back to it at any moment."""
            if victim == "leader":
                await_new_leader(kafka_cluster, run.topic("cas"), leader)

        during = outage(kafka_cluster, run, node, "cas", while_down=leadership_moved)
        progressed = run.progresses("cas", 3, timeout_s=40)
        run.finish_writers()
        run.read_everything()
        report = run.check()
    finally:
        run.close()
    print(f"cas ok while node {node} was down: {during}; {report.operations}; crashed: {run.crashed}")
    assert report.valid, report.summary()
    assert report.operations["cas ok"] >= 4 and report.operations.get("cas fail", 0) > 0  # they raced
    stalled(progressed, run, "CAS appending")


@STALLS
def test_transactions_of_several_processes_commit_exactly_once_while_the_commit_logs_leader_dies(
        kafka_cluster: Broker, tmp_path: Path) -> None:
    run = Workload(kafka_cluster, tmp_path)
    try:
        for process in ("bank0", "bank1"):
            run.start("bank", process)  # Producer(transactional.id) transfers, every fifth aborted
        run.start("multi", "multi0")  # one transaction staged by two child processes, committed and merged
        run.start("reader", "reader0")
        run.go()
        run.await_completed("txn", 4)
        log_topic = run.topic(stream_names("multi")[0])
        during = outage(kafka_cluster, run, kafka_cluster.leader(log_topic, 0), "txn")
        progressed = run.progresses("txn", 3, timeout_s=40)
        run.finish_writers()
        run.finish_readers()
        run.read_everything()
        report = run.check()
    finally:
        run.close()
    print(f"transactions ok while the commit log's leader was down: {during}; {report.operations}; "
          f"crashed: {run.crashed}")
    assert report.valid, report.summary()
    assert report.operations["txn ok"] >= 4 and report.operations.get("stage ok", 0) > 0
    stalled(progressed, run, "committing")


@STALLS
def test_a_group_whose_members_join_and_leave_while_its_coordinator_dies_skips_nothing(
        kafka_cluster: Broker, tmp_path: Path) -> None:
    run = Workload(kafka_cluster, tmp_path)
    readers = ("reader0", "reader1", "reader2", "reader3")
    try:
        run.start("appender", "app0")
        run.start("bank", "bank0")
        for reader in readers[:2]:
            run.start("reader", reader)
        run.go()
        run.await_completed("read", 3, processes=readers)
        coordinator = kafka_cluster.group_coordinator(f"{run.namespace}.readers")
        run.note(f"killing node {coordinator}")
        kafka_cluster.kill(coordinator)
        run.start("reader", readers[2])  # joins while the group has no coordinator
        run.leave(readers[0])
        time.sleep(OUTAGE_S)  # the fault's length
        run.note(f"starting node {coordinator}")
        kafka_cluster.start(coordinator)
        run.note(f"node {coordinator} started")
        run.start("reader", readers[3])
        run.leave(readers[1])
        progressed = run.progresses("append", 5, timeout_s=40)
        run.finish_writers()
        run.read_everything()
        caught_up = group_caught_up(run)
        run.finish_readers()
        group_report = run.check(by_group_members)
        report = run.check()
    finally:
        run.close()
    print(f"{report.operations}; crashed: {run.crashed}")
    assert group_report.valid, group_report.summary()
    assert report.valid, report.summary()
    assert report.operations["append ok"] >= 5 and report.operations["txn ok"] > 0
    read_by = {op.process.rsplit(".", 1)[0] for op in load(tmp_path) if op.f == "read" and op.type == "ok"}
    stalled(progressed, run, "appending")
    stalled(caught_up, run, "the group's reading")
    stalled(set(readers[2:]) <= read_by, run, "joining")  # the members that joined during and after the outage


def test_the_whole_cluster_restarted_keeps_everything_acknowledged_and_shows_nothing_uncommitted(
        kafka_cluster: Broker, tmp_path: Path) -> None:
    run = Workload(kafka_cluster, tmp_path)
    try:
        run.start("appender", "app0")
        run.start("bank", "bank0")
        run.start("multi", "multi0")
        for process in ("cas0", "cas1"):
            run.start("cas", process)
        run.start("open-txn", "open0")  # transactions left open across the restart
        run.start("reader", "reader0")
        run.go()
        run.await_completed("txn", 4)
        run.await_completed("stage", 1, processes=["open0"])
        run.kill("open0")  # its transactions stay open: never committed, never aborted by it
        run.finish_writers()
        run.finish_readers()
        kafka_cluster.restart_all()
        run.start("reader", "reader0")  # the group reads on from its committed offsets
        run.start("reader", "reader1")
        run.read_everything()
        caught_up = group_caught_up(run)
        run.finish_readers()
        report = run.check()
    finally:
        run.close()
    print(f"{report.operations}; crashed: {run.crashed}")
    assert report.valid, report.summary()
    ops = report.operations
    assert ops["append ok"] > 0 and ops["cas ok"] > 0 and ops["txn ok"] >= 4 and ops["txn fail"] >= 1
    assert caught_up, "the group did not read on to the end after the restart"
