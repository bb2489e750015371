"""Prometheus metrics of the batched transaction log (PIP-160's), served over HTTP when ``metrics.port`` is set
(on ``metrics.host``, 127.0.0.1 unless configured)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Histogram, start_http_server

from onceflow.connector.errors import ErrorCode, fail

DEFAULT_HOST = "127.0.0.1"

RECORDS_PER_BATCH = Histogram(
    "onceflow_txn_log_batch_records", "Control records per stored commit-log entry", ["group"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
)
BYTES_PER_BATCH = Histogram(
    "onceflow_txn_log_batch_bytes", "Bytes per stored commit-log entry", ["group"],
    buckets=(64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
)
OLDEST_RECORD_DELAY = Histogram(
    "onceflow_txn_log_oldest_record_delay_seconds", "How long the oldest record of an entry waited for its flush",
    ["group"], buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)
FLUSHES = Counter(
    "onceflow_txn_log_flushes", "Stored commit-log entries, by what triggered the flush", ["group", "trigger"],
)
COMMIT_LATENCY = Histogram(
    "onceflow_txn_commit_seconds", "From commit() to the transaction's data being visible", ["group"],
)

_served: set[int] = set()
_lock = threading.Lock()


def serve(port: int, host: str = DEFAULT_HOST) -> None:
    """Serve every onceflow metric on ``host:port`` (once per process and port: a later call for a port already
    served changes nothing); INVALID_CONFIG naming the address if it cannot be bound (in use, unknown host)."""
    with _lock:
        if port and port not in _served:
            try:
                start_http_server(port, addr=host)
            except OSError as exc:
                fail(ErrorCode.INVALID_CONFIG, f"metrics.port {port}: cannot serve metrics on {host}:{port} "
                     f"({exc.strerror or exc}); choose a free metrics.port, another metrics.host, or metrics.port=0 "
                     "to turn the endpoint off")
            _served.add(port)
