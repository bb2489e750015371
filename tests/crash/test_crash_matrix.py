"""The crash matrix's plan covers every failpoint, and a cell runs end to end: the workload's processes race,
one is SIGKILLed at its failpoint and restarted, and the checker finds the history valid. CI runs the short
matrix on both backends (``python -m onceflow.integration.crash_matrix --short``); this runs one cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.connector.failpoints import FAILPOINTS
from onceflow.integration.crash_matrix import BACKENDS, OFF_THE_WORKLOAD, Cell, plan, run_cell

pytestmark = pytest.mark.crash


def test_every_failpoint_has_a_cell_on_some_backend_and_the_short_plan_one_per_family() -> None:
    full = plan(list(BACKENDS), short=False)
    assert {c.failpoint for c in full} == set(FAILPOINTS) - set(OFF_THE_WORKLOAD)
    short = plan(list(BACKENDS), short=True)
    assert {c.failpoint for c in short} < set(FAILPOINTS)
    assert {c.backend for c in short} == set(BACKENDS)


def test_a_cell_kills_a_process_at_its_failpoint_restarts_it_and_the_history_is_valid(tmp_path: Path) -> None:
    cell = Cell("sqlite", "txn.commit.after_commit_record")
    result = run_cell(cell, f"sqlite://{tmp_path / 'cell.db'}", tmp_path, ops=15)
    assert result.error == ""
    assert len(result.killed) == 1
    assert result.report is not None and result.report.valid, result.report.summary()
    ops = result.report.operations
    assert ops.get("txn ok", 0) > 0 and ops.get("append ok", 0) > 0
    assert ops.get("cas fail", 0) + ops.get("cas ok", 0) == 2 * 15  # none killed: each racer finished
    assert ops.get("read ok", 0) > 0
