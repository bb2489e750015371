"""The stored batch format: exact round trips, and any damage detected as CORRUPT_MESSAGE.

Every test runs twice: with the compiled codec (connector/store/_batch_codec.c, built by pip where a C compiler
is) and with the pure-Python one it falls back to; the compiled one must write the same bytes and read the same
records."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import Record, batch_codec
from onceflow.connector.store.batch_codec import Encoded, check, decode, encode
from tests.unit.compiled import compiled_then_python

COMPILED = batch_codec._compiled

maybe_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=8), maybe_bytes), min_size=1, max_size=3))
no_headers = st.sampled_from([None, []])
timestamps = st.integers(min_value=-1, max_value=2**62)
records = st.one_of(  # batches the compiled codec takes (no headers), and any batch
    st.lists(st.builds(Record, maybe_bytes, maybe_bytes, no_headers, timestamps), min_size=1, max_size=40),
    st.lists(st.builds(Record, maybe_bytes, maybe_bytes, headers, timestamps), min_size=1, max_size=40),
)


codec = compiled_then_python(batch_codec)


@given(records)
def test_the_compiled_codec_writes_what_the_python_one_writes(batch: list[Record]) -> None:
    if COMPILED is None:
        pytest.skip("the compiled codec is not built here")
    compiled = COMPILED.encode(batch, 10**6)
    batch_codec._compiled, saved = None, batch_codec._compiled
    try:
        python = encode(batch, 10**6, "t[0]")
    finally:
        batch_codec._compiled = saved
    if all(not r.headers for r in batch):
        assert compiled == python
    else:
        assert compiled is None  # headers: left to Python
    assert COMPILED.check(batch, 10**6) is (True if compiled is not None else None)
    assert COMPILED.columns(python, 0) == (None if compiled is None else (
        [r.key for r in batch], [r.value for r in batch], [r.timestamp for r in batch]))


@pytest.mark.parametrize("odd", [
    Record(bytearray(b"k"), b"v"),  # type: ignore[arg-type]
    Record(b"k", "v"),  # type: ignore[arg-type]
    Record(b"k", b"v", None, 2**63),
    Record(b"k", b"v", None, True),
    Record(b"k", b"v", [("h", b"x")]),
    Record(b"k", b"x" * 101),
    (b"k", b"v", None),
    type("Reversed", (tuple,), {"__iter__": lambda self: reversed(tuple.__iter__(self))})((b"k", b"v", None, 1)),
])
def test_what_the_compiled_codec_does_not_take_is_left_to_python(odd: object) -> None:
    if COMPILED is None:
        pytest.skip("the compiled codec is not built here")
    assert COMPILED.encode([Record(b"k", b"v"), odd], 100) is None
    assert COMPILED.check([Record(b"k", b"v"), odd], 100) is None
    assert COMPILED.encode([], 100) is None


def test_what_the_compiled_codec_is_given_in_an_unusual_form_is_left_to_python() -> None:
    """A generator is read once (by Python, not used up by C), a limit that is not a plain int is Python's."""
    if COMPILED is None:
        pytest.skip("the compiled codec is not built here")
    batch = [Record(b"k", b"v", None, 1)]
    assert COMPILED.encode(iter(batch), 100) is None
    assert COMPILED.encode(batch, 100.0) is None
    assert COMPILED.encode(batch, 2**64) is None
    assert decode(encode(iter([Record(b"k", b"v", [("h", b"x")], 1)]), 100, "t[0]"), "t", 0, 0)[0].headers() == [
        ("h", b"x")]


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


@pytest.mark.parametrize(("batch", "code"), [
    ([Record(None, b"x" * 10), Record(None, b"x" * 11)], ErrorCode.MSG_SIZE_TOO_LARGE),
    ([Record(None, b"x"), Record(None, "x")], ErrorCode.INVALID_RECORD),  # type: ignore[arg-type]
    ([], ErrorCode.INVALID_RECORD),
])
def test_a_check_refuses_what_an_append_would(batch: list[Record], code: ErrorCode) -> None:
    with pytest.raises(KafkaException) as info:
        batch_codec.check(batch, 10, "t[3]")
    assert info.value.code == code
    batch_codec.check(batch[:1], 10, "t[3]") if batch else None


def test_values_that_are_not_bytes_are_invalid_records() -> None:
    with pytest.raises(KafkaException) as info:
        encode([Record(None, "text")], 100, "t[0]")  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_RECORD


@given(st.lists(records, min_size=1, max_size=3))
def test_encoded_batches_read_back_as_the_records_appended(batches: list[list[Record]]) -> None:
    """What a merge moves (stored batches) reads back field for field, a missing timestamp (-1) included."""
    encoded = Encoded([(encode(batch, 10**6, "t[0]"), len(batch)) for batch in batches])
    expected = [Record(r.key, r.value, r.headers or None, r.timestamp) for batch in batches for r in batch]
    assert list(encoded) == expected
    assert all(type(r) is Record for r in encoded)


@given(records, st.data())
def test_decode_from_any_offset_is_the_tail_of_the_whole_batch(batch: list[Record], data: st.DataObject) -> None:
    blob = encode(batch, 10**6, "t[0]")
    start = data.draw(st.integers(min_value=0, max_value=len(batch)))
    whole = decode(blob, "t", 0, 100)
    tail = decode(blob, "t", 0, 100, from_offset=100 + start)
    assert [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in tail] == [
        (m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in whole[start:]]


def test_a_damaged_encoded_batch_is_corrupt_when_its_records_are_read() -> None:
    blob = bytearray(encode([Record(b"k", b"value")], 100, "t[0]"))
    blob[-1] ^= 1
    with pytest.raises(KafkaException) as info:
        list(Encoded([(bytes(blob), 1)]))
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(KafkaException) as stored:
        Encoded.stored(bytes(blob), "staged")
    assert stored.value.code == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("timestamp", [2**63, -(2**63) - 1, None])
def test_a_timestamp_that_is_no_64_bit_integer_is_an_invalid_record(timestamp: object) -> None:
    """Refused by the check every backend makes before writing: on Kafka, confluent-kafka refused such a timestamp
    with an OverflowError midway through a batch, the records before it sent."""
    for refuse in (encode, check):
        with pytest.raises(KafkaException) as info:
            refuse([Record(b"k", b"v"), Record(b"k", b"v", None, timestamp)], 100, "t[2]")  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.INVALID_RECORD
        assert "t[2]: timestamps" in str(info.value)


def test_a_key_that_is_not_bytes_is_named_with_its_record() -> None:
    with pytest.raises(KafkaException) as info:
        encode([Record(b"k", b"v"), Record(7, b"v")], 100, "t[0]")  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_RECORD
    assert "record 1 has a int key" in str(info.value)


def test_records_at_hand_stand_in_for_their_blob_only_when_they_are_as_many() -> None:
    """A committer merging its own transaction hands the records its COMMIT's blob was encoded from, so they are
    not decoded again; records that cannot be the blob's (another count) are ignored, and the blob is read."""
    batch = [Record(b"k", b"v", None, 5), Record(None, b"w", [("h", b"x")], 6)]
    blob = encode(batch, 100, "t[0]")
    at_hand = Encoded.join([Encoded.stored(blob, "t[0]", batch), Encoded.stored(blob, "t[0]", batch)])
    assert all(got is given for got, given in zip(at_hand, batch * 2, strict=True))
    not_its_own = Encoded.stored(blob, "t[0]", batch[:1])
    assert list(not_its_own) == [Record(b"k", b"v", None, 5), Record(None, b"w", [("h", b"x")], 6)]
    assert list(Encoded.join([not_its_own, Encoded.stored(blob, "t[0]", batch)])) == batch * 2


@given(st.integers(min_value=0, max_value=6), st.binary(max_size=200))
def test_any_batch_with_a_valid_checksum_reads_the_same_in_both_codecs(count: int, body: bytes) -> None:
    """Damage a checksum does not catch (a writer's bug): lengths that do not add up are CORRUPT_MESSAGE in both
    codecs, and whatever does add up reads the same."""
    header_lens = bytes(4 * count)
    body = body[: 16 * count].ljust(16 * count, b"\0") + header_lens + body[16 * count :]
    blob = batch_codec._HEADER.pack(1, 0, count, len(body)) + body
    blob = batch_codec._HEADER.pack(1, batch_codec.zlib.crc32(blob[5:]), count, len(body)) + body

    def read() -> object:
        try:
            return [(m.key(), m.value(), m.timestamp()) for m in decode(blob, "t", 0, 0)]
        except KafkaException as exc:
            return exc.code

    first = read()
    batch_codec._compiled, saved = None, batch_codec._compiled
    try:
        assert read() == first
    finally:
        batch_codec._compiled = saved


def test_decoding_holds_nothing_once_its_messages_are_gone() -> None:
    topic = "".join(["to", "pic"])  # a str of its own, to count its references
    blob = encode([Record(b"k", b"v%d" % i, None, i) for i in range(100)], 10**6, "t[0]")
    before = sys.getrefcount(topic)
    messages = decode(blob, topic, 0, 0)
    assert sys.getrefcount(topic) == before + 100
    assert [(m.topic(), m.offset(), m.value()) for m in messages[:2]] == [("topic", 0, b"v0"), ("topic", 1, b"v1")]
    del messages
    assert sys.getrefcount(topic) == before
