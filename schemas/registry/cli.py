"""The registry's commands of the ``onceflow`` CLI: ``schema-registry`` serves the REST API; ``schemas register``,
``schemas list`` and ``schemas check`` work on the registry kept in the store directly, with no server running.
``onceflow.connector.cli`` declares them with :func:`add_commands` and hands them to :func:`run`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.store import Store, open_store
from onceflow.schemas.registry.errors import RegistryError, subject_not_found
from onceflow.schemas.registry.http import RegistryServer
from onceflow.schemas.registry.registry import STREAM, SchemaRegistry
from onceflow.schemas.registry.state import SCHEMA_TYPES

COMMANDS = ("schema-registry", "schemas")


def add_commands(commands: Any) -> None:
    """Declare the registry's commands on the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    serve = commands.add_parser("schema-registry", help="serve a Confluent-compatible schema registry kept on the "
                                                        "store (Ctrl-C stops it)")
    serve.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT",
                       help="address to serve on (default 127.0.0.1:8081; another host is an explicit choice)")
    schemas = commands.add_parser("schemas", help="register, list or check schemas in the store's registry")
    actions = schemas.add_subparsers(dest="action", required=True)
    register = actions.add_parser("register", help="register a schema file under a subject; prints its id")
    check = actions.add_parser("check", help="whether a schema file may follow a subject's versions at its level "
                                             "(exit 1 and the problems if not)")
    for parser in (register, check):
        parser.add_argument("subject")
        parser.add_argument("file", type=Path,
                            help="the schema (PROTOBUF: .proto text or a base64 FileDescriptorProto)")
        parser.add_argument("--type", choices=SCHEMA_TYPES, default="AVRO", dest="schema_type")
    check.add_argument("--version", default="latest", help="check against this version only (default: latest, "
                                                           "i.e. as the subject's level says)")
    listing = actions.add_parser("list", help="subject, version, id and type of every live version")
    listing.add_argument("subject", nargs="?", help="only this subject's versions")


def creates_store(args: argparse.Namespace) -> bool:
    """Whether the command may make the store (serving and registering do; reading never does)."""
    return bool(args.command == "schema-registry" or args.action == "register")


def run(args: argparse.Namespace, url: str) -> int:
    """Run one of the registry's commands on the store at ``url``; its exit status."""
    if args.command == "schema-registry":
        return _serve(args, url)
    store = open_store(url)
    try:
        return _schemas(args, store)
    except RegistryError as exc:
        print(f"onceflow: error: {exc.message} (error code {exc.error_code})", file=sys.stderr)
        return 1
    finally:
        store.close()


def _schemas(args: argparse.Namespace, store: Store) -> int:
    if args.action != "register" and STREAM not in store.list_streams():  # no registry here: read, never make one
        if args.subject is not None:
            raise subject_not_found(args.subject)
        return 0
    registry = SchemaRegistry(store)
    try:
        if args.action == "list":
            _list(registry, args.subject)
            return 0
        text = _read(args.file)
        if args.action == "register":
            print(registry.register(args.subject, args.schema_type, text))
            return 0
        problems = registry.compatible(args.subject, args.version, args.schema_type, text)
        for problem in problems:
            print(problem, file=sys.stderr)
        print("incompatible" if problems else "compatible")
        return 1 if problems else 0
    finally:
        registry.close()


def _list(registry: SchemaRegistry, subject: str | None) -> None:
    for name in [subject] if subject is not None else registry.subjects():
        for number in registry.versions(name):
            version, schema = registry.version(name, str(number))
            print(f"{name}\t{version.version}\t{version.schema_id}\t{schema.schema_type}")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        fail(ErrorCode.INVALID_CONFIG, f"{path}: cannot read the schema: {exc}")


def _serve(args: argparse.Namespace, url: str) -> int:
    """The schema registry's REST API until interrupted."""
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        fail(ErrorCode.INVALID_CONFIG, f"--listen {args.listen!r}: expected HOST:PORT")
    registry = SchemaRegistry(open_store(url))
    try:
        server = RegistryServer(registry, host, int(port))
    except OSError as exc:
        fail(ErrorCode.INVALID_CONFIG, f"--listen {args.listen}: cannot serve there: {exc}")
    print(f"onceflow: schema registry on {server.url}, kept in {url}", file=sys.stderr)
    try:
        server.serve_forever()
    finally:
        server.close()
        registry.close()
    return 0
