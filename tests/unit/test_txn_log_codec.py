"""The commit log's stored entries: round trips, unbatched entries still readable, and damaged or foreign
entries refused with a typed error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.connector import ErrorCode, KafkaException
from onceflow.schemas.txn_log_pb2 import Participant, TransactionMetadataEntry
from onceflow.txn import log_codec

Kind = TransactionMetadataEntry

control_records = st.one_of(
    st.builds(lambda ts, timeout, owner: Kind(kind=Kind.BEGIN, timestamp_ms=ts, timeout_ms=timeout, owner=owner),
              st.integers(0, 2**62), st.integers(1, 2**40), st.text(max_size=20)),
    st.builds(lambda txn_id, writers: Kind(kind=Kind.COMMIT, txn_id=txn_id, participants=[
        Participant(writer_id=w, first_offset=1, last_offset=2, last_sequence=3) for w in writers]),
        st.from_regex(r"\A[0-9]{1,6}\.[0-9]{1,3}\Z"), st.lists(st.text(max_size=8), max_size=4)),
    st.builds(lambda txn_id, reason: Kind(kind=Kind.ABORT, txn_id=txn_id, reason=reason),
              st.from_regex(r"\A[0-9]{1,6}\.[0-9]{1,3}\Z"), st.sampled_from(["requested", "timeout", "fenced"])),
)


def code_of(entry: bytes) -> ErrorCode:
    with pytest.raises(KafkaException) as info:
        log_codec.decode(entry, "test entry")
    return info.value.code


@given(st.lists(control_records, min_size=1, max_size=20))
def test_batched_entries_round_trip(records: list[TransactionMetadataEntry]) -> None:
    entry = log_codec.encode_batched(records)
    assert entry[:4] == b"\x0e\x01\x00\x01"  # PIP-160's magic, then version 1
    assert log_codec.decode(entry, "e") == records


@given(control_records)
def test_unbatched_entries_stay_readable(record: TransactionMetadataEntry) -> None:
    assert log_codec.decode(log_codec.encode_unbatched(record), "e") == [record]


@given(st.lists(control_records, min_size=1, max_size=5), st.data())
def test_every_truncation_is_refused_as_corrupt(records: list[TransactionMetadataEntry], data: st.DataObject) -> None:
    entry = log_codec.encode_batched(records)
    cut = data.draw(st.integers(0, len(entry) - 1))
    assert code_of(entry[:cut]) == ErrorCode.CORRUPT_MESSAGE


def test_an_unknown_version_is_refused_as_unsupported() -> None:
    entry = log_codec.encode_batched([Kind(kind=Kind.ABORT, txn_id="1.0")])
    assert code_of(struct.pack(">HH", log_codec.MAGIC, 2) + entry[4:]) == ErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize("entry", [b"", b"\xca\xfe\x00\x01rest", b"\x0f\x01\x00\x01", b"\x08\x07"],
                         ids=["empty", "foreign magic", "near magic", "unknown kind"])
def test_foreign_or_damaged_entries_are_refused_as_corrupt(entry: bytes) -> None:
    assert code_of(entry) == ErrorCode.CORRUPT_MESSAGE


def test_inconsistent_control_records_are_refused() -> None:
    begin_with_id = Kind(kind=Kind.BEGIN, txn_id="1.0", timeout_ms=5)
    commit_without_id = Kind(kind=Kind.COMMIT)
    for record in (begin_with_id, commit_without_id, Kind(kind=Kind.BEGIN, timeout_ms=0)):
        assert code_of(log_codec.encode_batched([record])) == ErrorCode.CORRUPT_MESSAGE


@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_records_or_a_typed_error(entry: bytes) -> None:
    try:
        log_codec.decode(entry, "fuzz")
    except KafkaException as exc:
        assert exc.code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNSUPPORTED_VERSION)
