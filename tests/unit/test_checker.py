"""The history checker catches each anomaly in a hand-made history, and passes a clean one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.integration.checker import KINDS, check
from onceflow.integration.history import Recorder, load


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    return Recorder(tmp_path, "p1")


def verdict(tmp_path: Path) -> dict[str, int]:
    report = check(load(tmp_path))
    return {kind: report.count(kind) for kind in KINDS if report.count(kind)}


def append(rec: Recorder, value: str, offset: int, stream: str = "s", partition: int = 0, **args: object) -> None:
    op = rec.invoke("append", stream=stream, value=value, **args)
    rec.ok(op, partition=partition, offset=offset)


def committed(rec: Recorder, name: str, writes: list[list[object]], **args: object) -> None:
    op = rec.invoke("txn", txn=name, writes=writes, **args)
    rec.ok(op, outcome="committed")


def test_a_clean_history_is_valid(rec: Recorder, tmp_path: Path) -> None:
    append(rec, "a", 0)
    append(rec, "b", 1)
    committed(rec, "t1", [["x", "t1.x", -5], ["y", "t1.y", 5]])
    cas = rec.invoke("cas", stream="s", partition=0, expected=2, value="c")
    rec.ok(cas, offset=2)
    loser = rec.invoke("cas", stream="s", partition=0, expected=2, value="d")
    rec.fail(loser, "CAS_MISMATCH")
    rec.read("r1", [["s", 0, 0, "a"], ["s", 0, 1, "b"], ["s", 0, 2, "c"], ["x", 0, 0, "t1.x"], ["y", 0, 0, "t1.y"]],
             complete=["s", "x", "y"])
    report = check(load(tmp_path))
    assert report.valid, report.summary()
    assert report.operations["cas fail"] == 1 and report.operations["txn ok"] == 1


def test_lost_acknowledged_write_read_past(rec: Recorder, tmp_path: Path) -> None:
    append(rec, "a", 0)
    append(rec, "b", 1)
    rec.read("r1", [["s", 0, 1, "b"]])
    assert verdict(tmp_path) == {"lost": 1}


def test_lost_committed_transaction(rec: Recorder, tmp_path: Path) -> None:
    committed(rec, "t1", [["x", "v1"], ["y", "v2"]])
    rec.read("r1", [], complete=["x", "y"])
    assert verdict(tmp_path) == {"lost": 1}


def test_an_unacknowledged_write_may_be_missing_or_present(rec: Recorder, tmp_path: Path) -> None:
    rec.invoke("append", stream="s", value="maybe")  # the process died: no completion
    rec.invoke("append", stream="s", value="maybe-not")
    rec.read("r1", [["s", 0, 0, "maybe"]], complete=["s"])
    assert verdict(tmp_path) == {}


def test_duplicate(rec: Recorder, tmp_path: Path) -> None:
    append(rec, "a", 0)
    rec.read("r1", [["s", 0, 0, "a"], ["s", 0, 1, "a"]])
    assert verdict(tmp_path) == {"duplicate": 1, "lost": 1}  # also not (only) where its ack said


def test_aborted_read(rec: Recorder, tmp_path: Path) -> None:
    op = rec.invoke("txn", txn="t1", writes=[["x", "v1"]])
    rec.ok(op, outcome="aborted")
    timed_out = rec.invoke("txn", txn="t2", writes=[["x", "v2"]])
    rec.fail(timed_out, "TRANSACTION_TIMED_OUT")
    rec.read("r1", [["x", 0, 0, "v1"], ["x", 0, 1, "v2"]])
    assert verdict(tmp_path) == {"aborted read": 2}


def test_staged_writes_of_a_writer_the_commit_did_not_name_are_never_read(rec: Recorder, tmp_path: Path) -> None:
    rec.ok(rec.invoke("stage", txn="t1", writer="w1", writes=[["x", "w1.0"]]))
    rec.invoke("stage", txn="t1", writer="w2", writes=[["x", "w2.0"]])  # killed part-way
    committed(rec, "t1", [], participants=[["t1", "w1"]])
    rec.read("r1", [["x", 0, 0, "w1.0"], ["x", 0, 1, "w2.0"]], complete=["x"])
    assert verdict(tmp_path) == {"aborted read": 1}


def test_non_atomic_read(rec: Recorder, tmp_path: Path) -> None:
    rec.invoke("txn", txn="t1", writes=[["x", "v1"], ["y", "v2"]])  # outcome unknown: all or nothing
    rec.read("r1", [["x", 0, 0, "v1"]], complete=["x", "y"])
    assert verdict(tmp_path) == {"non-atomic read": 1}


def test_readers_disagree_on_an_offset(rec: Recorder, tmp_path: Path) -> None:
    rec.read("r1", [["s", 0, 0, "a"]])
    rec.read("r2", [["s", 0, 0, "b"]])
    assert verdict(tmp_path) == {"divergence": 1}


def test_transactions_in_different_orders_in_two_partitions(rec: Recorder, tmp_path: Path) -> None:
    committed(rec, "t1", [["x", "t1.a"], ["y", "t1.b"]])
    committed(rec, "t2", [["x", "t2.a"], ["y", "t2.b"]])
    rec.read("r1", [["x", 0, 0, "t1.a"], ["x", 0, 1, "t2.a"], ["y", 0, 0, "t2.b"], ["y", 0, 1, "t1.b"]])
    assert verdict(tmp_path) == {"divergence": 1}


def test_two_cas_winners_and_a_refused_write_that_landed(rec: Recorder, tmp_path: Path) -> None:
    for value in ("a", "b"):
        rec.ok(rec.invoke("cas", stream="s", partition=0, expected=0, value=value), offset=0)
    refused = rec.invoke("cas", stream="s", partition=0, expected=0, value="c")
    rec.fail(refused, "CAS_MISMATCH")
    rec.read("r1", [["s", 0, 0, "a"], ["s", 0, 1, "c"]])
    found = verdict(tmp_path)
    assert found["cas"] == 2  # two winners; the refused one landed
    assert found["lost"] == 1  # b was acknowledged at offset 0, where a is


def test_a_cas_win_that_landed_elsewhere(rec: Recorder, tmp_path: Path) -> None:
    rec.ok(rec.invoke("cas", stream="s", partition=0, expected=3, value="a"), offset=4)
    assert verdict(tmp_path) == {"cas": 1}


def test_fenced_write_landed(rec: Recorder, tmp_path: Path) -> None:
    zombie = Recorder(tmp_path, "zombie")
    zombie.ok(zombie.invoke("fence", writer="w", incarnation=1))
    rec.ok(rec.invoke("fence", writer="w", incarnation=2))
    late = zombie.invoke("append", stream="s", value="z1", writer="w", incarnation=1)
    zombie.info(late, "timed out")
    refused = zombie.invoke("append", stream="s", value="z2", writer="w", incarnation=1)
    zombie.failed(refused, KafkaException(KafkaError(ErrorCode.PRODUCER_FENCED, "fenced")))
    rec.read("r1", [["s", 0, 0, "z1"], ["s", 0, 1, "z2"]])
    assert verdict(tmp_path) == {"fenced write": 2}


def test_instances_are_ordered_by_their_fences_not_their_numbers(rec: Recorder, tmp_path: Path) -> None:
    late_starter = Recorder(tmp_path, "first")
    rec.ok(rec.invoke("fence", writer="w", incarnation=2))
    late_starter.ok(late_starter.invoke("fence", writer="w", incarnation=1))  # instance 1 fenced instance 2
    append(late_starter, "v", 0, writer="w", incarnation=1)
    rec.read("r1", [["s", 0, 0, "v"]])
    assert verdict(tmp_path) == {}


def test_non_monotonic_reader(rec: Recorder, tmp_path: Path) -> None:
    rec.read("r1", [["s", 0, 0, "a"], ["s", 0, 1, "b"]])
    rec.read("r1", [["s", 0, 1, "b"]])
    assert verdict(tmp_path) == {"non-monotonic": 1}


def test_torn_bank_transfer(rec: Recorder, tmp_path: Path) -> None:
    committed(rec, "t1", [["a", "t1.a", -7], ["b", "t1.b", 7]])
    op = rec.invoke("txn", txn="t2", writes=[["a", "t2.a", -3], ["b", "t2.b", 3]])
    rec.info(op, "killed")
    rec.read("r1", [["a", 0, 0, "t1.a"], ["b", 0, 0, "t1.b"], ["a", 0, 1, "t2.a"]], complete=["a", "b"])
    assert verdict(tmp_path) == {"bank": 1, "non-atomic read": 1}


def test_a_line_torn_by_a_kill_is_dropped(rec: Recorder, tmp_path: Path) -> None:
    append(rec, "a", 0)
    with open(tmp_path / "p1.jsonl", "a") as f:
        f.write('{"process": "p1", "id": 9, "ty')
    ops = load(tmp_path)
    assert [(op.f, op.type) for op in ops] == [("append", "ok")]
    assert os.path.getsize(tmp_path / "p1.jsonl") > 0


def test_operation_context_records_definite_and_unknown_failures(rec: Recorder, tmp_path: Path) -> None:
    with pytest.raises(KafkaException), rec.operation("append", stream="s", value="a"):
        raise KafkaException(KafkaError(ErrorCode.CAS_MISMATCH, "no"))
    with pytest.raises(KafkaException), rec.operation("append", stream="s", value="b"):
        raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, "maybe"))
    with rec.operation("append", stream="s", value="c") as result:
        result.update(partition=0, offset=0)
    assert [op.type for op in load(tmp_path)] == ["fail", "info", "ok"]
