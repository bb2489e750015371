"""Long CLI operations show a live count on a terminal and nothing when piped: ``consume`` (while its records go
elsewhere than the terminal) and ``groups reset-offsets``; the records written are the same either way."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import threading

from tests.contract.test_cli import COMMAND, cli

RECORDS = 3_000


def on_terminal(store_url: str, *args: str, stdout_too: bool = False, stdin: bytes | None = None) -> tuple[str, str]:
    """Run the CLI with stderr (and, ``stdout_too``, stdout) on a pseudo-terminal, ``stdin`` as its input: (what
    the terminal showed, what went to a piped stdout)."""
    primary, secondary = pty.openpty()
    shown: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(primary, 65536):
                shown.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    result = subprocess.run([*COMMAND, "--store", store_url, *args], input=stdin if stdin is not None else b"",
                            stdout=secondary if stdout_too else subprocess.PIPE, stderr=secondary, timeout=120,
                            env={**os.environ, "TERM": "xterm-256color"})
    os.close(secondary)
    reader.join(timeout=30)
    os.close(primary)
    assert result.returncode == 0, b"".join(shown)
    return b"".join(shown).decode(errors="replace"), (result.stdout or b"").decode()


def produced(store_url: str) -> list[str]:
    lines = [str(i) for i in range(RECORDS)]
    assert cli(store_url, "topics", "create", "t").returncode == 0
    assert cli(store_url, "produce", "t", stdin="".join(f"{line}\n" for line in lines)).returncode == 0
    return lines


def test_consume_counts_on_a_terminal_while_its_records_go_to_a_pipe(sqlite_url: str) -> None:
    lines = produced(sqlite_url)
    shown, records = on_terminal(sqlite_url, "consume", "t", "--from-beginning", "-e")
    assert records.splitlines() == lines  # nothing of the progress in the records
    assert "consuming from t" in shown and f"{RECORDS} records" in shown


def test_consume_piped_is_quiet(sqlite_url: str) -> None:
    lines = produced(sqlite_url)
    piped = cli(sqlite_url, "consume", "t", "--from-beginning", "-e")
    assert (piped.returncode, piped.stdout.splitlines(), piped.stderr) == (0, lines, "")


def test_consume_onto_the_terminal_shows_records_without_a_count(sqlite_url: str) -> None:
    lines = produced(sqlite_url)
    shown, _ = on_terminal(sqlite_url, "consume", "t", "--from-beginning", "-e", stdout_too=True)
    assert shown.split() == lines
    assert "consuming from" not in shown


def test_reset_offsets_counts_partitions_on_a_terminal_and_is_quiet_piped(sqlite_url: str) -> None:
    assert cli(sqlite_url, "topics", "create", "t", "--partitions", "3").returncode == 0
    shown, plan = on_terminal(sqlite_url, "groups", "reset-offsets", "g", "--topic", "t", "--to-earliest")
    assert "planning g on t" in shown and "3 partitions" in shown
    assert "dry run" in plan
    piped = cli(sqlite_url, "groups", "reset-offsets", "g", "--topic", "t", "--to-earliest")
    assert piped.returncode == 0 and piped.stderr == "" and "dry run" in piped.stdout


def test_produce_shows_progress_on_a_terminal_and_none_when_piped(sqlite_url: str) -> None:
    cli(sqlite_url, "topics", "create", "t")
    lines = "".join(f"{i}\n" for i in range(3_000))
    piped = cli(sqlite_url, "produce", "t", stdin=lines)
    assert piped.stderr == "onceflow: produced 3000 records to t\n"
    shown, _ = on_terminal(sqlite_url, "produce", "t", stdin=lines.encode())
    assert "producing to t" in shown and "produced 3000 records to t" in shown
