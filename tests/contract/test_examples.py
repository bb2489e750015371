"""The programs in examples/ are confluent-kafka programs: each runs on both backends, and the very same text with
only its import lines and the server's config key changed runs on confluent-kafka against the Kafka broker and
prints the same."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def as_confluent_kafka(source: str) -> str:
    """The program as written for confluent-kafka: its import lines and the config key are the only changes."""
    source = re.sub(r"^from onceflow\.connector(\.admin)? import", lambda m: f"from confluent_kafka{m[1] or ''} import",
                    source, flags=re.MULTILINE)
    return source.replace('"store.url"', '"bootstrap.servers"')


def test_the_programs_differ_from_confluent_kafkas_only_in_imports_and_the_server_key() -> None:
    assert PROGRAMS == ["admin_topics.py", "poll_loop_consumer.py", "produce_with_callback.py",
                        "read_committed_consume.py", "transactional_copy.py"]
    for name in PROGRAMS:
        source = (EXAMPLES / name).read_text()
        changed = [ours for ours, theirs in zip(source.splitlines(), as_confluent_kafka(source).splitlines(),
                                                strict=True) if ours != theirs]
        assert changed, name
        for ours in changed:
            assert ours.startswith("from onceflow.connector") or '"store.url"' in ours, (name, ours)
        assert "onceflow" not in as_confluent_kafka(source), name


class Runner:
    """Runs the example programs against one server, as onceflow's (``store.url``) or as confluent-kafka's."""

    def __init__(self, server: str, tmp_path: Path, confluent: bool) -> None:
        self.server, self.tmp_path, self.confluent = server, tmp_path, confluent

    def __call__(self, program: str, *args: object) -> list[str]:
        script = EXAMPLES / program
        if self.confluent:
            script = self.tmp_path / program
            script.write_text(as_confluent_kafka((EXAMPLES / program).read_text()))
        done = subprocess.run([sys.executable, str(script), self.server, *map(str, args)], capture_output=True,
                              text=True, timeout=240, cwd=self.tmp_path)
        assert done.returncode == 0, f"{program} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout.splitlines()


def run_the_examples(run: Runner) -> None:
    """Each program in turn, as a user would try them, checking what each prints."""
    suffix = uuid.uuid4().hex[:8]
    orders, copy, txns = f"orders-{suffix}", f"orders-copy-{suffix}", f"txns-{suffix}"

    assert run("admin_topics.py", orders, copy, txns) == [
        f"created {orders}", f"created {copy}", f"created {txns}",
        f"{orders}: partitions [0, 1, 2]", f"{copy}: partitions [0, 1, 2]", f"{txns}: partitions [0, 1, 2]",
        *[f"{t}[{p}] ends at offset 0" for t in sorted([orders, copy, txns]) for p in range(3)]]

    delivered = run("produce_with_callback.py", orders, 9)
    assert delivered[-1] == "0 records left undelivered"
    assert sorted(delivered[:-1]) == sorted(f"key-{i} delivered to {orders}[{i % 3}] at offset {i // 3}"
                                            for i in range(9))

    received = run("poll_loop_consumer.py", orders, f"group-{suffix}", 9)
    assert received == [f"{i % 3} {i // 3} key-{i}=value-{i}" for i in sorted(range(9), key=lambda i: (i % 3, i))] + [
        "received 9 records"]

    assert run("read_committed_consume.py", txns) == ["first-1", "first-2", "second-1"]

    copied = run("transactional_copy.py", orders, copy, f"copier-{suffix}", 9)
    assert copied == ["copied 9 records", *[f"group copier-{suffix} committed {orders}[{p}] up to offset 3"
                                            for p in range(3)]]
    output = run("poll_loop_consumer.py", copy, f"check-{suffix}", 9)
    assert output[-1] == "received 9 records"
    # Offsets in the copy depend on the backend (Kafka's transaction markers take some): compare the rest.
    assert sorted(line.split(" ", 2)[0] + " " + line.split(" ", 2)[2] for line in output[:-1]) == sorted(
        f"{i % 3} key-{i}=VALUE-{i}" for i in range(9))


@pytest.mark.slow
def test_the_examples_run_and_print_what_they_promise(store_url: str, tmp_path: Path) -> None:
    run_the_examples(Runner(store_url, tmp_path, confluent=False))


@pytest.mark.slow
@pytest.mark.kafka
def test_the_examples_are_confluent_kafka_programs(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The same checks, with confluent-kafka itself against the broker: what the examples print is what
    confluent-kafka's clients print."""
    run_the_examples(Runner(kafka_bootstrap, tmp_path, confluent=True))
