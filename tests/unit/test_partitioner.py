"""Key ranges: every key has exactly one partition per epoch, and successors overlap their predecessors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.connector.partitioner import HASH_SPACE, index_for_key, key_hash, key_range, overlapping
from onceflow.connector.store import EpochDescription, StreamDescription


@given(st.integers(min_value=1, max_value=1000))
def test_ranges_tile_the_hash_space(count: int) -> None:
    ranges = [key_range(i, count) for i in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(count - 1))


@given(st.binary(max_size=32), st.integers(min_value=1, max_value=1000))
def test_a_key_falls_in_the_range_of_its_partition(key: bytes, count: int) -> None:
    lo, hi = key_range(index_for_key(key, count), count)
    assert lo <= key_hash(key) < hi


@given(st.binary(max_size=32), st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=64))
def test_the_old_partition_of_a_key_precedes_its_new_one(key: bytes, old: int, new: int) -> None:
    assert index_for_key(key, old) in overlapping(index_for_key(key, new), new, old)


def test_stream_predecessors_after_two_scales() -> None:
    stream = StreamDescription("s", (
        EpochDescription(0, (0, 1), True),
        EpochDescription(1, (2, 3, 4), True),
        EpochDescription(2, (5,), False),
    ))
    assert stream.predecessors(0) == ()
    assert stream.predecessors(2) == (0,)
    assert stream.predecessors(3) == (0, 1)
    assert stream.predecessors(5) == (2, 3, 4)
