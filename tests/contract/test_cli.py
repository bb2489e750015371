"""The ``onceflow`` command line: topics, produce from stdin, consume; errors are one line, exit non-zero."""

from __future__ import annotations

import subprocess
import sys

from onceflow.integration.brokers import FAST_GROUP_CONFIG


def cli(store_url: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onceflow.connector.cli", "--store", store_url, *args], input=stdin,
                          text=True, capture_output=True, timeout=60)


def test_topics_produce_consume_round_trip(store_url: str) -> None:
    assert cli(store_url, "topics", "create", "orders", "--partitions", "2").returncode == 0
    assert cli(store_url, "topics", "list").stdout.split() == ["orders"]
    produced = cli(store_url, "produce", "orders", "--key-separator", "=", stdin="a=1\nb=2\na=3\n")
    assert produced.returncode == 0, produced.stderr
    consumed = cli(store_url, "consume", "orders", "--from-beginning", "--max-messages", "3", "--print-key")
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.splitlines()
    assert sorted(lines) == ["a\t1", "a\t3", "b\t2"]
    assert lines.index("a\t1") < lines.index("a\t3")
    assert cli(store_url, "topics", "scale", "orders", "--partitions", "3").returncode == 0
    described = cli(store_url, "topics", "describe", "orders").stdout
    assert "sealed" in described and "open" in described
    assert cli(store_url, "topics", "delete", "orders").returncode == 0
    assert cli(store_url, "topics", "list").stdout.split() == []


def test_consume_with_a_group_resumes_where_it_stopped(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    cli(store_url, "produce", "t", stdin="one\ntwo\nthree\n")
    fast = [arg for name, value in FAST_GROUP_CONFIG.items() for arg in ("-X", f"{name}={value}")]
    first = cli(store_url, *fast, "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "2")
    assert first.stdout.split() == ["one", "two"], first.stderr
    second = cli(store_url, *fast, "consume", "t", "--group", "g", "--max-messages", "1", "--timeout", "30")
    assert second.stdout.split() == ["three"], second.stderr


def test_errors_are_one_clear_line_and_a_non_zero_exit(store_url: str) -> None:
    for args in (["topics", "describe", "nope"], ["produce", "nope"], ["topics", "create", "bad name"],
                 ["-X", "linger.ms", "produce", "t"], ["-X", "lingr.ms=5", "produce", "t"]):
        result = cli(store_url, *args, stdin="x\n")
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("onceflow: error: ")
    assert "UNKNOWN_TOPIC_OR_PART" in cli(store_url, "topics", "describe", "nope").stderr
