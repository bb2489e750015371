"""Key ranges: how keys map to the partitions of an epoch, and which partitions precede which after a scale.

Each epoch splits the 32-bit key-hash space into equal ranges, one per partition (as Pravega's segments).
A partition of a new epoch *succeeds* every partition of the previous epoch whose range overlaps its own;
a reader finishes the predecessors before reading a successor, so records of one key stay in order across a
scale.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

HASH_SPACE = 1 << 32


def key_hash(key: bytes) -> int:
    """Stable 32-bit hash of a key, the same in every process and on every backend."""
    return zlib.crc32(key)


def index_for_key(key: bytes, partition_count: int) -> int:
    """Index (0-based, within an epoch) of the partition whose range holds ``key``."""
    return (zlib.crc32(key) * partition_count) >> 32  # key_hash, inlined: this runs for every keyed record


def partition_for_key(key: bytes, partitions: Sequence[int]) -> int:
    """The partition, of an epoch's ``partitions`` (in order), whose range holds ``key``."""
    return partitions[index_for_key(key, len(partitions))]


def key_range(index: int, partition_count: int) -> tuple[int, int]:
    """Half-open hash range [lo, hi) covered by partition ``index`` of an epoch of ``partition_count``."""
    lo = -((-index * HASH_SPACE) // partition_count)
    hi = -((-(index + 1) * HASH_SPACE) // partition_count)
    return lo, hi


def overlapping(index: int, count: int, other_count: int) -> list[int]:
    """Indices in an epoch of ``other_count`` partitions whose ranges overlap partition ``index`` of ``count``."""
    lo, hi = key_range(index, count)
    found = []
    for other in range(other_count):
        other_lo, other_hi = key_range(other, other_count)
        if other_lo < hi and lo < other_hi:
            found.append(other)
    return found
