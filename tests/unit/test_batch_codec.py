"""The stored batch format: exact round trips, and any damage detected as CORRUPT_MESSAGE."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import Record
from onceflow.connector.store.batch_codec import decode, encode

maybe_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=8), maybe_bytes), min_size=1, max_size=3))
records = st.lists(
    st.builds(Record, maybe_bytes, maybe_bytes, headers, st.integers(min_value=-1, max_value=2**62)),
    min_size=1, max_size=40,
)


@given(records, st.integers(min_value=0, max_value=10**12))
def test_round_trip_keeps_every_field_and_assigns_dense_offsets(batch: list[Record], base: int) -> None:
    messages = decode(encode(batch, 10**6, "t[0]"), "t", 0, base)
    assert [m.offset() for m in messages] == list(range(base, base + len(batch)))
    assert [(m.key(), m.value(), m.headers() or None) for m in messages] == [
        (r.key, r.value, r.headers or None) for r in batch
    ]
    assert [m.timestamp()[1] for m in messages] == [max(r.timestamp, 0) for r in batch]


def test_decode_from_an_offset_inside_the_batch_skips_earlier_records() -> None:
    blob = encode([Record(b"k", b"%d" % i) for i in range(5)], 100, "t[0]")
    assert [m.value() for m in decode(blob, "t", 0, 10, from_offset=13)] == [b"3", b"4"]


@given(st.data())
def test_any_flipped_byte_is_reported_as_corrupt(data: st.DataObject) -> None:
    blob = bytearray(encode(data.draw(records), 10**6, "t[0]"))
    position = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    blob[position] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(KafkaException) as info:
        decode(bytes(blob), "t", 0, 0)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_another_exception(blob: bytes) -> None:
    try:
        decode(blob, "t", 0, 0)
    except KafkaException as exc:
        assert exc.code == ErrorCode.CORRUPT_MESSAGE


def test_truncated_batch_is_corrupt() -> None:
    blob = encode([Record(b"k", b"value")], 100, "t[0]")
    with pytest.raises(KafkaException, match="CORRUPT_MESSAGE"):
        decode(blob[:-1], "t", 0, 0)


def test_oversize_record_is_refused_naming_it() -> None:
    with pytest.raises(KafkaException) as info:
        encode([Record(None, b"x" * 10), Record(None, b"x" * 11)], 10, "t[3]")
    assert info.value.code == ErrorCode.MSG_SIZE_TOO_LARGE
    assert "t[3]: record 1 is 11 bytes" in str(info.value)


def test_values_that_are_not_bytes_are_invalid_records() -> None:
    with pytest.raises(KafkaException) as info:
        encode([Record(None, "text")], 100, "t[0]")  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_RECORD
