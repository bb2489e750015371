"""The schema registry's requests/s with 4 concurrent clients, against a stdlib HTTP server that answers a
constant JSON body in the same run (what an HTTP round trip costs here, with no registry behind it).

Measured: cached look-ups (``GET /schemas/ids/{id}``, what a deserializer asks for an id it has not seen),
registrations of a schema already registered (``POST /subjects/{s}/versions``, what every serializer asks once),
and registrations of new schemas (a CAS append to the store each), on the embedded store.

    python bench/schema_registry.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from _report import report, row, timed

from onceflow.connector.store import open_store
from onceflow.schemas.registry import RegistryServer, SchemaRegistry

CLIENTS = 4


class _Constant(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True  # as the registry's server
    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        data = b'{"id": 1}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def schema(n: int) -> str:
    return json.dumps({"type": "record", "name": f"R{n}", "fields": [{"name": "id", "type": "long"}]})


def concurrently(url: str, requests: int, request: Callable[[http.client.HTTPConnection, int], None]) -> int:
    """``requests`` requests from CLIENTS threads, each on a keep-alive connection of its own."""
    address = urlsplit(url)

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(address.hostname or "", address.port)
        for i in range(index, requests, CLIENTS):
            request(connection, i)
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return requests


def get(path: Callable[[int], str]) -> Callable[[http.client.HTTPConnection, int], None]:
    def request(connection: http.client.HTTPConnection, i: int) -> None:
        connection.request("GET", path(i))
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
    return request


def post(path: Callable[[int], str], body: Callable[[int], str]) -> Callable[[http.client.HTTPConnection, int], None]:
    def request(connection: http.client.HTTPConnection, i: int) -> None:
        connection.request("POST", path(i), json.dumps({"schema": body(i)}),
                           {"Content-Type": "application/vnd.schemaregistry.v1+json"})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
    return request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    constant = ThreadingHTTPServer(("127.0.0.1", 0), _Constant)
    threading.Thread(target=constant.serve_forever, daemon=True).start()
    constant_url = f"http://127.0.0.1:{constant.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        registry = SchemaRegistry(open_store(f"sqlite://{tmp}/registry.db"))
        server = RegistryServer(registry, port=0).start()
        registry.register("known", "AVRO", schema(0))
        baseline_get = timed(lambda: concurrently(constant_url, args.requests, get(lambda i: "/schemas/ids/1")))
        baseline_post = timed(lambda: concurrently(constant_url, args.requests, post(
            lambda i: "/subjects/known/versions", lambda i: schema(0))))
        rows = [
            row("GET /schemas/ids/{id} (cached)", *timed(lambda: concurrently(
                server.url, args.requests, get(lambda i: "/schemas/ids/1"))), "constant answer, GET", baseline_get),
            row("register a known schema", *timed(lambda: concurrently(server.url, args.requests, post(
                lambda i: "/subjects/known/versions", lambda i: schema(0)))), "constant answer, POST", baseline_post),
            row("register a new schema (CAS append)", *timed(lambda: concurrently(
                server.url, args.requests // 10, post(lambda i: f"/subjects/s{i}/versions", lambda i: schema(i + 1)))),
                "constant answer, POST", baseline_post),
        ]
        server.close()
        registry.close()
    constant.shutdown()
    report("schema_registry", rows, {"requests": args.requests, "clients": CLIENTS, "store": "sqlite"})


if __name__ == "__main__":
    main()
