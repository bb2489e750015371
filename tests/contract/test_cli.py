"""The ``onceflow`` command line: topics, produce from stdin, consume; errors are one line, exit non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from onceflow.integration.brokers import FAST_GROUP_CONFIG

COMMAND = [sys.executable, "-m", "onceflow.connector.cli"]


def cli(store_url: str, *args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, "--store", store_url, *args], input=stdin, text=True, capture_output=True,
                          timeout=timeout)


def cli_bytes(store_url: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*COMMAND, "--store", store_url, *args], input=stdin, capture_output=True, timeout=120)


def cli_in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run in ``directory`` without --store or $ONCEFLOW_STORE_URL: the implicit default store."""
    env = {name: value for name, value in os.environ.items() if name != "ONCEFLOW_STORE_URL"}
    return subprocess.run([*COMMAND, *args], text=True, capture_output=True, timeout=180, cwd=directory, env=env)


def one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single error line of a failed command, checked to contain each of ``needles``."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceflow: error: "), result.stderr
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


def values(store_url: str, topic: str, count: int) -> list[str]:
    consumed = cli(store_url, "consume", topic, "--from-beginning", "--max-messages", str(count), "--timeout", "3")
    assert consumed.returncode == 0, consumed.stderr
    return consumed.stdout.splitlines()


def test_topics_produce_consume_round_trip(store_url: str) -> None:
    assert cli(store_url, "topics", "create", "orders", "--partitions", "2").returncode == 0
    assert cli(store_url, "topics", "list").stdout.split() == ["orders"]
    produced = cli(store_url, "produce", "orders", "--key-separator", "=", stdin="a=1\nb=2\na=3\n")
    assert produced.returncode == 0, produced.stderr
    assert produced.stderr == "onceflow: produced 3 records to orders\n"
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
    cli(store_url, "topics", "create", "t")
    for args in (["topics", "describe", "nope"], ["produce", "nope"], ["topics", "create", "bad name"],
                 ["-X", "linger.ms", "produce", "t"], ["-X", "lingr.ms=5", "produce", "t"]):
        result = cli(store_url, *args, stdin="x\n")
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stderr.startswith("onceflow: error: ")
    assert "UNKNOWN_TOPIC_OR_PART" in cli(store_url, "topics", "describe", "nope").stderr


def test_run_refuses_a_store_that_has_its_topics_and_leaves_them_alone(store_url: str) -> None:
    cli(store_url, "topics", "create", "ledger")
    cli(store_url, "produce", "ledger", stdin="my own record\n")
    one_error_line(cli(store_url, "run", "--racers", "1", "--operations", "3"), "TOPIC_ALREADY_EXISTS", "ledger")
    assert values(store_url, "ledger", 2) == ["my own record"]


def test_run_without_a_store_works_in_a_scratch_store(tmp_path: Path) -> None:
    assert cli_in(tmp_path, "topics", "create", "ledger").returncode == 0
    produced = subprocess.run([*COMMAND, "--store", "sqlite://onceflow.db", "produce", "ledger"], input="mine\n",
                              text=True, capture_output=True, timeout=60, cwd=tmp_path)
    assert produced.returncode == 0, produced.stderr
    job = cli_in(tmp_path, "run", "--racers", "2", "--operations", "5")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "scratch store" in job.stderr
    assert values(f"sqlite://{tmp_path / 'onceflow.db'}", "ledger", 2) == ["mine"]


def test_produce_stops_at_an_oversized_line_and_keeps_every_line_before_it(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    lines = [f"line-{i}" for i in range(20_000)] + ["x" * 2_000] + ["after"] * 10
    result = cli(store_url, "-X", "message.max.bytes=1000", "produce", "t", stdin="\n".join(lines) + "\n")
    assert values(store_url, "t", 20_001) == lines[:20_000]
    one_error_line(result, "MSG_SIZE_TOO_LARGE", "line 20001", "20000 records produced from lines 1-20000")


def test_produce_refuses_non_utf8_text_after_writing_what_came_before(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    result = cli_bytes(store_url, "produce", "t", stdin=b"ok\n\xff\xfe bad\nlater\n")
    assert result.returncode == 1
    error = result.stderr.decode()
    assert error.count("\n") == 1 and "line 2 is not UTF-8" in error and "--binary" in error, error
    assert values(store_url, "t", 3) == ["ok"]


def test_binary_lines_round_trip_byte_for_byte(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    records = [b"\xff\xfe\x00raw", b"k\xc3=v\x80", b""]
    produced = cli_bytes(store_url, "produce", "t", "--binary", stdin=b"\n".join(records) + b"\n")
    assert produced.returncode == 0 and produced.stderr == b"onceflow: produced 3 records to t\n", produced.stderr
    consumed = cli_bytes(store_url, "consume", "t", "--binary", "--from-beginning", "--max-messages", "3")
    assert consumed.stdout == b"\n".join(records) + b"\n"


def test_consume_into_a_closed_pipe_stops_quietly(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    cli(store_url, "produce", "t", stdin="".join(f"{i:0100d}\n" for i in range(3_000)))  # more than a pipe holds
    reader = subprocess.Popen([*COMMAND, "--store", store_url, "consume", "t", "--from-beginning", "--timeout", "5"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline() == f"{0:0100d}\n"
    reader.stdout.close()  # as `| head -1` does
    stderr = reader.stderr.read()
    reader.stderr.close()
    assert reader.wait(timeout=60) == 141 and stderr == ""


def test_consume_refuses_a_negative_timeout_and_an_unknown_topic_with_a_group(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    one_error_line(cli(store_url, "consume", "t", "--timeout", "-1", timeout=30), "--timeout -1", ">= 0")
    for args in (["consume", "nope"], ["consume", "nope", "--group", "g", "--timeout", "1"]):
        one_error_line(cli(store_url, *args, timeout=30), "UNKNOWN_TOPIC_OR_PART")


def test_the_implicit_default_store_is_named_and_never_created_by_a_read(tmp_path: Path) -> None:
    for args in (["topics", "list"], ["topics", "describe", "t"], ["consume", "t", "--timeout", "1"]):
        one_error_line(cli_in(tmp_path, *args), str(tmp_path / "onceflow.db"), "does not exist", "--store")
    assert not (tmp_path / "onceflow.db").exists()
    created = cli_in(tmp_path, "topics", "create", "t")
    assert created.returncode == 0
    assert created.stderr.splitlines() == [f"onceflow: using the default store sqlite://onceflow.db "
                                           f"({tmp_path / 'onceflow.db'}); choose another with --store URL or "
                                           "$ONCEFLOW_STORE_URL"]
    assert cli_in(tmp_path, "topics", "list").stdout.split() == ["t"]


def test_internal_topic_names_are_refused(store_url: str) -> None:
    one_error_line(cli(store_url, "topics", "create", "__onceflow.mine"), "TOPIC_EXCEPTION", "'__onceflow.'")


def test_produce_refuses_a_negative_partition(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    one_error_line(cli(store_url, "produce", "t", "--partition", "-5", stdin="x\n"), "_INVALID_ARG", "partition -5")
    assert values(store_url, "t", 1) == []


def test_topics_applies_x_settings(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    one_error_line(cli(store_url, "-X", "store.busy.timeout.ms=soon", "topics", "list"), "INVALID_CONFIG",
                   "store.busy.timeout.ms")


def test_produce_counts_delivered_records_with_keys(store_url: str) -> None:
    cli(store_url, "topics", "create", "t")
    result = cli(store_url, "produce", "t", "--key-separator", "=", stdin="a=1\nno key\n")
    assert result.stderr == "onceflow: produced 2 records to t\n"
    consumed = cli(store_url, "consume", "t", "--from-beginning", "--max-messages", "2", "--print-key")
    assert consumed.stdout.splitlines() == ["a\t1", "\tno key"]
