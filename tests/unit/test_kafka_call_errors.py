"""How a failed confluent-kafka call reaches onceflow's Kafka backend: as onceflow's typed errors, never as a
bare exception of the binding that ends the process."""

from __future__ import annotations

from collections.abc import Callable

import confluent_kafka as ck
import pytest

from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store.kafka.clients import translating


def fenced_in_a_callback() -> None:
    """As confluent-kafka raises a fatal error it met while serving a delivery callback."""
    try:
        raise ck.KafkaException(ck.KafkaError(ck.KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    except ck.KafkaException as cause:
        raise SystemError("<built-in method flush> returned a result with an exception set") from cause


def lost_its_error() -> None:
    """As confluent-kafka failed in a merge's flush while processes took its owner from each other: the error lost
    on the way."""
    raise SystemError("<built-in method flush of cimpl.Producer object> returned NULL without setting an exception")


@pytest.mark.parametrize(("fail", "code"), [(fenced_in_a_callback, ErrorCode.PRODUCER_FENCED),
                                            (lost_its_error, ErrorCode._FATAL)])
def test_a_call_that_fails_inside_the_binding_is_a_fatal_typed_error(fail: Callable[[], None],
                                                                     code: ErrorCode) -> None:
    with pytest.raises(KafkaException) as raised, translating("merging: writing"):
        fail()
    assert raised.value.code == code
    assert raised.value.error.fatal()  # the client is unusable: a fenced owner is dropped and taken afresh
    assert "merging: writing" in str(raised.value)
