"""A process SIGKILLed at each failpoint: the store stays consistent and holds what was acknowledged."""

from __future__ import annotations

import json
import signal
import uuid
from collections import defaultdict

import pytest

from onceflow.connector import AdminClient, KafkaException, NewTopic
from onceflow.connector.failpoints import FAILPOINTS
from onceflow.connector.store import Record, open_store, read_range
from tests.conftest import run_worker
from tests.crash.test_sink_crashes import SINK_FAILPOINTS
from tests.crash.test_txn_crashes import TXN_FAILPOINTS

pytestmark = pytest.mark.crash

BATCH = 25
APPEND_FAILPOINTS = [name for name in FAILPOINTS
                     if name.startswith("sqlite.append.") or name == "producer.before_delivery"]
# At these points the batch is already durable, so it may be there without having been acknowledged.
DURABLE_BEFORE_ACK = {"sqlite.append.after_commit", "producer.before_delivery"}


def killed(proc_returncode: int) -> bool:
    return proc_returncode == -signal.SIGKILL


def test_every_failpoint_has_a_crash_test() -> None:
    covered = set(APPEND_FAILPOINTS) | {"sqlite.scale.after_seal", "sqlite.writer.after_epoch_bump",
                                        "sqlite.group.after_commit_offsets"}
    covered |= set(TXN_FAILPOINTS) | {"producer.init.after_fence"}  # tests/crash/test_txn_crashes.py
    covered |= {"txn.commit.after_claim"}  # tests/crash/test_member_fencing.py
    covered |= set(SINK_FAILPOINTS) | {"kafka.cas.after_check"}  # tests/crash/test_sink_crashes.py
    # the crash matrix's Kafka cells:
    covered |= {"kafka.scale.before_seal", "kafka.txn.before_send", "kafka.txn.before_commit"}
    assert covered == set(FAILPOINTS)


@pytest.mark.parametrize("failpoint", APPEND_FAILPOINTS)
def test_kill_mid_append_leaves_whole_acknowledged_batches(sqlite_url: str, failpoint: str) -> None:
    AdminClient({"store.url": sqlite_url}).create_topics([NewTopic("t", 1)])["t"].result()
    proc = run_worker("appender", sqlite_url, "t", "0", "10", str(BATCH), failpoints=f"{failpoint}=crash@4",
                      check=False)
    assert killed(proc.returncode), proc.stderr
    acked = {a["batch"]: a["base_offset"] for a in map(json.loads, proc.stdout.splitlines()) if "batch" in a}
    assert sorted(acked) == [0, 1, 2]

    store = open_store(sqlite_url)
    end = store.partition_state("t", 0).end_offset
    log = list(read_range(store, "t", 0))  # decodes every batch: checksums hold
    assert [m.offset() for m in log] == list(range(end))
    batches: dict[int, list[int]] = defaultdict(list)
    for m in log:
        batch, index = map(int, (m.value() or b"").split(b":"))
        batches[batch].append(index)
    assert all(indexes == list(range(BATCH)) for indexes in batches.values()), "no partial batch"
    expected = {0, 1, 2, 3} if failpoint in DURABLE_BEFORE_ACK else {0, 1, 2}
    assert set(batches) == expected
    assert all(log[offset].value() == f"{b}:0".encode() for b, offset in acked.items())

    restarted = run_worker("appender", sqlite_url, "t", "100", "2", str(BATCH))
    assert [json.loads(line)["base_offset"] for line in restarted.stdout.splitlines()[1:]] == [end, end + BATCH]


def test_kill_mid_scale_leaves_the_stream_unscaled_and_scalable(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.create_stream("t", 2)
    proc = run_worker("store_op", sqlite_url, "scale", "t", "3", failpoints="sqlite.scale.after_seal=crash",
                      check=False)
    assert killed(proc.returncode)
    stream = store.describe_stream("t")
    assert len(stream.epochs) == 1 and not stream.current.sealed
    assert not store.partition_state("t", 0).sealed
    assert store.scale_stream("t", 3).current.partitions == (2, 3, 4)


@pytest.mark.kafka
def test_a_kafka_scale_killed_before_its_seal_is_sealed_by_the_next_client(kafka_bootstrap: str) -> None:
    """The scale wrote its new epoch, then died: the next client that looks seals the old epoch at its end,
    and an append the old epoch's writer makes is told PARTITION_SEALED, not acknowledged and hidden."""
    url = f"kafka://{kafka_bootstrap}/t{uuid.uuid4().hex[:12]}"
    store = open_store(url)
    store.create_stream("t", 2)
    old_writer = store.open_writer()
    old_writer.append("t", 0, [Record(None, b"before")])
    proc = run_worker("store_op", url, "scale", "t", "3", failpoints="kafka.scale.before_seal=crash", check=False)
    assert killed(proc.returncode), proc.stderr
    with pytest.raises(KafkaException, match="PARTITION_SEALED"):
        old_writer.append("t", 0, [Record(None, b"after")])
    stream = store.describe_stream("t")
    assert [e.sealed for e in stream.epochs] == [True, False]
    assert [m.value() for m in read_range(store, "t", 0)] == [b"before"]
    assert store.scale_stream("t", 4).current.partitions == (5, 6, 7, 8)
    store.close()


def test_kill_mid_epoch_bump_fences_nobody(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.create_stream("t", 1)
    current = store.open_writer("w")
    proc = run_worker("store_op", sqlite_url, "open_writer", "w", failpoints="sqlite.writer.after_epoch_bump=crash",
                      check=False)
    assert killed(proc.returncode)
    assert current.append("t", 0, [Record(None, b"still mine")]).base_offset == 0
    assert store.open_writer("w").epoch == current.epoch + 1


def test_kill_mid_offset_commit_keeps_the_previous_commit(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.create_stream("t", 1)
    store.commit_offsets("g", {("t", 0): 5})
    proc = run_worker("store_op", sqlite_url, "commit", "g", "t", "0", "9",
                      failpoints="sqlite.group.after_commit_offsets=crash", check=False)
    assert killed(proc.returncode)
    assert store.committed_offsets("g", [("t", 0)]) == {("t", 0): 5}
