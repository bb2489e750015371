"""A worker that runs for months on the embedded store: its offsets stream (an entry per exactly-once
transaction, or per flush) is compacted, so neither the store nor a start's read grows with the worker's age,
and what the offsets say stays as it was."""

from __future__ import annotations

import pytest

from onceflow.connect import offsets as offsets_module
from onceflow.connect.offsets import StreamOffsets, canonical
from onceflow.connector.store import Store, TopicSettings, open_store


def partition(name: str) -> str:
    return canonical({"filename": name})


def test_superseded_source_offsets_are_cut_and_the_latest_kept(sqlite_url: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offsets_module, "COMPACT_AFTER", 10)
    monkeypatch.setattr(offsets_module, "MAINTAIN_EVERY_S", 0.0)
    store: Store = open_store(sqlite_url)
    kept = StreamOffsets(store, "offsets", 2, TopicSettings(), {"store.url": sqlite_url})
    for position in range(40):
        kept.write("src", {partition("a"): {"position": position}, partition("b"): {"position": -position}})
        kept.write("other", {partition("a"): {"line": position}})
    kept.write("src", {partition("gone"): {"position": 1}})
    kept.write("src", {partition("gone"): None})  # forgotten (REST reset): left out, and cut with the rest
    expected = {"src": {partition("a"): {"position": 39}, partition("b"): {"position": -39}},
                "other": {partition("a"): {"line": 39}}}
    held = sum(store.partition_state("offsets", p).end_offset - store.partition_state("offsets", p).start_offset
               for p in range(2))
    assert held <= 2 * (10 + 3)  # each partition: at most COMPACT_AFTER superseded entries beside the live ones
    assert {c: kept.offsets(c) for c in expected} == expected
    kept.write("src", {partition("a"): {"position": 40}})  # written after a compaction: still the latest
    kept.close()
    fresh = StreamOffsets(store, "offsets", 2, TopicSettings(), {"store.url": sqlite_url})
    assert fresh.offsets("src") == {partition("a"): {"position": 40}, partition("b"): {"position": -39}}
    assert fresh.offsets("other") == expected["other"]
    fresh.close()
    store.close()


def test_a_worker_whose_offsets_another_worker_compacted_reads_them_whole_again(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Distributed workers share the offsets stream: one that read part of it before another cut it reads what is
    left from the start, and what was forgotten in the cut part stays forgotten."""
    monkeypatch.setattr(offsets_module, "COMPACT_AFTER", 10)
    monkeypatch.setattr(offsets_module, "MAINTAIN_EVERY_S", 0.0)
    store: Store = open_store(sqlite_url)
    compacting = StreamOffsets(store, "offsets", 1, TopicSettings(), {"store.url": sqlite_url})
    behind = StreamOffsets(store, "offsets", 1, TopicSettings(), {"store.url": sqlite_url})
    compacting.write("src", {partition("gone"): {"position": 1}})
    assert behind.offsets("src") == {partition("gone"): {"position": 1}}
    compacting.write("src", {partition("gone"): None})
    for position in range(30):
        compacting.write("src", {partition("a"): {"position": position}})
    assert store.partition_state("offsets", 0).start_offset > 2  # what "behind" read is cut
    assert behind.offsets("src") == {partition("a"): {"position": 29}}
    compacting.close()
    behind.close()
    store.close()
