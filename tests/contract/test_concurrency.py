"""Real processes against one store: CAS races, fenced zombies, idempotent retries, consumer groups."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import pytest

from onceflow.connector import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from onceflow.connector.store import open_store, read_range
from tests.conftest import ABORTS_VISIBLE_ON_TANSU, finish, next_line, run_worker, skip_on_tansu, start_worker

pytestmark = pytest.mark.multiprocess


def lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def read_partition(store_url: str, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    with contextlib.closing(open_store(store_url)) as store:
        return [(m.offset(), m.value()) for m in read_range(store, topic, partition)]  # type: ignore[misc]


def create(store_url: str, topic: str, partitions: int) -> None:
    with contextlib.closing(AdminClient({"store.url": store_url})) as admin:
        admin.create_topics([NewTopic(topic, partitions)])[topic].result()


def fill(store_url: str, topic: str, partitions: int, records: int) -> None:
    """Create ``topic`` and produce ``records`` keyed records to it."""
    create(store_url, topic, partitions)
    with contextlib.closing(Producer({"store.url": store_url})) as producer:
        for i in range(records):
            producer.produce(topic, b"%d" % i, key=b"%d" % i)
        producer.flush()


def test_eight_processes_racing_cas_appends_have_one_winner_per_offset(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    skip_on_tansu(store_url, request, ABORTS_VISIBLE_ON_TANSU)
    create(store_url, "race", 1)
    racers = [start_worker("cas_racer", store_url, "race", f"r{i}", "60") for i in range(8)]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes += lines(out)
    wins = [o for o in outcomes if o["error"] is None]
    refusals = [o for o in outcomes if o["error"] is not None]
    assert {o["error"] for o in refusals} <= {"CAS_MISMATCH"}, [o for o in refusals if o["error"] != "CAS_MISMATCH"]
    assert all(o["offset"] == o["expected"] for o in wins)
    winners_per_expectation = Counter(o["expected"] for o in wins)
    assert max(winners_per_expectation.values()) == 1
    log = read_partition(store_url, "race")
    assert [offset for offset, _ in log] == sorted(o["offset"] for o in wins)  # every record is a winner
    if store_url.startswith("sqlite://"):  # dense offsets: on Kafka each CAS's commit marker takes one
        assert [offset for offset, _ in log] == list(range(len(wins)))
    landed = {value.decode(): offset for offset, value in log}
    assert all(landed[o["value"]] == o["offset"] for o in wins)  # type: ignore[index]
    assert not any(o["value"] in landed for o in refusals)


def test_a_fenced_zombie_process_never_lands_a_write(store_url: str, request: pytest.FixtureRequest) -> None:
    skip_on_tansu(store_url, request, ABORTS_VISIBLE_ON_TANSU)
    create(store_url, "audit", 1)
    zombie = start_worker("appender", store_url, "audit", "0", "100000", "10", "audit-writer")
    assert zombie.stdout is not None
    acked = []
    for line in zombie.stdout:  # let the zombie get some batches in first
        record = json.loads(line)
        acked.append(record)
        if len(acked) >= 6:
            break
    successor = run_worker("appender", store_url, "audit", "1000000", "3", "10", "audit-writer")
    rest, _ = finish(zombie)
    acked += lines(rest)
    final = acked[-1]
    assert final.get("error") == ["PRODUCER_FENCED"], final
    zombie_batches = {a["batch"] for a in acked if "base_offset" in a}
    log = read_partition(store_url, "audit")
    landed = Counter(int(value.split(b":")[0]) for _, value in log)
    assert {b for b in landed if b < 1_000_000} == zombie_batches  # nothing unacknowledged landed
    assert all(landed[b] == 10 for b in landed)
    first_successor = min(offset for offset, value in log if int(value.split(b":")[0]) >= 1_000_000)
    assert all(int(v.split(b":")[0]) >= 1_000_000 for o, v in log if o >= first_successor)
    assert len(lines(successor.stdout)) == 4


@pytest.mark.parametrize("failpoints", [
    "sqlite.append.after_commit=raise*2",  # landed, but the producer was told it failed: the retry must not duplicate
    "sqlite.append.before_commit=raise*2",  # rolled back: the retry must land it once
    "producer.before_delivery=raise*1",  # raised after the append: no delivery, nothing duplicated
])
def test_retried_appends_land_exactly_once(sqlite_url: str, failpoints: str) -> None:
    store_url = sqlite_url  # the failpoints are the embedded store's
    create(store_url, "retry", 1)
    proc = run_worker("appender", store_url, "retry", "0", "5", "20", failpoints=failpoints, check=False)
    acked = [a for a in lines(proc.stdout) if "base_offset" in a]
    log = read_partition(store_url, "retry")
    values = [v for _, v in log]
    assert len(values) == len(set(values))  # never a duplicate
    if failpoints.startswith("producer."):
        assert proc.returncode != 0 and len(values) == 20  # the first batch landed once, then the worker failed
    else:
        assert proc.returncode == 0, proc.stderr
        assert [a["base_offset"] for a in acked] == [0, 20, 40, 60, 80]
        assert values == [f"{b}:{i}".encode() for b in range(5) for i in range(20)]


@pytest.mark.slow
def test_a_group_of_three_processes_consumes_each_record_once_as_members_come_and_go(
        store_url: str, request: pytest.FixtureRequest) -> None:
    skip_on_tansu(store_url, request, "on Tansu the two members that join while the first holds every partition "
                  "sometimes never get one, not even after the first leaves (about 1 run in 5, cause not found; "
                  "integration/PEER.md); the same members come and go on the embedded store")
    fill(store_url, "work", 6, 1200)
    first = start_worker("group_member", store_url, "work", "g", "400")  # leaves after 400 records
    seen = [next_line(first) for _ in range(50)]
    others = [start_worker("group_member", store_url, "work", "g", "100000") for _ in range(2)]
    outputs = [finish(first)] + [finish(o) for o in others]
    for proc, (_, err) in zip([first, *others], outputs, strict=True):
        assert proc.returncode == 0, err
    for out, _ in outputs:
        seen += lines(out)
    positions = Counter((s["partition"], s["offset"]) for s in seen)
    assert sum(positions.values()) == 1200, "every record processed"
    assert max(positions.values()) == 1, [p for p, n in positions.items() if n > 1][:5]
    with contextlib.closing(Consumer({"store.url": store_url, "group.id": "g"})) as consumer:
        committed = consumer.committed([TopicPartition("work", p) for p in range(6)])
    assert sum(tp.offset for tp in committed) == 1200


@pytest.mark.slow
def test_a_killed_member_loses_no_record(store_url: str) -> None:
    fill(store_url, "work", 4, 800)
    victim = start_worker("group_member", store_url, "work", "k", "100000")
    seen = [next_line(victim) for _ in range(100)]
    survivor = start_worker("group_member", store_url, "work", "k", "100000")
    seen += [next_line(victim) for _ in range(20)]  # still mid-stream: kill without warning
    victim.kill()
    seen += lines(finish(victim)[0])
    out, err = finish(survivor)
    assert survivor.returncode == 0, err
    seen += lines(out)
    positions = Counter((s["partition"], s["offset"]) for s in seen)
    assert set(positions) == {(p, o) for p in range(4) for o in range(_end(store_url, p))}
    # Only the record in flight when the victim died (delivered, not yet committed) may come twice.
    assert sum(n - 1 for n in positions.values()) <= 4


def _end(store_url: str, partition: int) -> int:
    with contextlib.closing(open_store(store_url)) as store:
        return store.partition_state("work", partition).end_offset


def test_workers_exit_cleanly_on_bad_store_url() -> None:
    proc = run_worker("appender", "postgres://nowhere", "t", "0", "1", "1", check=False)
    assert proc.returncode != 0 and "INVALID_CONFIG" in proc.stderr


def test_new_records_after_an_append_that_failed_but_landed_are_not_taken_for_its_retry(sqlite_url: str) -> None:
    create(sqlite_url, "giveup", 1)
    proc = run_worker("give_up_then_append", sqlite_url, "giveup", failpoints="sqlite.append.after_commit=raise@1")
    assert json.loads(proc.stdout) == {"a": "_FS", "b": 1}  # "a" landed at 0 although its append raised
    assert [v for _, v in read_partition(sqlite_url, "giveup")] == [b"a", b"b"]
