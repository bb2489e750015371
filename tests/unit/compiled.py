"""A fixture that runs a module's tests with a C extension and then with the Python code it falls back to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest


def compiled_then_python(module: ModuleType) -> Callable[..., Any]:
    """An autouse fixture for a test module: its tests run with ``module._compiled`` as pip built it (skipped where
    it is not built), then with None (the Python path alone)."""
    built = module._compiled

    @pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
    def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
        if request.param == "compiled" and built is None:
            pytest.skip(f"{module.__name__}'s C extension is not built here (no C compiler at install)")
        module._compiled = built if request.param == "compiled" else None
        yield request.param
        module._compiled = built

    return implementation
