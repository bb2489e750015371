"""The schema registry on the store, driven by confluent-kafka's own SchemaRegistryClient and Avro serdes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from onceflow.connector import Consumer, Producer, TopicPartition
from onceflow.connector.store import Store, open_store, read_range
from onceflow.schemas.registry import STREAM, RegistryError, SchemaRegistry
from tests.conftest import announcement

ORDER_V1 = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})
ORDER_V2 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}]})


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_confluent_avro_serdes_round_trip_through_onceflow_clients(served: tuple[Store, str]) -> None:
    store, url = served
    store.create_stream("orders", 1)
    client = SchemaRegistryClient({"url": url})
    serialize = AvroSerializer(client, ORDER_V1)
    context = SerializationContext("orders", MessageField.VALUE)
    producer = Producer({"store.url": store.url})
    for i in range(3):
        producer.produce("orders", serialize({"id": i}, context), partition=0)
    producer.flush()
    consumer = Consumer({"store.url": store.url, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition("orders", 0, 0)])
    read = consumer.consume(3, timeout=30)
    consumer.close()
    values = [m.value() or b"" for m in read]
    assert [v[:1] for v in values] == [b"\x00"] * 3  # Confluent's wire format: magic byte, 4-byte id, Avro body
    schema_id = int.from_bytes(values[0][1:5], "big")
    assert client.get_schema(schema_id).schema_str == json.dumps(json.loads(ORDER_V1), separators=(",", ":"))
    deserialize = AvroDeserializer(client)
    assert [deserialize(v, context) for v in values] == [{"id": 0}, {"id": 1}, {"id": 2}]


def test_versions_ids_and_lookups_have_confluents_shapes(served: tuple[Store, str]) -> None:
    _, url = served
    client = SchemaRegistryClient({"url": url})
    first = client.register_schema("orders-value", Schema(ORDER_V1, "AVRO"))
    second = client.register_schema("orders-value", Schema(ORDER_V2, "AVRO"))
    again = client.register_schema("audit-value", Schema(ORDER_V1, "AVRO"))  # the same schema: the same id
    assert (first, again) == (first, first) and second == first + 1
    assert client.get_subjects() == ["audit-value", "orders-value"]
    assert client.get_versions("orders-value") == [1, 2]
    latest = client.get_latest_version("orders-value")
    assert (latest.schema_id, latest.version, latest.subject) == (second, 2, "orders-value")
    assert client.lookup_schema("orders-value", Schema(ORDER_V1, "AVRO")).version == 1
    assert call("GET", f"{url}/schemas/ids/{first}/versions") == (
        200, [{"subject": "audit-value", "version": 1}, {"subject": "orders-value", "version": 1}])
    assert call("GET", f"{url}/subjects/orders-value/versions/2/schema")[1]["fields"][1]["name"] == "note"


def test_bad_requests_get_the_registrys_error_codes_and_store_nothing(served: tuple[Store, str]) -> None:
    store, url = served
    assert call("POST", f"{url}/subjects/s/versions", {"schema": "{\"type\": \"nope\"}"})[1]["error_code"] == 42201
    assert call("POST", f"{url}/subjects/s/versions", {"schema": "not json"})[1]["error_code"] == 42201
    assert call("GET", f"{url}/subjects/missing/versions") == (
        404, {"error_code": 40401, "message": "Subject 'missing' not found."})
    assert call("GET", f"{url}/schemas/ids/99")[1]["error_code"] == 40403
    assert call("GET", f"{url}/subjects/s/versions/0")[1]["error_code"] in (40401, 42202)
    assert call("PUT", f"{url}/config", {"compatibility": "SIDEWAYS"})[1]["error_code"] == 42203
    assert list(read_range(store, STREAM, 0)) == []


def test_soft_then_hard_delete(served: tuple[Store, str]) -> None:
    _, url = served
    call("POST", f"{url}/subjects/s/versions", {"schema": ORDER_V1})
    assert call("DELETE", f"{url}/subjects/s?permanent=true")[1]["error_code"] == 40405  # soft-delete first
    assert call("DELETE", f"{url}/subjects/s") == (200, [1])
    assert call("GET", f"{url}/subjects") == (200, [])
    assert call("GET", f"{url}/subjects?deleted=true") == (200, ["s"])
    assert call("DELETE", f"{url}/subjects/s?permanent=true") == (200, [1])
    assert call("GET", f"{url}/subjects?deleted=true") == (200, [])


REGISTER = """
import json, sys
from onceflow.connector.store import open_store
from onceflow.schemas.registry import SchemaRegistry
registry = SchemaRegistry(open_store(sys.argv[1]))
registry.set_level(None, "NONE")  # the enums below are not evolutions of each other
ids = [registry.register(f"s{i % 5}", "AVRO", json.dumps({"type": "enum", "name": "E", "symbols": [f"S{i % 7}"]}))
       for i in range(20)]
print(json.dumps(ids))
"""


@pytest.mark.multiprocess
def test_registries_in_four_processes_agree_on_every_id(store: Store) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", REGISTER, store.url], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    answers = [json.loads(p.communicate(timeout=240)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert answers[0] == answers[1] == answers[2] == answers[3]  # same schema, same id, whoever registered it
    assert sorted(set(answers[0])) == list(range(1, 8))  # seven schemas, ids dense from 1


def test_the_cli_serves_the_registry_on_the_store_it_is_given(store_url: str) -> None:
    url = store_url
    server = subprocess.Popen([sys.executable, "-m", "onceflow.connector.cli", "--store", url, "schema-registry",
                               "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    try:
        address = announcement(server.stderr, "schema registry on ").split(" on ")[1].split(",")[0]
        assert call("POST", f"{address}/subjects/s/versions", {"schema": ORDER_V1}) == (200, {"id": 1})
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=30)
    assert server.returncode == 130
    assert SchemaRegistry(open_store(url)).versions("s") == [1]  # kept in the store


def record(*fields: tuple[str, str, bool]) -> str:
    """An Avro record "Order" of (name, type, has a default) fields."""
    return json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": n, "type": t, **({"default": "" if t == "string" else 0} if d else {})} for n, t, d in fields]})


BASE = record(("id", "long", False), ("x", "string", False))
ADDS_DEFAULTED = record(("id", "long", False), ("x", "string", False), ("note", "string", True))
ADDS_REQUIRED = record(("id", "long", False), ("x", "string", False), ("note", "string", False))
REMOVES_REQUIRED = record(("id", "long", False))
NARROWS = record(("id", "int", False), ("x", "string", False))  # long data cannot be read as int


@pytest.mark.parametrize(("level", "accepted"), [
    ("NONE", {ADDS_DEFAULTED, ADDS_REQUIRED, REMOVES_REQUIRED, NARROWS}),
    ("BACKWARD", {ADDS_DEFAULTED, REMOVES_REQUIRED}),
    ("FORWARD", {ADDS_DEFAULTED, ADDS_REQUIRED, NARROWS}),
    ("FULL", {ADDS_DEFAULTED}),
])
def test_each_level_accepts_exactly_the_evolutions_avro_can_resolve(store_url: str, level: str,
                                                                     accepted: set[str]) -> None:
    registry = SchemaRegistry(open_store(store_url))
    for n, new in enumerate((ADDS_DEFAULTED, ADDS_REQUIRED, REMOVES_REQUIRED, NARROWS)):
        subject = f"s{n}"
        registry.set_level(subject, level)
        registry.register(subject, "AVRO", BASE)
        if new in accepted:
            registry.register(subject, "AVRO", new)
            assert registry.versions(subject) == [1, 2]
        else:
            with pytest.raises(RegistryError) as info:
                registry.register(subject, "AVRO", new)
            assert info.value.status == 409 and level in info.value.message
            assert registry.versions(subject) == [1]  # nothing stored
    registry.close()


@pytest.mark.parametrize("level", ["BACKWARD", "FORWARD", "FULL"])
def test_transitive_levels_check_every_earlier_version_not_only_the_latest(store_url: str, level: str) -> None:
    """v1 lacks "note"; v2 adds it with a default; v3 drops the default: readable from v2, not from v1."""
    registry = SchemaRegistry(open_store(store_url))
    v3 = record(("id", "long", False), ("note", "string", False))
    old, new = (v3, record(("id", "long", False))) if level == "FORWARD" else (record(("id", "long", False)), v3)
    for transitive in (False, True):
        subject = f"{level}-{transitive}"
        registry.set_level(subject, f"{level}_TRANSITIVE" if transitive else level)
        registry.register(subject, "AVRO", old)
        registry.register(subject, "AVRO", record(("id", "long", False), ("note", "string", True)))
        problems = registry.compatible(subject, "latest", "AVRO", new)
        assert (problems != []) is transitive, problems
        assert all("note" in p for p in problems)
    registry.close()


def test_an_incompatible_schema_gets_confluents_409_and_the_check_endpoint_says_why(served: tuple[Store, str]) -> None:
    _, url = served
    assert call("POST", f"{url}/subjects/s/versions", {"schema": BASE})[0] == 200
    status, body = call("POST", f"{url}/subjects/s/versions", {"schema": ADDS_REQUIRED})
    assert status == 409 and body["error_code"] == 409 and "note" in body["message"]
    assert call("POST", f"{url}/compatibility/subjects/s/versions/latest", {"schema": ADDS_DEFAULTED}) == (
        200, {"is_compatible": True})
    status, body = call("POST", f"{url}/compatibility/subjects/s/versions/1?verbose=true", {"schema": ADDS_REQUIRED})
    assert status == 200 and body["is_compatible"] is False and "note" in body["messages"][0]
    assert call("GET", f"{url}/config") == (200, {"compatibilityLevel": "BACKWARD"})
    assert call("PUT", f"{url}/config/s", {"compatibility": "NONE"}) == (200, {"compatibility": "NONE"})
    assert call("POST", f"{url}/subjects/s/versions", {"schema": ADDS_REQUIRED}) == (200, {"id": 2})


def test_a_read_only_subject_refuses_registrations_and_deletions(served: tuple[Store, str]) -> None:
    _, url = served
    call("POST", f"{url}/subjects/s/versions", {"schema": ORDER_V1})
    assert call("PUT", f"{url}/mode/s", {"mode": "READONLY"}) == (200, {"mode": "READONLY"})
    assert call("GET", f"{url}/mode/s") == (200, {"mode": "READONLY"})
    assert call("GET", f"{url}/mode") == (200, {"mode": "READWRITE"})
    assert call("POST", f"{url}/subjects/s/versions", {"schema": ORDER_V1}) == (200, {"id": 1})  # already there
    assert call("POST", f"{url}/subjects/s/versions", {"schema": ORDER_V2})[1]["error_code"] == 42205
    assert call("DELETE", f"{url}/subjects/s")[1]["error_code"] == 42205
    assert call("POST", f"{url}/subjects/t/versions", {"schema": ORDER_V2}) == (200, {"id": 2})  # another subject
    assert call("PUT", f"{url}/mode", {"mode": "IMPORT"})[1]["error_code"] == 42204
    assert call("PUT", f"{url}/mode/s", {"mode": "READWRITE"}) == (200, {"mode": "READWRITE"})
    assert call("GET", f"{url}/subjects/s/versions") == (200, [1])
    assert call("POST", f"{url}/subjects/s/versions", {"schema": ORDER_V2}) == (200, {"id": 2})


def test_exported_names() -> None:
    from onceflow.schemas import registry

    assert sorted(registry.__all__) == ["RegistryError", "RegistryServer", "STREAM", "SchemaRegistry"]
