"""Confluent Schema Registry's REST API over a :class:`SchemaRegistry`, so confluent-kafka's own
``SchemaRegistryClient`` and serializers work against it unchanged. Routes, JSON shapes and error codes follow
Confluent's; what this registry does not do (the IMPORT mode, answering .proto text) is
answered as such, never pretended. A PROTOBUF schema (given as .proto text or serialized) is answered in the
serialized form (base64 descriptor) that confluent-kafka's clients ask for with ``format=serialized``, whatever the
format asked."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from onceflow.schemas.registry.errors import RegistryError
from onceflow.schemas.registry.registry import SchemaRegistry
from onceflow.schemas.registry.state import SCHEMA_TYPES

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Handler = Callable[[SchemaRegistry, dict[str, str], dict[str, list[str]], Any], Any]


def _subjects(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return registry.subjects(deleted=_flag(query, "deleted"))


def _versions(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return registry.versions(path["subject"], deleted=_flag(query, "deleted"))


def _register(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    schema_type, text, references = _schema_of(body)
    return {"id": registry.register(path["subject"], schema_type, text, references)}


def _lookup(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    schema_type, text, references = _schema_of(body)
    version, schema = registry.lookup(path["subject"], schema_type, text, references)
    return {"subject": path["subject"], "id": version.schema_id, "version": version.version, **schema.to_json()}


def _version(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    version, schema = registry.version(path["subject"], path["version"])
    return {"subject": path["subject"], "id": version.schema_id, "version": version.version, **schema.to_json()}


def _version_schema(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return json.loads(registry.version(path["subject"], path["version"])[1].schema)


def _by_id(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return registry.schema(_id(path)).to_json()


def _by_id_schema(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return json.loads(registry.schema(_id(path)).schema)


def _id_subjects(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return sorted({subject for subject, _ in registry.usages(_id(path))})


def _id_versions(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return [{"subject": s, "version": v} for s, v in registry.usages(_id(path))]


def _delete_subject(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return registry.delete(path["subject"], None, _flag(query, "permanent"))


def _delete_version(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return registry.delete(path["subject"], path["version"], _flag(query, "permanent"))[0]


def _types(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return list(SCHEMA_TYPES)


def _get_config(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return {"compatibilityLevel": registry.level(path.get("subject"))}


def _put_config(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    level = body.get("compatibility") if isinstance(body, dict) else None
    return {"compatibility": registry.set_level(path.get("subject"), level)}


def _compatibility(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    schema_type, text, references = _schema_of(body)
    found = registry.compatible(path["subject"], path["version"], schema_type, text, references)
    return {"is_compatible": not found, **({"messages": found} if _flag(query, "verbose") else {})}


def _get_mode(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return {"mode": registry.mode(path.get("subject"))}


def _put_mode(registry: SchemaRegistry, path: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
    return {"mode": registry.set_mode(path.get("subject"), body.get("mode") if isinstance(body, dict) else None)}


_SUBJECT, _VERSION, _ID = r"(?P<subject>[^/]+)", r"(?P<version>[^/]+)", r"(?P<id>[^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [(method, re.compile(f"^{pattern}$"), handler) for
                                                      method, pattern, handler in [
    ("GET", "/subjects", _subjects),
    ("GET", f"/subjects/{_SUBJECT}/versions", _versions),
    ("POST", f"/subjects/{_SUBJECT}/versions", _register),
    ("POST", f"/subjects/{_SUBJECT}", _lookup),
    ("GET", f"/subjects/{_SUBJECT}/versions/{_VERSION}", _version),
    ("GET", f"/subjects/{_SUBJECT}/versions/{_VERSION}/schema", _version_schema),
    ("DELETE", f"/subjects/{_SUBJECT}", _delete_subject),
    ("DELETE", f"/subjects/{_SUBJECT}/versions/{_VERSION}", _delete_version),
    ("GET", f"/schemas/ids/{_ID}", _by_id),
    ("GET", f"/schemas/ids/{_ID}/schema", _by_id_schema),
    ("GET", f"/schemas/ids/{_ID}/subjects", _id_subjects),
    ("GET", f"/schemas/ids/{_ID}/versions", _id_versions),
    ("GET", "/schemas/types", _types),
    ("GET", "/config", _get_config),
    ("GET", f"/config/{_SUBJECT}", _get_config),
    ("PUT", "/config", _put_config),
    ("PUT", f"/config/{_SUBJECT}", _put_config),
    ("GET", "/mode", _get_mode),
    ("GET", f"/mode/{_SUBJECT}", _get_mode),
    ("PUT", "/mode", _put_mode),
    ("PUT", f"/mode/{_SUBJECT}", _put_mode),
    ("POST", f"/compatibility/subjects/{_SUBJECT}/versions/{_VERSION}", _compatibility),
]]


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() == "true"


def _id(path: dict[str, str]) -> int:
    try:
        return int(path["id"])
    except ValueError:
        raise RegistryError(40403, f"Schema {path['id']} not found") from None


def _schema_of(body: Any) -> tuple[str, str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(42201, "Invalid schema: the request needs a \"schema\" string")
    return str(body.get("schemaType") or "AVRO"), body["schema"], body.get("references") or ()


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    disable_nagle_algorithm = True  # an answer goes out at once, not after the client's delayed ACK

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default, as the rest of onceflow
        pass

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            status, answer = 200, self._answer(method, unquote(url.path.rstrip("/")) or "/", parse_qs(url.query))
        except RegistryError as exc:
            status, answer = exc.status, {"error_code": exc.error_code, "message": exc.message}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, method: str, path: str, query: dict[str, list[str]]) -> Any:
        matched = [(m, route.match(path), handler) for m, route, handler in ROUTES]
        found = [(m, match, handler) for m, match, handler in matched if match is not None]
        for m, match, handler in found:
            if m == method:
                return handler(self.server.registry, match.groupdict(), query, self._body())
        if found:
            raise RegistryError(40501, f"HTTP {method} is not supported on {path}")
        raise RegistryError(40400, f"HTTP 404 Not Found: {path}")

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise RegistryError(42201, f"Unrecognized request body: {exc}") from exc


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: SchemaRegistry) -> None:
        super().__init__(address, _RequestHandler)
        self.registry = registry


class RegistryServer:
    """The REST API of ``registry`` on ``host:port`` (port 0: a free one), served from a background thread."""

    def __init__(self, registry: SchemaRegistry, host: str = "127.0.0.1", port: int = 8081) -> None:
        self._server = _Server((host, port), registry)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="schema-registry", daemon=True)  # close() returns within 50 ms

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RegistryServer:
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
