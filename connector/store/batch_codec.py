"""The stored form of a record batch: one blob per batch, checksummed, decoded without per-byte Python work.

Layout (little-endian)::

    magic u8 = 1 | crc32 u32 of everything after it | count u32 | body_len u32 |
    timestamps i64[count] | key_lens i32[count] | value_lens i32[count] | header_lens i32[count] |
    keys | values | headers

A length of -1 is a null key or value; a header length of 0 means no headers. Headers of one record are
``n u16, then n * (name_len u16, name utf-8, value_len i32, value)``. Any inconsistency is CORRUPT_MESSAGE.
"""

from __future__ import annotations

import operator
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, islice
from typing import Any, overload

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.message import Headers, Message
from onceflow.connector.store.contract import Record

MAGIC = 1
_HEADER = struct.Struct("<BIII")
_H_NAME = struct.Struct("<H")
_H_VALUE = struct.Struct("<i")
_BIG_ENDIAN = sys.byteorder == "big"
_BYTES_OR_NONE = {bytes, type(None)}
_FIELDS = tuple(operator.itemgetter(i) for i in range(4))  # key, value, headers, timestamp of a Record
_Columns = tuple[list[Any], ...]


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes a record counts against ``message.max.bytes``."""
    size = (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    if headers:
        size += sum(len(name) + (len(v) if v is not None else 0) for name, v in headers)
    return size


def _le(values: array[int]) -> bytes:
    if _BIG_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


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


def check(records: Sequence[Record], max_record_bytes: int, where: str) -> tuple[array[int], array[int]]:
    """Refuse a batch any backend would refuse: empty (INVALID_RECORD), keys, values or header values that are
    not bytes (INVALID_RECORD), a record over ``message.max.bytes`` (MSG_SIZE_TOO_LARGE). Returns the key and
    value lengths (-1 for null)."""
    return _checked(records, max_record_bytes, where)[1:3]


def _checked(records: Sequence[Record], max_record_bytes: int, where: str) -> tuple[
        _Columns, array[int], array[int], bool]:
    """:func:`check`, also returning the batch as columns (keys, values, headers, timestamps) and whether any
    record has headers: a batch is checked and encoded a column at a time, never a record at a time in Python."""
    if not records:
        fail(ErrorCode.INVALID_RECORD, f"{where}: an append needs at least one record")
    columns = tuple(list(map(field, records)) for field in _FIELDS)
    keys, values, headers, _ = columns
    try:
        key_lens = array("i", [-1 if k is None else len(k) for k in keys])
        value_lens = array("i", [-1 if v is None else len(v) for v in values])
        has_headers = any(headers)
        if has_headers or not _all_bytes(keys) or not _all_bytes(values):
            for r in records:
                _encode_headers(r[2])
                if not isinstance(r[0], bytes | None) or not isinstance(r[1], bytes | None):
                    raise TypeError(f"got {type(r[0]).__name__} key, {type(r[1]).__name__} value")
    except TypeError as exc:
        fail(ErrorCode.INVALID_RECORD, f"{where}: keys, values and header values must be bytes or None ({exc})")
    if max(max(key_lens), 0) + max(max(value_lens), 0) > max_record_bytes or has_headers:
        for i, r in enumerate(records):
            size = record_size(r[0], r[1], r[2])
            if size > max_record_bytes:
                fail(ErrorCode.MSG_SIZE_TOO_LARGE, f"{where}: record {i} is {size} bytes, over message.max.bytes "
                     f"({max_record_bytes})")
    return columns, key_lens, value_lens, has_headers


def _all_bytes(column: list[Any]) -> bool:
    """Every item bytes or None, in one pass over the distinct types rather than an isinstance per item."""
    return set(map(type, column)) <= _BYTES_OR_NONE


def _present(column: list[Any]) -> list[Any]:
    return [item for item in column if item is not None] if None in column else column


def encode(records: Sequence[Record], max_record_bytes: int, where: str) -> bytes:
    """Encode a non-empty batch after :func:`check`; its errors name the offending record."""
    (keys, values, headers, timestamps), key_lens, value_lens, has_headers = _checked(
        records, max_record_bytes, where)
    encoded_headers = [_encode_headers(h) for h in headers] if has_headers else []
    header_lens = array("i", [len(h) for h in encoded_headers]) if has_headers else array("i", bytes(4 * len(keys)))
    body = b"".join([
        _le(array("q", timestamps)),
        _le(key_lens),
        _le(value_lens),
        _le(header_lens),
        b"".join(_present(keys)),
        b"".join(_present(values)),
        *encoded_headers,
    ])
    header = _HEADER.pack(MAGIC, 0, len(records), len(body))
    crc = zlib.crc32(header[5:] + body)
    return _HEADER.pack(MAGIC, crc, len(records), len(body)) + body


def decode(blob: bytes, topic: str, partition: int, base_offset: int, from_offset: int = 0) -> list[Message]:
    """Decode a stored batch into messages at offsets >= ``from_offset``; CORRUPT_MESSAGE if damaged."""
    try:
        return _decode(blob, topic, partition, base_offset, from_offset)
    except KafkaException:
        raise
    except (ValueError, IndexError, struct.error, UnicodeDecodeError, OverflowError) as exc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{topic}[{partition}] batch at offset {base_offset}: {exc}")


def _decode(blob: bytes, topic: str, partition: int, base_offset: int, from_offset: int) -> list[Message]:
    where = f"{topic}[{partition}] batch at offset {base_offset}"
    if len(blob) < _HEADER.size:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: {len(blob)} bytes is shorter than a batch header")
    magic, crc, count, body_len = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: unknown batch magic {magic}")
    if body_len != len(blob) - _HEADER.size or zlib.crc32(memoryview(blob)[5:]) != crc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: checksum mismatch")
    view = memoryview(blob)
    pos = _HEADER.size
    timestamps = _from_le("q", view[pos : pos + 8 * count])
    pos += 8 * count
    key_lens = _from_le("i", view[pos : pos + 4 * count])
    value_lens = _from_le("i", view[pos + 4 * count : pos + 8 * count])
    header_lens = _from_le("i", view[pos + 8 * count : pos + 12 * count])
    pos += 12 * count
    key_sizes = [n if n > 0 else 0 for n in key_lens]  # -1 (null) takes no bytes
    value_sizes = [n if n > 0 else 0 for n in value_lens]
    key_end = pos + sum(key_sizes)
    value_end = key_end + sum(value_sizes)
    if value_end + sum(header_lens) != len(blob) or len(header_lens) != count:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: record lengths do not match the batch size")
    skip = max(from_offset - base_offset, 0)
    rows = islice(zip(accumulate(key_sizes, initial=pos), key_lens, accumulate(value_sizes, initial=key_end),
                      value_lens, accumulate(header_lens, initial=value_end), header_lens, timestamps, strict=False),
                  skip, None)
    return [Message(topic, partition, offset,
                    blob[ks : ks + kl] if kl >= 0 else None,
                    blob[vs : vs + vl] if vl >= 0 else None,
                    _decode_headers(blob[hs : hs + hl]) if hl else None,
                    ts)
            for offset, (ks, kl, vs, vl, hs, hl, ts) in enumerate(rows, base_offset + skip)]


class Encoded(Sequence[Record]):
    """Records still in their stored form (one or more checksummed batch blobs).

    Appending them to the embedded store copies the blobs instead of decoding and encoding every record (how a
    merge moves staged records); everything else sees an ordinary sequence of records, decoded on first use.
    """

    __slots__ = ("_decoded", "_length", "parts")

    def __init__(self, parts: Sequence[tuple[bytes, int]]) -> None:
        self.parts = tuple(parts)  # (blob, record count)
        self._length = sum(count for _, count in self.parts)
        self._decoded: list[Record] | None = None

    @classmethod
    def stored(cls, blob: bytes, where: str) -> Encoded:
        """Wrap a stored batch after checking its header and checksum (CORRUPT_MESSAGE if damaged)."""
        if len(blob) < _HEADER.size:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: {len(blob)} bytes is shorter than a batch header")
        magic, crc, count, body_len = _HEADER.unpack_from(blob, 0)
        if magic != MAGIC or body_len != len(blob) - _HEADER.size or zlib.crc32(memoryview(blob)[5:]) != crc:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: not an intact record batch")
        return cls([(blob, count)])

    @classmethod
    def join(cls, batches: Iterable[Encoded]) -> Encoded:
        return cls([part for batch in batches for part in batch.parts])

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        return self._records()[index]

    def __iter__(self) -> Iterator[Record]:  # Sequence's own __iter__ would call __getitem__ once per record
        return iter(self._records())

    def _records(self) -> list[Record]:
        if self._decoded is None:
            self._decoded = [Record(m.key(), m.value(), m.headers(), m.timestamp()[1])
                             for blob, _ in self.parts for m in decode(blob, "encoded records", 0, 0)]
        return self._decoded


def stored_parts(records: Sequence[Record], max_record_bytes: int, where: str) -> tuple[tuple[bytes, int], ...]:
    """The blobs (and their record counts) that store ``records``: as they are if already encoded."""
    if isinstance(records, Encoded):
        if not records.parts:
            fail(ErrorCode.INVALID_RECORD, f"{where}: an append needs at least one record")
        return records.parts
    return ((encode(records, max_record_bytes, where), len(records)),)
