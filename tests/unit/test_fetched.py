"""A Consumer's fetched messages: taken in the order fetched, in any amounts, each partition's position moved past
its last record taken, and dropped by partition, exactly as a queue of single messages would do it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.connector.errors import ErrorCode, KafkaError
from onceflow.connector.fetched import Fetched
from onceflow.connector.message import Message

partitions = st.sampled_from([("a", 0), ("a", 1), ("b", 0)])
operations = st.lists(st.one_of(
    st.tuples(st.just("records"), partitions, st.integers(min_value=1, max_value=5)),
    st.tuples(st.just("event"), partitions, st.just(0)),
    st.tuples(st.just("take"), st.integers(min_value=1, max_value=12), st.just(0)),
    st.tuples(st.just("drop"), st.sets(partitions, max_size=2), st.just(0)),
), max_size=40)


@given(operations)
def test_runs_behave_as_a_queue_of_single_messages(ops: list[tuple[object, object, int]]) -> None:
    fetched, queue = Fetched(), []  # the model: one message at a time
    next_offset = {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}
    for op, arg, count in ops:
        if op == "records":
            (topic, partition) = key = arg  # type: ignore[misc]
            run = [Message(topic, partition, next_offset[key] + i, None, b"v") for i in range(count)]
            next_offset[key] += count
            fetched.add(run)
            queue += run
        elif op == "event":
            topic, partition = arg  # type: ignore[misc]
            event = Message(topic, partition, None, None, None, error=KafkaError(ErrorCode._PARTITION_EOF, "end"))
            fetched.add([event])
            queue.append(event)
        elif op == "take":
            taken, positions = fetched.take(arg)  # type: ignore[arg-type]
            expected, queue = queue[:arg], queue[arg:]  # type: ignore[misc]
            assert taken == expected
            assert positions == {(m.topic(), m.partition()): m.offset() + 1 for m in expected if m.error() is None}
        else:
            fetched.drop(arg)  # type: ignore[arg-type]
            queue = [m for m in queue if (m.topic(), m.partition()) not in arg]  # type: ignore[operator]
        assert len(fetched) == len(queue)
        for key in next_offset:
            assert fetched.held(key) == sum(1 for m in queue if (m.topic(), m.partition()) == key)
    assert fetched.take(10**6)[0] == queue
