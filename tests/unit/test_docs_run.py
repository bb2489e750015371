"""Every ```python block of the user docs runs as written, each in a scratch directory with a scratch store.

A block runs on its own, in a fresh interpreter whose working directory is empty (so ``sqlite://orders.db`` is a
new store there). Two markers, on the line before a block's fence, change that, and each says why:
``<!-- continues the block above -->`` runs the block after the one before it, in the same interpreter (a
fragment), and ``<!-- not run: REASON -->`` (e.g. ``needs a Kafka cluster``) skips it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/clients.md", "docs/transactions.md", "docs/embedded-store.md", "docs/kafka-backend.md",
        "docs/connect.md", "docs/schemas.md", "docs/spark.md"]
SPARK_DOCS = {"docs/spark.md"}  # their blocks start Spark (~10 s each): selected with -m spark, as tests/spark
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")
_CONTINUES = "<!-- continues the block above -->"
_PROSE_BEFORE_OUTPUT = 3  # lines of text that may stand between a block and the ```text block of its output


@dataclasses.dataclass
class Block:
    """A runnable piece of a doc: its code (fragments joined), where it starts, and why it is skipped, if it is."""

    doc: str
    line: int
    code: str
    skip: str | None = None


def _marker(lines: list[str], fence: int) -> str:
    """The non-blank line just before the fence at index ``fence``, or ''."""
    for line in reversed(lines[:fence]):
        if line.strip():
            return line.strip()
    return ""


def blocks(doc: str) -> list[Block]:
    """The doc's python blocks, fragments joined to the block they continue."""
    lines = (ROOT / doc).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(lines[i + 1:end]) + "\n"
        marker = _marker(lines, i)
        not_run = _NOT_RUN.match(marker)
        if marker == _CONTINUES:
            if not found:
                raise AssertionError(f"{doc}:{i + 1}: continues a block, but none comes before it")
            found[-1].code += code
        else:
            found.append(Block(doc, i + 1, code, not_run.group("reason") if not_run else None))
        i = end + 1
    return found


ALL = [block for doc in DOCS for block in blocks(doc)]


def _param(block: Block) -> object:
    marks = [pytest.mark.spark] if block.doc in SPARK_DOCS else []
    return pytest.param(block, marks=marks, id=f"{block.doc}:{block.line}")


@pytest.mark.slow
@pytest.mark.parametrize("block", [_param(b) for b in ALL])
def test_the_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    # PYSPARK_PYTHON: Spark's Python workers must run this interpreter, the one that has onceflow (docs/spark.md).
    env = {**os.environ, "ONCEFLOW_STORE_URL": f"sqlite://{tmp_path / 'scratch.db'}",
           "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{block.doc}:{block.line} failed:\n{result.stdout}\n{result.stderr}"
    block_output = _expected_output(block)
    if block_output is not None:
        assert result.stdout == block_output, f"{block.doc}:{block.line} printed:\n{result.stdout}"


def _expected_output(block: Block) -> str | None:
    """What the doc says the block prints: a ```text block after it, with at most a short paragraph between."""
    lines = (ROOT / block.doc).read_text().splitlines()
    end = next(j for j in range(block.line, len(lines)) if lines[j].strip() == "```")
    prose = 0
    for j in range(end + 1, len(lines)):
        line = lines[j].strip()
        if line.startswith("```"):
            if line != "```text":
                return None
            stop = next(k for k in range(j + 1, len(lines)) if lines[k].strip() == "```")
            return "\n".join(lines[j + 1:stop]) + "\n"
        prose += bool(line)
        if prose > _PROSE_BEFORE_OUTPUT:
            return None
    return None


def test_what_a_block_prints_is_checked_where_the_doc_shows_it() -> None:
    shown = {f"{b.doc}:{b.line}" for b in ALL if _expected_output(b) is not None}
    assert {"README.md", "docs/transactions.md", "docs/clients.md"} <= {name.split(":")[0] for name in shown}, shown


def test_every_doc_has_its_blocks_found_and_skips_say_why() -> None:
    assert len(ALL) >= 3, [f"{b.doc}:{b.line}" for b in ALL]
    assert all(block.skip is None or len(block.skip) > 10 for block in ALL)
    skipped = [b for b in ALL if b.skip is not None]
    assert len(skipped) <= len(ALL) // 3, "not-run markers are for the few blocks that cannot run here"
