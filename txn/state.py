"""The transactional producer's state machine (Kafka's): an Enum of states and the table of allowed moves.

An illegal move raises INVALID_TXN_STATE naming what was attempted in which state.
"""

from __future__ import annotations

import enum

from onceflow.connector.errors import ErrorCode, fail


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


_ALLOWED: dict[TxnState, frozenset[TxnState]] = {
    TxnState.UNINITIALIZED: frozenset({TxnState.READY, TxnState.FATAL_ERROR}),
    TxnState.READY: frozenset({TxnState.IN_TRANSACTION, TxnState.FATAL_ERROR}),
    TxnState.IN_TRANSACTION: frozenset({TxnState.COMMITTING, TxnState.ABORTING, TxnState.ABORTABLE_ERROR,
                                        TxnState.FATAL_ERROR}),
    # COMMITTING -> IN_TRANSACTION: a one-step commit could not be done; the transaction stages and commits.
    TxnState.COMMITTING: frozenset({TxnState.READY, TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR,
                                    TxnState.FATAL_ERROR}),
    TxnState.ABORTING: frozenset({TxnState.READY, TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR}),
    TxnState.ABORTABLE_ERROR: frozenset({TxnState.ABORTING, TxnState.FATAL_ERROR}),
    TxnState.FATAL_ERROR: frozenset(),
}


class TransactionStateMachine:
    """Where a transactional producer is; :meth:`move` is the only way to change it."""

    def __init__(self, transactional_id: str) -> None:
        self._transactional_id = transactional_id
        self.state = TxnState.UNINITIALIZED

    def move(self, to: TxnState, doing: str) -> None:
        """Go to ``to`` (for ``doing``), or raise INVALID_TXN_STATE and stay."""
        if to not in _ALLOWED[self.state]:
            fail(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._transactional_id!r}: cannot {doing} in state "
                 f"{self.state.value!r}")
        self.state = to

    def require(self, *states: TxnState, doing: str) -> None:
        """INVALID_TXN_STATE unless in one of ``states``."""
        if self.state not in states:
            fail(ErrorCode.INVALID_TXN_STATE, f"transactional.id {self._transactional_id!r}: cannot {doing} in state "
                 f"{self.state.value!r}")
