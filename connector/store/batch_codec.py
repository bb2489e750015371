"""The stored form of a record batch: one blob per batch, checksummed, decoded without per-byte Python work.

Layout (little-endian)::

    magic u8 = 1 | crc32 u32 of everything after it | count u32 | body_len u32 |
    timestamps i64[count] | key_lens i32[count] | value_lens i32[count] | header_lens i32[count] |
    keys | values | headers

A length of -1 is a null key or value; a header length of 0 means no headers. Headers of one record are
``n u16, then n * (name_len u16, name utf-8, value_len i32, value)``. Any inconsistency is CORRUPT_MESSAGE.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, count, repeat
from typing import Any, NamedTuple, overload

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.message import Headers, Message
from onceflow.connector.store.contract import Record, RecordFields

try:  # the common case in C, where pip found a compiler (see _batch_codec.c); else this module does it all
    from onceflow.connector.store import _batch_codec as _compiled  # type: ignore[attr-defined]
except ImportError:
    _compiled = None

MAGIC = 1
_HEADER = struct.Struct("<BIII")
_H_NAME = struct.Struct("<H")
_H_VALUE = struct.Struct("<i")
_BIG_ENDIAN = sys.byteorder == "big"
_BYTES = {bytes}
_BYTES_OR_NONE = {bytes, type(None)}


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes a record counts against ``message.max.bytes``."""
    size = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    if headers:
        size += sum(len(name) + (len(v) if v is not None else 0) for name, v in headers)
    return size


def _from_le(typecode: str, data: memoryview) -> array[int]:
    values = array(typecode)
    values.frombytes(data)
    if _BIG_ENDIAN:
        values.byteswap()
    return values


def _encode_headers(headers: Headers | None) -> bytes:
    if not headers:
        return b""
    parts = [_H_NAME.pack(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts += [_H_NAME.pack(len(raw)), raw]
        if value is None:
            parts.append(_H_VALUE.pack(-1))
        else:
            parts += [_H_VALUE.pack(len(value)), value]
    return b"".join(parts)


def _decode_headers(data: bytes) -> Headers:
    (count,) = _H_NAME.unpack_from(data, 0)
    pos = 2
    headers: Headers = []
    for _ in range(count):
        (name_len,) = _H_NAME.unpack_from(data, pos)
        name = data[pos + 2 : pos + 2 + name_len].decode()
        pos += 2 + name_len
        (value_len,) = _H_VALUE.unpack_from(data, pos)
        pos += 4
        if value_len < 0:
            headers.append((name, None))
        else:
            headers.append((name, data[pos : pos + value_len]))
            pos += value_len
    if pos != len(data):
        raise ValueError("trailing bytes after headers")
    return headers


def check(records: Sequence[RecordFields], max_record_bytes: int, where: str) -> None:
    """Refuse a batch any backend would refuse: empty (INVALID_RECORD), keys, values or header values that are
    not bytes, timestamps that are not 64-bit integers (INVALID_RECORD), a record over ``message.max.bytes``
    (MSG_SIZE_TOO_LARGE)."""
    if _compiled is None or not _compiled.check(records, max_record_bytes):
        _checked(records, max_record_bytes, where)


class _Checked(NamedTuple):
    """A checked batch as columns: a batch is checked and encoded a column at a time, never a record at a time in
    Python."""

    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    key_lens: list[int]  # -1 for null
    value_lens: list[int]
    headers: list[bytes] | None  # each record's encoded headers; None if no record has any
    timestamps: bytes  # packed, little-endian i64s


def _checked(records: Sequence[RecordFields], max_record_bytes: int, where: str) -> _Checked:
    """:func:`check`, returning the batch as columns."""
    if not records:
        fail(ErrorCode.INVALID_RECORD, f"{where}: an append needs at least one record")
    keys, values, headers, timestamps = zip(*records, strict=True)
    try:
        key_lens, value_lens = _lengths(keys, "key"), _lengths(values, "value")
        encoded_headers = [_encode_headers(h) for h in headers] if any(headers) else None
    except TypeError as exc:
        fail(ErrorCode.INVALID_RECORD, f"{where}: keys, values and header values must be bytes or None ({exc})")
    if max(max(key_lens), 0) + max(max(value_lens), 0) > max_record_bytes or encoded_headers:
        for i, r in enumerate(records):
            size = record_size(r[0], r[1], r[2])
            if size > max_record_bytes:
                fail(ErrorCode.MSG_SIZE_TOO_LARGE, f"{where}: record {i} is {size} bytes, over message.max.bytes "
                     f"({max_record_bytes})")
    try:  # Kafka's client refused one out of range midway through a batch, with an OverflowError
        packed = _pack("q", timestamps, len(timestamps))
    except struct.error as exc:
        fail(ErrorCode.INVALID_RECORD, f"{where}: timestamps must be 64-bit integers ({exc})")
    return _Checked(keys, values, key_lens, value_lens, encoded_headers, packed)


def _lengths(column: Sequence[Any], what: str) -> list[int]:
    """Each item's length, -1 for None; TypeError naming the first item that is neither bytes nor None. The
    distinct types decide, in one pass, rather than a test per item."""
    types = set(map(type, column))
    if types == _BYTES:
        return list(map(len, column))
    if not types <= _BYTES_OR_NONE:
        for i, item in enumerate(column):  # bytes subclasses pass
            if not isinstance(item, bytes | None):
                raise TypeError(f"record {i} has a {type(item).__name__} {what}")
    return [-1 if item is None else len(item) for item in column]


def _pack(typecode: str, values: Iterable[int], count: int) -> bytes:
    return struct.pack(f"<{count}{typecode}", *values)


def encode(records: Sequence[RecordFields], max_record_bytes: int, where: str) -> bytes:
    """Encode a non-empty batch after :func:`check`; its errors name the offending record. Timestamps that are not
    64-bit integers are INVALID_RECORD."""
    if _compiled is not None:
        blob: bytes | None = _compiled.encode(records, max_record_bytes)
        if blob is not None:
            return blob
    batch = _checked(records, max_record_bytes, where)
    count = len(batch.keys)
    body = b"".join([
        batch.timestamps,
        _pack("i", batch.key_lens, count),
        _pack("i", batch.value_lens, count),
        _pack("i", map(len, batch.headers), count) if batch.headers else bytes(4 * count),
        *filter(None, batch.keys),  # a null takes no bytes (nor does an empty one)
        *filter(None, batch.values),
        *(batch.headers or ()),
    ])
    crc = zlib.crc32(body, zlib.crc32(_HEADER.pack(MAGIC, 0, count, len(body))[5:]))
    return _HEADER.pack(MAGIC, crc, count, len(body)) + body


def decode(blob: bytes, topic: str, partition: int, base_offset: int, from_offset: int = 0) -> list[Message]:
    """Decode a stored batch into messages at offsets >= ``from_offset``; CORRUPT_MESSAGE if damaged."""
    skip = max(from_offset - base_offset, 0)
    where = f"{topic}[{partition}] batch at offset {base_offset}"
    intact = _check_intact(blob, where)  # the record count
    if _compiled is not None:  # the common case, made in C (see _batch_codec.c): a batch without headers
        try:
            made: list[Message] | None = _compiled.messages(blob, skip, topic, partition, base_offset + skip,
                                                            Message)
        except ValueError as exc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: {exc}")
        if made is not None:
            return made
    keys, values, headers, timestamps = _columns(blob, where, skip, intact)
    return list(map(Message, repeat(topic), repeat(partition), count(base_offset + skip), keys, values, headers,
                    timestamps))


def _check_intact(blob: bytes, where: str) -> int:
    """The record count of a stored batch whose header and checksum hold; CORRUPT_MESSAGE if they do not."""
    if len(blob) < _HEADER.size:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: {len(blob)} bytes is shorter than a batch header")
    magic, crc, count, body_len = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: unknown batch magic {magic}")
    if body_len != len(blob) - _HEADER.size or zlib.crc32(memoryview(blob)[5:]) != crc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: checksum mismatch")
    return int(count)


_Rows = tuple[list[bytes | None], list[bytes | None], Iterable[Headers | None], Sequence[int]]


def _columns(blob: bytes, where: str, skip: int, count: int | None = None) -> _Rows:
    """The keys, values, headers and timestamps of a stored batch's records from the ``skip``-th on, each a column
    (the one reader of the layout, for messages and records alike); CORRUPT_MESSAGE if the batch is damaged.
    ``count``: the batch's record count, its header and checksum already checked."""
    try:
        return _split(blob, where, skip, count)
    except KafkaException:
        raise
    except (ValueError, IndexError, struct.error, UnicodeDecodeError, OverflowError) as exc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: {exc}")


def _split(blob: bytes, where: str, skip: int, count: int | None) -> _Rows:
    """:func:`_columns`, where a damaged batch may also raise what :func:`_columns` turns into CORRUPT_MESSAGE."""
    if count is None:
        count = _check_intact(blob, where)
    if _compiled is not None:
        columns = _compiled.columns(blob, skip)
        if columns is not None:
            keys, values, timestamps = columns
            return keys, values, repeat(None, count - skip), timestamps
    view = memoryview(blob)
    pos = _HEADER.size
    timestamps = _from_le("q", view[pos : pos + 8 * count])
    pos += 8 * count
    key_lens = _from_le("i", view[pos : pos + 4 * count])
    value_lens = _from_le("i", view[pos + 4 * count : pos + 8 * count])
    header_lens = _from_le("i", view[pos + 8 * count : pos + 12 * count])
    keys, key_end = _items(blob, key_lens, pos + 12 * count, skip)
    values, value_end = _items(blob, value_lens, key_end, skip)
    if value_end + sum(header_lens) != len(blob) or len(header_lens) != count:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: record lengths do not match the batch size")
    headers: Iterable[Headers | None] = repeat(None, count - skip)
    if any(header_lens):
        starts = list(accumulate(header_lens, initial=value_end))
        headers = [_decode_headers(blob[start:end]) if start != end else None
                   for start, end in zip(starts[skip:], starts[skip + 1 :], strict=False)]
    return keys, values, headers, timestamps[skip:]


def _items(blob: bytes, lengths: array[int], start: int, skip: int) -> tuple[list[bytes | None], int]:
    """The keys (or values) of a batch from the ``skip``-th on, stored back to back from ``start`` with
    ``lengths`` (negative: null, taking no bytes), and where the next column starts."""
    nullable = min(lengths, default=0) < 0
    starts = list(accumulate([n if n > 0 else 0 for n in lengths] if nullable else lengths, initial=start))
    items: list[bytes | None] = [blob[a:b] for a, b in zip(starts[skip:], starts[skip + 1 :], strict=False)]
    if nullable:
        items = [None if n < 0 else item for item, n in zip(items, lengths[skip:], strict=True)]
    return items, starts[-1]


class Encoded(Sequence[RecordFields]):
    """Records still in their stored form (one or more checksummed batch blobs).

    Appending them to the embedded store copies the blobs instead of decoding and encoding every record (how a
    merge moves staged records); everything else sees an ordinary sequence of records, decoded on first use.
    """

    __slots__ = ("_decoded", "_length", "parts")

    def __init__(self, parts: Sequence[tuple[bytes, int]], decoded: list[RecordFields] | None = None) -> None:
        self.parts = tuple(parts)  # (blob, record count)
        self._length = sum(count for _, count in self.parts)
        self._decoded = decoded

    @classmethod
    def stored(cls, blob: bytes, where: str, decoded: Sequence[RecordFields] | None = None) -> Encoded:
        """Wrap a stored batch after checking its header and checksum (CORRUPT_MESSAGE if damaged); ``decoded``:
        the records it was encoded from, if they are at hand (then they are not decoded again)."""
        count = _check_intact(blob, where)
        return cls([(blob, count)], list(decoded) if decoded is not None and len(decoded) == count else None)

    @classmethod
    def join(cls, batches: Iterable[Encoded]) -> Encoded:
        batches = list(batches)
        decoded = None
        if all(batch._decoded is not None for batch in batches):
            decoded = [record for batch in batches for record in batch._decoded or ()]
        return cls([part for batch in batches for part in batch.parts], decoded)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> RecordFields: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RecordFields]: ...

    def __getitem__(self, index: int | slice) -> RecordFields | Sequence[RecordFields]:
        return self._records()[index]

    def __iter__(self) -> Iterator[RecordFields]:  # Sequence's own __iter__ would call __getitem__ once per record
        return iter(self._records())

    def _records(self) -> list[RecordFields]:
        if self._decoded is None:
            self._decoded = []
            for blob, _ in self.parts:  # tuple.__new__ is Record._make without its Python-level call
                rows = zip(*_columns(blob, "encoded records", 0), strict=True)
                self._decoded += map(tuple.__new__, repeat(Record), rows)
        return self._decoded


def stored_parts(records: Sequence[RecordFields], max_record_bytes: int, where: str) -> tuple[tuple[bytes, int], ...]:
    """The blobs (and their record counts) that store ``records``: as they are if already encoded."""
    if isinstance(records, Encoded):
        if not records.parts:
            fail(ErrorCode.INVALID_RECORD, f"{where}: an append needs at least one record")
        return records.parts
    return ((encode(records, max_record_bytes, where), len(records)),)
