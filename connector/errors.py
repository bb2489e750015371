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
    """Every code confluent-kafka's ``KafkaError`` defines, with its number (Kafka's protocol codes, librdkafka's
    negative local codes), and onceflow's own (>= 1000). ``tests/unit/test_public_api.py`` pins the numbers."""

    UNKNOWN = -1
    NO_ERROR = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2  # Kafka's name; INVALID_MSG below is librdkafka's, an alias
    INVALID_MSG = 2
    UNKNOWN_TOPIC_OR_PART = 3
    INVALID_MSG_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_FOR_PARTITION = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MSG_SIZE_TOO_LARGE = 10
    STALE_CTRL_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    LOG_DIR_NOT_FOUND = 57
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    DELEGATION_TOKEN_AUTH_DISABLED = 61
    DELEGATION_TOKEN_NOT_FOUND = 62
    DELEGATION_TOKEN_OWNER_MISMATCH = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
    DELEGATION_TOKEN_EXPIRED = 66
    INVALID_PRINCIPAL_TYPE = 67
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    LISTENER_NOT_FOUND = 72
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INCONSISTENT_VOTER_SET = 94
    INVALID_UPDATE_VERSION = 95
    FEATURE_UPDATE_FAILED = 96
    PRINCIPAL_DESERIALIZATION_FAILURE = 97
    UNKNOWN_TOPIC_ID = 100
    INCONSISTENT_TOPIC_ID = 103
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115
    UNKNOWN_CONTROLLER_ID = 116
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
    INVALID_REGISTRATION = 119
    TRANSACTION_ABORTABLE = 120
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    INVALID_VOTER_KEY = 125
    DUPLICATE_VOTER = 126
    VOTER_NOT_FOUND = 127
    INVALID_REGULAR_EXPRESSION = 128
    REBOOTSTRAP_REQUIRED = 129
    STREAMS_INVALID_TOPOLOGY = 130
    STREAMS_INVALID_TOPOLOGY_EPOCH = 131
    STREAMS_TOPOLOGY_FENCED = 132
    SHARE_SESSION_LIMIT_REACHED = 133
    # Local (client-side) conditions: librdkafka's negative codes.
    _DESTROY_BROKER = -137
    _INVALID_DIFFERENT_RECORD = -138
    _LOG_TRUNCATION = -139
    _AUTO_OFFSET_RESET = -140
    _NOOP = -141
    _ASSIGNMENT_LOST = -142
    _APPLICATION = -143
    _FENCED = -144
    _NOT_CONFIGURED = -145
    _UNKNOWN_BROKER = -146
    _MAX_POLL_EXCEEDED = -147
    _GAPLESS_GUARANTEE = -148
    _INCONSISTENT = -149
    _FATAL = -150
    _PURGE_INFLIGHT = -151
    _PURGE_QUEUE = -152  # a queued record dropped by an aborted transaction
    _RETRY = -153
    _INVALID_TYPE = -154
    _UNDERFLOW = -155
    _NOENT = -156
    _READ_ONLY = -157
    _PARTIAL = -158
    _VALUE_DESERIALIZATION = -159
    _KEY_DESERIALIZATION = -160
    _VALUE_SERIALIZATION = -161
    _KEY_SERIALIZATION = -162
    _INTR = -163
    _WAIT_CACHE = -164
    _UNSUPPORTED_FEATURE = -165
    _TIMED_OUT_QUEUE = -166
    _OUTDATED = -167
    _NO_OFFSET = -168
    _AUTHENTICATION = -169
    _NOT_IMPLEMENTED = -170
    _UNKNOWN_PROTOCOL = -171
    _STATE = -172
    _CONFLICT = -173
    _REVOKE_PARTITIONS = -174
    _ASSIGN_PARTITIONS = -175
    _EXISTING_SUBSCRIPTION = -176
    _PREV_IN_PROGRESS = -177
    _IN_PROGRESS = -178
    _UNKNOWN_GROUP = -179
    _WAIT_COORD = -180
    _SSL = -181
    _NODE_UPDATE = -182
    _ISR_INSUFF = -183
    _QUEUE_FULL = -184
    _TIMED_OUT = -185
    _INVALID_ARG = -186
    _ALL_BROKERS_DOWN = -187
    _UNKNOWN_TOPIC = -188
    _FS = -189  # the store's file or database failed (librdkafka's local filesystem error)
    _UNKNOWN_PARTITION = -190
    _PARTITION_EOF = -191
    _MSG_TIMED_OUT = -192
    _RESOLVE = -193
    _CRIT_SYS_RESOURCE = -194
    _TRANSPORT = -195  # the broker could not be reached
    _FAIL = -196
    _DESTROY = -197
    _BAD_COMPRESSION = -198
    _BAD_MSG = -199
    # onceflow's own.
    CAS_MISMATCH = 1000
    TRANSACTION_TIMED_OUT = 1001
    PARTITION_SEALED = 1002
    SINK_ID_IN_USE = 1003


class _CodeConstants(type):
    """Gives ``KafkaError`` confluent-kafka's class constants: ``KafkaError._PARTITION_EOF`` is
    ``ErrorCode._PARTITION_EOF``, so ``if err.code() == KafkaError._PARTITION_EOF`` works unchanged."""

    def __getattr__(cls, name: str) -> ErrorCode:
        try:
            return ErrorCode[name]
        except KeyError:
            raise AttributeError(f"type object 'KafkaError' has no attribute {name!r}") from None

    def __dir__(cls) -> list[str]:
        return [*super().__dir__(), *ErrorCode.__members__]


class KafkaError(metaclass=_CodeConstants):
    """An error: a code, a human reason with the context to act on, and Kafka's flags.

    Every :class:`ErrorCode` is also a class constant, as in confluent-kafka: ``KafkaError.CAS_MISMATCH``.
    """

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
