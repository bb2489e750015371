"""The Avro converter writes Confluent's wire format against a schema registry (here onceflow's own, on the store):
confluent-kafka's AvroDeserializer reads what a source wrote, and a sink reads it back to the same values."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from onceflow.connect.app import ConnectWorker
from onceflow.connect.avro import AvroConverter
from onceflow.connect.records import Field, Schema
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import open_store, read_stream
from onceflow.schemas.registry import RegistryServer, SchemaRegistry
from tests.connect.conftest import wait_until
from tests.connect.sample_plugins import COLLECTED, COLLECTING, COUNTING, PLUGINS

AVRO = "io.confluent.connect.avro.AvroConverter"
ORDER = Schema("struct", name="Order", fields=(Field("id", Schema("int64")), Field("note", Schema("string", True)),
                                                Field("tags", Schema("array", value_schema=Schema("string")))))


@pytest.fixture
def registry_url(worker_props: dict[str, str]) -> Iterator[str]:
    registry = SchemaRegistry(open_store(worker_props["store.url"]))
    server = RegistryServer(registry, "127.0.0.1", 0).start()
    yield server.url
    server.close()
    registry.close()


def converter(url: str, is_key: bool = False) -> AvroConverter:
    avro = AvroConverter()
    avro.configure({"schema.registry.url": url}, is_key)
    return avro


def test_a_struct_round_trips_and_confluents_deserializer_reads_it(registry_url: str) -> None:
    value = {"id": 7, "note": None, "tags": ["a", "b"]}
    data = converter(registry_url).from_connect_data("orders", ORDER, value)
    assert data is not None and data[0] == 0  # Confluent's magic byte, then the schema id
    schema, back = converter(registry_url).to_connect_data("orders", data)
    assert back == value and schema == ORDER
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    assert deserialize(data, SerializationContext("orders", MessageField.VALUE)) == value


def test_bytes_that_are_not_the_wire_format_are_a_deserialization_error(registry_url: str) -> None:
    with pytest.raises(KafkaException) as caught:
        converter(registry_url, is_key=True).to_connect_data("orders", b"{plain json}")
    assert caught.value.code == ErrorCode._KEY_DESERIALIZATION and "Unknown magic byte" in str(caught.value)


def test_a_source_and_a_sink_exchange_avro_records(worker_props: dict[str, str], registry_url: str) -> None:
    avro = {"value.converter": AVRO, "value.converter.schema.registry.url": registry_url}
    with ConnectWorker({**worker_props, **avro}, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "20",
                              "struct": "true"})
        worker.add_connector({"name": "avro-sink", "connector.class": COLLECTING, "topics": "numbers"})
        wait_until(lambda: len(COLLECTED.get("avro-sink", [])) == 20, "the records through Avro")
        stored = [m.value() or b"" for m in read_stream(worker.store, "numbers")]
    assert [r.value for r in COLLECTED["avro-sink"]] == [{"n": n, "note": "x"} for n in range(20)]
    assert {data[:5] for data in stored} == {stored[0][:5]} and stored[0][0] == 0  # one schema id for all
