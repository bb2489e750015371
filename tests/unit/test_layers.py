"""Dependencies point one way: base (errors, config, failpoints, store, the commit log's schema) -> txn -> clients
-> the rest (Spark, the CLI, demo jobs, the test harness). A module importing from a layer above its own would
make the packages import each other in a circle, working only by import order."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(link.name for link in (ROOT / "onceflow").iterdir() if link.is_dir())  # the folders it links
BASE, TXN, CLIENTS, TOP = range(4)
CLIENT_MODULES = {"producer", "producer_transactions", "consumer", "admin", "serializing"}
TOP_MODULES = {"cli"}


def layer(module: str) -> int:
    parts = module.split(".")[1:]  # without "onceflow"
    if parts[0] == "txn":
        return TXN
    if parts[0] == "connector":
        inner = parts[1] if len(parts) > 1 else ""
        return CLIENTS if inner in CLIENT_MODULES else TOP if inner in TOP_MODULES else BASE
    if parts[0] == "schemas":
        return BASE if len(parts) == 1 or parts[1].startswith("txn_log") else TOP
    return TOP


def module_name(path: Path) -> str:
    return ".".join(("onceflow", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")


def imports(path: Path) -> set[str]:
    """The onceflow modules a file imports at run time (``if TYPE_CHECKING:`` blocks left out)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    checking_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                     for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in checking_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("onceflow"):
            found.update(f"{node.module}.{a.name}" if node.module in ("onceflow", "onceflow.connector")
                         else node.module for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("onceflow"))
    return found


def imported_layer(module: str) -> int:
    """A name imported from the connector package counts as the module it comes from (a client, or base)."""
    parts = module.split(".")
    if parts[:2] == ["onceflow", "connector"] and len(parts) == 3 and parts[2][:1].isupper():
        client = {"Producer": "producer", "Consumer": "consumer", "AdminClient": "admin",
                  "SerializingProducer": "serializing", "DeserializingConsumer": "serializing"}.get(parts[2])
        return CLIENTS if client else BASE
    if module == "onceflow.txn" or parts[:2] == ["onceflow", "txn"]:
        return TXN
    return layer(module) if len(parts) > 1 else TOP


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [f"{module_name(path)} imports {target}"
              for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
              for target in sorted(imports(path)) if imported_layer(target) > layer(module_name(path))]
    assert upward == []


def test_importing_transactions_loads_no_client() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, onceflow.txn; print(sorted(m for m in sys.modules "
         "if m.rsplit('.', 1)[-1] in ('producer', 'producer_transactions', 'consumer', 'admin', 'serializing')))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
