"""onceflow's import names live under one namespace, so a user's own top-level packages cannot shadow them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
from onceflow.connector import AdminClient, NewTopic, Producer
conf = {"store.url": "sqlite://app.db"}
AdminClient(conf).create_topics([NewTopic("orders", 1)])["orders"].result()
producer = Producer({**conf, "transactional.id": "app"})
producer.init_transactions()
producer.begin_transaction()
producer.produce("orders", b"v", partition=0)
producer.commit_transaction()
print("committed")
"""


def test_a_users_own_schemas_and_txn_packages_do_not_break_transactions(tmp_path: Path) -> None:
    for name in ("schemas", "txn", "connector", "integration"):  # the names onceflow's folders have
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("MINE = True\n")
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "committed"
