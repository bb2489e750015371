"""Transactions on any onceflow store: groups with a commit log, staged multi-writer writes, ordered merge.

One transaction across processes, in four calls::

    group = txn.open_group({"store.url": "sqlite://app.db", "transaction.group": "orders"})
    txn_id = group.begin(timeout_ms=600_000)                 # process A; hand txn_id to the others
    writer = group.writer(txn_id, writer_id="worker-3")      # process B, C, ...
    writer.produce("orders", Record(b"key", b"value"))
    participant = writer.participant()                       # picklable; hand it back to A
    group.commit(txn_id, [participant, ...])                 # process A: exactly these writers' records

Kafka's single-process API is on ``onceflow.connector.Producer`` (``transactional.id``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from onceflow.connector.config import TransactionGroupConfig, build
from onceflow.connector.store import open_store
from onceflow.txn.batched_writer import BatchedLogWriter, Position
from onceflow.txn.commit_log import Outcome
from onceflow.txn.group import TransactionGroup
from onceflow.txn.staging import Participant, StagingWriter
from onceflow.txn.state import TransactionStateMachine, TxnState


def open_group(config: Mapping[str, Any]) -> TransactionGroup:
    """Open (creating it if needed) the transaction group that ``transaction.group`` names on ``store.url``."""
    built = build(TransactionGroupConfig, config, "transaction group")
    return TransactionGroup(open_store(built.store), built.transactions, built.store.message_max_bytes,
                            owns_store=True)


__all__ = [
    "BatchedLogWriter",
    "Outcome",
    "Participant",
    "Position",
    "StagingWriter",
    "TransactionGroup",
    "TransactionStateMachine",
    "TxnState",
    "open_group",
]
