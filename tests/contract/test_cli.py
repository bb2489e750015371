"""The ``onceflow`` command line: topics, produce from stdin, consume; errors are one line, exit non-zero."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.integration.brokers import FAST_GROUP_CONFIG
from tests.conftest import process_state

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


FAST = [arg for name, value in FAST_GROUP_CONFIG.items() for arg in ("-X", f"{name}={value}")]


def two_of_three_consumed_by_group_g(store_url: str) -> None:
    """Topic t holds one, two, three; group g consumed (and committed) the first two."""
    cli(store_url, "topics", "create", "t")
    cli(store_url, "produce", "t", stdin="one\ntwo\nthree\n")
    first = cli(store_url, *FAST, "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "2")
    assert first.stdout.split() == ["one", "two"], first.stderr


def test_consume_with_a_group_resumes_where_it_stopped(store_url: str) -> None:
    two_of_three_consumed_by_group_g(store_url)
    second = cli(store_url, *FAST, "consume", "t", "--group", "g", "--max-messages", "1", "--timeout", "30")
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


def test_run_on_a_given_store_races_verifies_and_passes(store_url: str) -> None:
    """Every check of the job passes on both stores. On Kafka a CAS append is followed by a commit marker that
    takes an offset: racers that took their last record's offset + 1 as the log's end waited for a record at the
    marker's offset, and the job hung."""
    job = cli(store_url, "run", "--racers", "2", "--operations", "5", timeout=180)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "FAILED" not in job.stdout and "10 CAS appends by 2 processes" in job.stdout, job.stdout


def _children(pid: int) -> set[int]:
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def _gone(pid: int) -> bool:
    """Exited (a zombie not reaped by whoever adopted it counts as gone)."""
    return process_state(pid) in (None, "Z")


@pytest.mark.skipif(not Path(f"/proc/self/task/{os.getpid()}/children").exists(),
                    reason="reads the process tree from Linux's /proc/<pid>/task/<tid>/children")
def test_a_killed_run_takes_its_racers_with_it(tmp_path: Path) -> None:
    """A job SIGKILLed mid-race (a timeout's kill, the OOM killer) leaves no racer appending on: they outlived it
    by minutes and loaded the machine (multiprocessing's pool workers check their parent only between tasks)."""
    job = subprocess.Popen([*COMMAND, "--store", f"sqlite://{tmp_path / 'store.db'}", "run", "--racers", "2",
                            "--operations", "1000000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_children(job.pid)) < 3:  # the two racers and multiprocessing's resource tracker
            assert time.monotonic() < deadline and job.poll() is None, "the job did not start its racers"
            time.sleep(0.1)
        time.sleep(2)  # racing
        racers = _children(job.pid)
    finally:
        job.kill()
        job.wait()
    deadline = time.monotonic() + 30
    try:
        while not all(map(_gone, racers)):
            assert time.monotonic() < deadline, f"still running 30 s after the job was killed: {racers}"
            time.sleep(0.2)
    finally:  # (what the job left behind, if it did, would append on for minutes)
        for pid in racers:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


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


# -- like kcat: -e, --offset, --partition, --format; topics describe; groups; --version; help ----------------------


def cells(output: str) -> list[list[str]]:
    """The body rows of the tables a command printed, each as its cells."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in output.splitlines()
            if line.strip().startswith("│")]


def test_consume_reads_to_the_end_from_chosen_offsets_in_kcats_format(store_url: str) -> None:
    cli(store_url, "topics", "create", "t", "--partitions", "2")
    cli(store_url, "produce", "t", "--partition", "0", "--key-separator", "=", stdin="a=1\nb=2\nc=3\n")
    cli(store_url, "produce", "t", "--partition", "1", stdin="x\n")
    everything = cli(store_url, "consume", "t", "-e", "--offset", "beginning", "--format", r"%t %p %o %k=%s %S\n")
    assert everything.returncode == 0, everything.stderr
    assert sorted(everything.stdout.splitlines()) == ["t 0 0 a=1 1", "t 0 1 b=2 1", "t 0 2 c=3 1", "t 1 0 =x 1"]
    last = cli(store_url, "consume", "t", "-e", "--partition", "0", "--offset", "-1", "--format", r"%o:%s;")
    assert last.stdout == "2:3;"
    from_one = cli(store_url, "consume", "t", "--exit", "--partition", "0", "--offset", "1", "--format", r"%s\t%%\n")
    assert from_one.stdout == "2\t%\n3\t%\n"
    stamped = cli(store_url, "consume", "t", "-e", "--partition", "1", "--from-beginning", "--format", "%T")
    assert int(stamped.stdout) > 1_600_000_000_000
    assert cli(store_url, "consume", "t", "-e", "--offset", "end").stdout == ""
    by_time = [cli(store_url, "consume", "t", "-e", "--partition", "0", "--offset", at, "--format", "%s")
               for at in ("s@0", f"s@{10**13}")]
    assert [r.stdout for r in by_time] == ["123", ""]
    one_error_line(cli(store_url, "consume", "t", "-e", "--offset", "soon"), "_INVALID_ARG", "--offset 'soon'")
    one_error_line(cli(store_url, "consume", "t", "--group", "g", "--offset", "1"), "_INVALID_ARG", "without a group")
    one_error_line(cli(store_url, "consume", "t", "-e", "--format", "%q"), "_INVALID_ARG", "%q")
    one_error_line(cli(store_url, "consume", "t", "-e", "--partition", "5"), "UNKNOWN_TOPIC_OR_PART", "partition 5")


def test_topics_describe_shows_each_partitions_offsets(store_url: str) -> None:
    cli(store_url, "topics", "create", "t", "--partitions", "2")
    cli(store_url, "produce", "t", "--partition", "1", stdin="a\nb\nc\n")
    rows = cells(cli(store_url, "topics", "describe", "t").stdout)
    assert rows == [["0", "0", "open", "0", "0", "0"], ["1", "0", "open", "0", "3", "3"]]


def test_groups_list_describe_with_lag_and_reset_offsets(store_url: str) -> None:
    two_of_three_consumed_by_group_g(store_url)
    assert ["g", "EMPTY", "0"] in cells(cli(store_url, "groups", "list").stdout)
    assert cells(cli(store_url, "groups", "describe", "g").stdout) == [["t", "0", "2", "3", "1", "-"]]
    plan = cli(store_url, "groups", "reset-offsets", "g", "--topic", "t", "--to-earliest")
    assert cells(plan.stdout) == [["0", "2", "0"]] and "dry run" in plan.stdout
    assert cells(cli(store_url, "groups", "describe", "g").stdout) == [["t", "0", "2", "3", "1", "-"]]
    done = cli(store_url, "groups", "reset-offsets", "g", "--topic", "t", "--shift-by", "-1", "--execute")
    assert done.returncode == 0 and cells(done.stdout) == [["0", "2", "1"]], done.stderr
    assert cells(cli(store_url, "groups", "describe", "g").stdout) == [["t", "0", "1", "3", "2", "-"]]
    again = cli(store_url, *FAST, "consume", "t", "--group", "g", "-e")
    assert again.stdout.split() == ["two", "three"], again.stderr


def test_global_options_may_follow_the_command(store_url: str) -> None:
    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([*COMMAND, *args], input=stdin, text=True, capture_output=True, timeout=120)

    assert run("topics", "create", "t", "--store", store_url).returncode == 0
    assert run("topics", "list", "--store", store_url).stdout.split() == ["t"]
    one_error_line(run("produce", "t", "--store", store_url, "-X", "lingr.ms=5", stdin="x\n"), "lingr.ms")
    both = run("-X", "message.max.bytes=100", "produce", "t", "--store", store_url, "-X", "linger.ms=1",
               stdin="x" * 200 + "\n")
    one_error_line(both, "MSG_SIZE_TOO_LARGE")  # the -X before the command counts too


def test_version_and_help_for_every_command() -> None:
    version = subprocess.run([*COMMAND, "--version"], text=True, capture_output=True, timeout=60)
    assert version.stdout.strip() == f"onceflow {importlib.metadata.version('onceflow')}"
    expected = {(): ["topics", "produce", "consume", "groups", "schema-registry", "schemas", "connect", "run"],
                ("topics",): ["create", "list", "describe", "scale", "delete"],
                ("groups",): ["list", "describe", "reset-offsets"], ("schemas",): ["register", "check", "list"]}
    for parent, children in expected.items():
        shown = subprocess.run([*COMMAND, *parent, "--help"], text=True, capture_output=True, timeout=60).stdout
        for child in children:  # a command without help text is not listed with a description
            assert re.search(rf"^\s+{child}\s+\w", shown, re.MULTILINE), (parent, child, shown)
