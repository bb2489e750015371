"""The REST API, with Kafka Connect's endpoints, status codes, JSON shapes and error bodies
(``{"error_code": 404, "message": "Connector x not found"}``), so Connect's REST clients and UIs work unchanged.

It serves on ``listeners`` (``http://127.0.0.1:8083`` by default: binding another address is an explicit choice);
with ``rest.auth.token`` every request needs ``Authorization: Bearer <token>``. Errors from the herder are
:class:`KafkaException` s; their codes pick the status (see :data:`STATUS_OF`).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from onceflow.connect.herder import Herder
from onceflow.connect.status import TargetState
from onceflow.connector.errors import ErrorCode, KafkaException, fail

log = logging.getLogger(__name__)

STATUS_OF = {ErrorCode.RESOURCE_NOT_FOUND: 404, ErrorCode.DUPLICATE_RESOURCE: 409, ErrorCode.INVALID_CONFIG: 400,
             ErrorCode.INVALID_REQUEST: 400, ErrorCode.REBALANCE_IN_PROGRESS: 409,
             ErrorCode.TOPIC_AUTHORIZATION_FAILED: 401, ErrorCode.UNKNOWN_TOPIC_OR_PART: 400}
Reply = tuple[int, Any]
Route = Callable[["_Request"], Reply]
_NO_CONTENT = (204, None)
_ACCEPTED = (202, None)


class _Request:
    """One request as the routes see it: path parameters, query, JSON body."""

    def __init__(self, params: dict[str, str], query: dict[str, list[str]], body: bytes) -> None:
        self.params = params
        self.query = query
        self._body = body

    def json(self) -> Any:
        if not self._body:
            return None
        try:
            return json.loads(self._body)
        except ValueError as exc:
            fail(ErrorCode.INVALID_REQUEST, f"Cannot deserialize the request body as JSON: {exc}")

    def flag(self, name: str) -> bool:
        return self.query.get(name, ["false"])[-1].lower() == "true"


def _string_map(value: Any, what: str) -> dict[str, str]:
    """A JSON object of strings, as Kafka Connect's configs are (numbers and booleans are taken as text)."""
    patch = _patch(value, what)
    nulls = sorted(k for k, v in patch.items() if v is None)
    if nulls:
        fail(ErrorCode.INVALID_CONFIG, f"{what}: {nulls[0]}: Null value can not be supplied as the configuration "
             "value.")
    return {k: v for k, v in patch.items() if v is not None}


def _patch(value: Any, what: str) -> dict[str, str | None]:
    """A JSON object of strings or nulls (a PATCH: null removes a key)."""
    if not isinstance(value, dict):
        fail(ErrorCode.INVALID_REQUEST, f"{what} must be a JSON object of strings")
    out: dict[str, str | None] = {}
    for key, item in value.items():
        if isinstance(item, dict | list):
            fail(ErrorCode.INVALID_REQUEST, f"{what}: the value of {key!r} must be a string")
        out[key] = item if item is None or isinstance(item, str) else json.dumps(item).strip('"')
    return out


class Routes:
    """Every endpoint, as (method, path pattern) -> handler over a :class:`Herder`."""

    def __init__(self, herder: Herder) -> None:
        self.herder = herder
        h = self
        self.table: list[tuple[str, re.Pattern[str], Route]] = [
            ("GET", _p(""), lambda r: (200, h.herder.server_info())),
            ("GET", _p("/connectors"), h.list_connectors),
            ("POST", _p("/connectors"), h.create),
            ("GET", _p("/connectors/{c}"), lambda r: (200, h.herder.connector_info(r.params["c"]))),
            ("DELETE", _p("/connectors/{c}"), h.delete),
            ("GET", _p("/connectors/{c}/config"), lambda r: (200, h.herder.connector_config(r.params["c"]))),
            ("PUT", _p("/connectors/{c}/config"), h.put_config),
            ("PATCH", _p("/connectors/{c}/config"), h.patch_config),
            ("GET", _p("/connectors/{c}/status"), lambda r: (200, h.herder.connector_status(r.params["c"]))),
            ("GET", _p("/connectors/{c}/topics"), lambda r: (200, h.herder.active_topics(r.params["c"]))),
            ("PUT", _p("/connectors/{c}/topics/reset"), h.reset_topics),
            ("POST", _p("/connectors/{c}/restart"), h.restart),
            ("PUT", _p("/connectors/{c}/pause"), h.target(TargetState.PAUSED, _ACCEPTED)),
            ("PUT", _p("/connectors/{c}/resume"), h.target(TargetState.RUNNING, _ACCEPTED)),
            ("PUT", _p("/connectors/{c}/stop"), h.target(TargetState.STOPPED, _NO_CONTENT)),
            ("GET", _p("/connectors/{c}/tasks"), lambda r: (200, h.herder.task_configs(r.params["c"]))),
            ("GET", _p("/connectors/{c}/tasks/{t}/status"),
             lambda r: (200, h.herder.task_status(r.params["c"], _task(r)))),
            ("POST", _p("/connectors/{c}/tasks/{t}/restart"), h.restart_task),
            ("GET", _p("/connectors/{c}/offsets"), lambda r: (200, h.herder.offsets(r.params["c"]))),
            ("PATCH", _p("/connectors/{c}/offsets"), lambda r: (200, h.herder.alter_offsets(r.params["c"], r.json()))),
            ("DELETE", _p("/connectors/{c}/offsets"), lambda r: (200, h.herder.reset_offsets(r.params["c"]))),
            ("GET", _p("/connector-plugins"), h.plugins),
            ("GET", _p("/connector-plugins/{p}/config"), h.plugin_config),
            ("PUT", _p("/connector-plugins/{p}/config/validate"), h.validate),
        ]

    def list_connectors(self, request: _Request) -> Reply:
        names = self.herder.connectors()
        expand = request.query.get("expand")
        if not expand:
            return 200, names
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            try:
                views = {"status": self.herder.connector_status, "info": self.herder.connector_info}
                out[name] = {e: views[e](name) for e in expand if e in views}
            except KafkaException as exc:  # deleted meanwhile: left out, as Kafka Connect does
                if exc.code != ErrorCode.RESOURCE_NOT_FOUND:
                    raise
        return 200, out

    def create(self, request: _Request) -> Reply:
        body = request.json()
        if not isinstance(body, dict):
            fail(ErrorCode.INVALID_REQUEST, "The request body must be a JSON object with 'name' and 'config'")
        if body.get("config") is None:
            fail(ErrorCode.INVALID_REQUEST, "Connector config is missing: the request body needs 'config'")
        config = _string_map(body["config"], "config")
        name = str(body.get("name") or config.get("name") or "")
        initial = body.get("initial_state", "RUNNING")
        if initial not in TargetState.__members__:
            fail(ErrorCode.INVALID_REQUEST, f"initial_state must be one of RUNNING, PAUSED, STOPPED; got {initial!r}")
        return 201, self.herder.put_connector_config(name, config, False, TargetState[initial])[1]

    def delete(self, request: _Request) -> Reply:
        self.herder.delete_connector(request.params["c"])
        return _NO_CONTENT

    def reset_topics(self, request: _Request) -> Reply:
        self.herder.reset_topics(request.params["c"])
        return _ACCEPTED

    def restart_task(self, request: _Request) -> Reply:
        self.herder.restart_task(request.params["c"], _task(request))
        return _NO_CONTENT

    def put_config(self, request: _Request) -> Reply:
        name = request.params["c"]
        config = _string_map(request.json(), "config")
        if config.get("name", name) != name:
            fail(ErrorCode.INVALID_REQUEST, "Connector name configuration (" + str(config["name"]) + ") doesn't match "
                 "connector name in the URL (" + name + ")")
        created, info = self.herder.put_connector_config(name, config, True)
        return (201 if created else 200), info

    def patch_config(self, request: _Request) -> Reply:
        name = request.params["c"]
        patch = _patch(request.json(), "config")
        if patch.get("name", name) != name:
            fail(ErrorCode.INVALID_REQUEST, f"Connector name configuration ({patch['name']}) doesn't match connector "
                 f"name in the URL ({name})")
        merged = {**self.herder.connector_config(name), **patch}
        config = {k: v for k, v in merged.items() if v is not None}
        return 200, self.herder.put_connector_config(name, config, True)[1]

    def restart(self, request: _Request) -> Reply:
        name, tasks, failed = request.params["c"], request.flag("includeTasks"), request.flag("onlyFailed")
        status = self.herder.restart_connector(name, tasks, failed)
        return _NO_CONTENT if not tasks and not failed else (202, status)

    def target(self, target: TargetState, reply: Reply) -> Route:
        def route(request: _Request) -> Reply:
            self.herder.set_target(request.params["c"], target)
            return reply
        return route

    def plugins(self, request: _Request) -> Reply:
        connectors_only = request.query.get("connectorsOnly", ["true"])[-1].lower() != "false"
        descs = self.herder.plugins.connectors() if connectors_only else self.herder.plugins.all()
        return 200, [d.info() for d in descs]

    def plugin_config(self, request: _Request) -> Reply:
        desc = self.herder.plugins.find(request.params["p"])
        if desc is None:
            fail(ErrorCode.RESOURCE_NOT_FOUND, f"Unknown plugin {request.params['p']}.")
        return 200, self.herder.plugin_config(desc)

    def validate(self, request: _Request) -> Reply:
        plugin, config = request.params["p"], _string_map(request.json(), "config")
        named = config.get("connector.class")
        if named is not None and not _normalized(named).endswith(_normalized(plugin)):
            fail(ErrorCode.INVALID_REQUEST, f"Included connector type {named} does not match request type {plugin}")
        return 200, self.herder.validate({**config, "connector.class": named or plugin})


def _normalized(name: str) -> str:
    return name.removesuffix("Connector")


def _task(request: _Request) -> int:
    try:
        return int(request.params["t"])
    except ValueError:
        fail(ErrorCode.RESOURCE_NOT_FOUND, "HTTP 404 Not Found")


def _p(template: str) -> re.Pattern[str]:
    """A path pattern: ``{name}`` matches one path segment."""
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "/?$")


class _Handler(BaseHTTPRequestHandler):
    routes: Routes
    token: str
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        """Every method: ``self.command`` says which."""
        method = self.command
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            status, payload = self._answer(method, body)
        except KafkaException as exc:
            status = STATUS_OF.get(exc.code, 500)
            payload = {"error_code": status, "message": exc.error.str()}
        except Exception as exc:  # a bug or a plugin's failure: the client still gets Kafka Connect's error body
            log.error("REST %s %s failed", method, self.path, exc_info=True)
            status, payload = 500, {"error_code": 500, "message": f"{type(exc).__name__}: {exc}"}
        self._send(status, payload)

    def _answer(self, method: str, body: bytes) -> Reply:
        if self.token and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {self.token}"):
            return 401, {"error_code": 401, "message": "Missing or wrong 'Authorization: Bearer' token"}
        url = urlsplit(self.path)
        matched = [(m, pattern.match(url.path), route) for m, pattern, route in self.routes.table]
        hits = [(m, found, route) for m, found, route in matched if found is not None]
        if not hits:
            return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}
        for route_method, found, route in hits:
            if route_method == method and found is not None:
                params = {k: unquote(v) for k, v in found.groupdict().items()}
                return route(_Request(params, parse_qs(url.query), body))
        return 405, {"error_code": 405, "message": "HTTP 405 Method Not Allowed"}

    def _send(self, status: int, payload: Any) -> None:
        data = b"" if payload is None and status in (202, 204) else json.dumps(payload).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("REST %s", format % args)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class RestServer:
    """The REST API on its own threads; :attr:`url` is where it answers."""

    def __init__(self, host: str, port: int, token: str = "") -> None:
        handler = type("Handler", (_Handler,), {"token": token})
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            fail(ErrorCode.INVALID_CONFIG, f"listeners: cannot serve on {host}:{port}: {exc.strerror}")
        self._server.daemon_threads = True
        self._handler = handler
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def serve(self, herder: Herder) -> None:
        """Answer requests with ``herder`` from now on, in a background thread."""
        self._handler.routes = Routes(herder)  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="connect-rest", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()
