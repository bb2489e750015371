"""One error type for all of onceflow, shaped like confluent-kafka's ``KafkaError``/``KafkaException``.

Codes carry Kafka's names so that code written against confluent-kafka can branch on them unchanged.
``CAS_MISMATCH``, ``TRANSACTION_TIMED_OUT``, ``PARTITION_SEALED`` and ``SINK_ID_IN_USE`` are onceflow's own:
Kafka has no conditional append, shows a lost timeout race only as fencing, has no sealed partitions and no
exactly-once sinks.
"""

from __future__ import annotations

import builtins
import enum
from typing import NoReturn


class ErrorCode(enum.IntEnum):
    """Error codes; the numbers are Kafka's protocol codes where Kafka has one, ours are >= 1000."""

    UNKNOWN = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2  # librdkafka calls it INVALID_MSG
    UNKNOWN_TOPIC_OR_PART = 3
    MSG_SIZE_TOO_LARGE = 10
    TOPIC_EXCEPTION = 17
    UNKNOWN_MEMBER_ID = 25
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    INVALID_RECORD = 87
    PRODUCER_FENCED = 90
    # Local (client-side) conditions, as librdkafka's negative codes.
    _PURGE_QUEUE = -152  # a queued record dropped by an aborted transaction
    _STATE = -172
    _FS = -189  # the store's file or database failed (librdkafka's local filesystem error)
    _PARTITION_EOF = -191
    _TRANSPORT = -195  # the broker could not be reached
    _TIMED_OUT = -185
    # onceflow's own.
    CAS_MISMATCH = 1000
    TRANSACTION_TIMED_OUT = 1001
    PARTITION_SEALED = 1002
    SINK_ID_IN_USE = 1003


class KafkaError:
    """An error: a code, a human reason with the context to act on, and Kafka's flags."""

    __slots__ = ("_code", "_fatal", "_outcome_unknown", "_reason", "_retriable", "_txn_requires_abort")

    def __init__(
        self,
        code: ErrorCode,
        reason: str | None = None,
        *,
        fatal: bool = False,
        retriable: bool = False,
        txn_requires_abort: bool = False,
        outcome_unknown: bool = False,
    ) -> None:
        self._code = ErrorCode(code)
        self._reason = reason if reason is not None else self._code.name
        self._fatal = fatal
        self._retriable = retriable
        self._txn_requires_abort = txn_requires_abort
        self._outcome_unknown = outcome_unknown

    def code(self) -> ErrorCode:
        return self._code

    def name(self) -> str:
        return self._code.name

    def str(self) -> str:
        return self._reason

    def fatal(self) -> bool:
        return self._fatal

    def retriable(self) -> bool:
        return self._retriable

    def txn_requires_abort(self) -> bool:
        return self._txn_requires_abort

    def outcome_unknown(self) -> bool:
        """True when the operation may or may not have taken effect (a timeout, a lost connection, a crash).

        Kafka's flags cannot say this: ``retriable`` means retrying is safe, which is false for a write that may
        have landed. After a transaction commit with an unknown outcome, ask ``TransactionGroup.outcome(txn_id)``
        instead of retrying; an idempotent append may be retried as it is.
        """
        return self._outcome_unknown

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return int(self._code) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> builtins.str:
        return f"{self._code.name}: {self._reason}"

    def __repr__(self) -> builtins.str:
        return f"KafkaError{{code={self._code.name},val={int(self._code)},str=\"{self._reason}\"}}"


class KafkaException(Exception):
    """Raised for every onceflow failure; ``args[0]`` is the :class:`KafkaError`, as in confluent-kafka."""

    def __init__(self, error: KafkaError) -> None:
        super().__init__(error)
        self.error = error

    @property
    def code(self) -> ErrorCode:
        return self.error.code()

    def __str__(self) -> str:
        return str(self.error)


def fail(
    code: ErrorCode, reason: str, *, retriable: bool = False, fatal: bool = False, outcome_unknown: bool = False
) -> NoReturn:
    """Raise a :class:`KafkaException` for ``code`` with the given reason."""
    raise KafkaException(KafkaError(code, reason, retriable=retriable, fatal=fatal, outcome_unknown=outcome_unknown))
