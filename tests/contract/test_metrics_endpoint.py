"""The Prometheus endpoint of a transactional producer or a transaction group: where it binds, and a clear error
when it cannot."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from onceflow import txn
from onceflow.connector import KafkaError, KafkaException, Producer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_a_metrics_port_in_use_is_a_clear_config_error(sqlite_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        producer = Producer({"store.url": sqlite_url, "transactional.id": "app", "metrics.port": port})
        with pytest.raises(KafkaException) as info:
            producer.init_transactions()
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert f"metrics.port {port}" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)


def test_metrics_host_chooses_the_address_the_endpoint_binds(sqlite_url: str) -> None:
    port = free_port()
    producer = Producer({"store.url": sqlite_url, "transactional.id": "app", "metrics.port": port,
                         "metrics.host": "127.0.0.2"})
    producer.init_transactions()
    with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as response:
        assert b"onceflow_txn_commit_seconds" in response.read()
    with pytest.raises(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10):
        pass
    producer.close()


def test_a_transaction_group_serves_its_metrics_on_metrics_host(sqlite_url: str) -> None:
    port = free_port()
    group = txn.open_group({"store.url": sqlite_url, "metrics.port": port, "metrics.host": "127.0.0.3"})
    with urllib.request.urlopen(f"http://127.0.0.3:{port}/metrics", timeout=10) as response:
        assert b"onceflow_txn_commit_seconds" in response.read()
    group.close()
