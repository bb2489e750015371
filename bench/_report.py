"""Shared benchmark plumbing: timing, machine info, a printed table and a JSON results file."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onceflow.connector.store import batch_codec

RESULTS = Path(__file__).parent / "results"


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """Run ``fn`` (which returns how many records it handled); returns (records, seconds)."""
    started = time.perf_counter()
    count = fn()
    return count, time.perf_counter() - started


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version, "platform": platform.platform(),
        "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
    }


def report(name: str, rows: list[dict[str, Any]], params: dict[str, Any]) -> Path:
    """Print rows (name, baseline, records_per_s, ratio) and write them with machine info to results/NAME.json."""
    params = {**params, "batch_codec": "compiled" if batch_codec._compiled is not None else "python"}
    table = Table(title=f"{name} ({', '.join(f'{k}={v}' for k, v in params.items())})")
    for column in ("measure", "records/s", "baseline", "baseline records/s", "ratio"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    for row in rows:
        baseline = row.get("baseline_records_per_s")
        table.add_row(row["measure"], f"{row['records_per_s']:,.0f}", row.get("baseline", "-"),
                      f"{baseline:,.0f}" if baseline else "-", f"{row['ratio']:.2f}" if row.get("ratio") else "-")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "params": params, "machine": machine(), "results": rows},
                               indent=2))
    return path


def row(measure: str, records: int, seconds: float, baseline: str | None = None,
        baseline_result: tuple[int, float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"measure": measure, "records": records, "seconds": seconds,
                           "records_per_s": records / seconds}
    if baseline is not None and baseline_result is not None:
        out["baseline"] = baseline
        out["baseline_records_per_s"] = baseline_result[0] / baseline_result[1]
        out["ratio"] = out["records_per_s"] / out["baseline_records_per_s"]
    return out


Rounds = list[dict[str, tuple[int, float]]]  # per round: each measure's (records, seconds)


def best_round(rounds: Rounds, name: str) -> tuple[int, float]:
    """The (records, seconds) of measure ``name`` in its fastest round."""
    return min((r[name] for r in rounds), key=lambda result: result[1])


def best_of_rounds(rounds: Rounds, specs: list[tuple[str, str, str, str]]) -> list[dict[str, Any]]:
    """Rows of the best round of each measure and of its baseline, for specs (label, measure, baseline label,
    baseline measure), each with the per-round ratio's median and all of them: rounds alternate the two sides,
    so a ratio within one round compares two runs under the same load."""
    rows = []
    for label, measure, baseline_label, baseline in specs:
        ratios = [(r[baseline][1] * r[measure][0]) / (r[measure][1] * r[baseline][0]) for r in rounds]
        rows.append({**row(label, *best_round(rounds, measure), baseline_label, best_round(rounds, baseline)),
                     "median_ratio": statistics.median(ratios), "round_ratios": ratios})
    return rows


def print_medians(rows: list[dict[str, Any]], rounds: int) -> None:
    print(f"best of {rounds} rounds; per-round ratio min/median/max: " + "; ".join(
        f"{r['measure']} {min(r['round_ratios']):.2f}/{r['median_ratio']:.2f}/{max(r['round_ratios']):.2f}"
        for r in rows))
