"""``pip install -e .`` builds every C extension with no extra step where a C compiler and Python's headers are:
the speed of the Producer, of the embedded store and of the Kafka Consumer depends on them, and their absence would
only show as a slower run."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

from onceflow.connector import accumulator
from onceflow.connector.store import batch_codec
from onceflow.connector.store.kafka import messages


@pytest.mark.parametrize(("source", "compiled"), [
    ("connector/_accumulator.c", accumulator._compiled),
    ("connector/store/_batch_codec.c", batch_codec._compiled),
    ("connector/store/kafka/_messages.c", messages._compiled),
])
def test_each_extension_is_built_where_a_c_compiler_is(source: str, compiled: ModuleType | None) -> None:
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine: Python does the work")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers on this machine: Python does the work")
    assert compiled is not None, f"pip did not build {source}: see its output"
