"""The ``onceflow`` command line: topics, produce, consume, a Connect worker, and the main job (``run``).

Which store a command uses is ``--store``, else ``$ONCEFLOW_STORE_URL``, else the default (``sqlite://onceflow.db``
in the working directory), which is then named on stderr. Only ``topics create`` and ``run --store`` may create a
store; every other command refuses a ``sqlite://`` store whose file does not exist. ``run`` without ``--store``
works in a scratch store of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.table import Table

from onceflow.connector.admin import AdminClient
from onceflow.connector.config import DEFAULT_STORE_URL
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.topic import NewTopic, TopicPartition
from onceflow.schemas.registry import cli as registry_cli

STORE_ENV = "ONCEFLOW_STORE_URL"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away (`yes | head`)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description="Exactly-once data movement on Kafka-style logs.")
    parser.add_argument("--store", help=f"store.url (default: ${STORE_ENV}, else {DEFAULT_STORE_URL})")
    parser.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a client setting (librdkafka names), e.g. -X session.timeout.ms=6000; repeatable")
    commands = parser.add_subparsers(dest="command", required=True)

    topics = commands.add_parser("topics", help="create, list, describe, scale or delete topics")
    actions = topics.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1)
    actions.add_parser("list")
    actions.add_parser("describe").add_argument("topic")
    scale = actions.add_parser("scale", help="seal the current partitions, open a new epoch")
    scale.add_argument("topic")
    scale.add_argument("--partitions", type=int, required=True)
    actions.add_parser("delete").add_argument("topic")

    produce = commands.add_parser("produce", help="append stdin lines as records; the count goes to stderr")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", help="split each line into key and value at this separator")
    produce.add_argument("--partition", type=int, default=-1, help="-1 (default): the partitioner chooses")
    produce.add_argument("--binary", action="store_true",
                         help="lines are raw bytes (no UTF-8 check); a value cannot contain a newline")

    consume = commands.add_parser("consume", help="print records as they arrive")
    consume.add_argument("topic")
    consume.add_argument("--group", help="consumer group (commits offsets); without it nothing is committed")
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--max-messages", type=int, help="stop after this many records")
    consume.add_argument("--timeout", type=float,
                         help="stop after this many idle seconds (>= 0); without it, wait for records forever")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--binary", action="store_true", help="write keys and values as raw bytes")

    registry_cli.add_commands(commands)

    connect = commands.add_parser("connect", help="run a Kafka Connect-style worker (docs/connect.md); its store is "
                                                  "store.url in WORKER.properties, else --store")
    connect.add_argument("mode", choices=["standalone", "distributed"])
    connect.add_argument("worker_properties", metavar="WORKER.properties")
    connect.add_argument("connector_properties", metavar="CONNECTOR.properties", nargs="*",
                         help="standalone: connectors to run")

    run = commands.add_parser("run", help="the main job: CAS racers and a fenced zombie, verified "
                                          "(in a scratch store unless --store is given)")
    run.add_argument("--racers", type=int, default=4)
    run.add_argument("--operations", type=int, default=500, help="successful appends per racer")
    return parser


# -- the store --------------------------------------------------------------------------------------------------


def _store_url(args: argparse.Namespace) -> str | None:
    """The store the user named (``--store`` or the environment), or None for the implicit default."""
    return args.store or os.environ.get(STORE_ENV) or None


def _announce_default_store() -> None:
    """Name the implicit default store on stderr, so that a user knows which file is read or written."""
    path = Path(DEFAULT_STORE_URL.partition("://")[2]).resolve()
    print(f"onceflow: using the default store {DEFAULT_STORE_URL} ({path}); choose another with --store URL or "
          f"${STORE_ENV}", file=sys.stderr)


def _existing(url: str) -> None:
    """Refuse an embedded store that does not exist: commands other than ``topics create`` must not leave an empty
    store behind wherever they were run."""
    scheme, _, location = url.partition("://")
    if scheme == "sqlite" and not Path(location).exists():
        fail(ErrorCode._NOENT, f"store {url}: {Path(location).resolve()} does not exist (only `topics create` makes "
             f"a store); pass --store URL or set ${STORE_ENV} to use an existing one")


def _settings(args: argparse.Namespace, url: str) -> dict[str, str]:
    """``store.url`` and every ``-X key=value``."""
    conf = {"store.url": url}
    for item in args.settings:
        name, sep, value = item.partition("=")
        if not sep:
            fail(ErrorCode.INVALID_CONFIG, f"-X {item!r}: expected KEY=VALUE")
        conf[name] = value
    return conf


def _reader(args: argparse.Namespace, url: str, group: str | None = None, **conf: str) -> Consumer:
    """A consumer; without ``group`` it is in a private group of its own that commits nothing."""
    if group is None:
        conf = {**conf, "enable.auto.commit": "false"}
    return Consumer({**_settings(args, url), **conf, "group.id": group or f"onceflow-cli-{uuid.uuid4().hex}"})


# -- topics -----------------------------------------------------------------------------------------------------


def _topics(args: argparse.Namespace, url: str, console: Console) -> None:
    admin = AdminClient(_settings(args, url))
    if args.action == "create":
        admin.create_topics([NewTopic(args.topic, args.partitions)])[args.topic].result()
        console.print(f"created {args.topic} with {args.partitions} partitions")
    elif args.action == "list":
        for name in sorted(admin.list_topics().topics):
            console.print(name, highlight=False)
    elif args.action == "describe":
        _describe(args, url, admin, console)
    elif args.action == "scale":
        stream = admin.scale_topic(args.topic, args.partitions).result()
        partitions = list(stream.current.partitions)
        console.print(f"scaled {args.topic}: epoch {stream.current.epoch} has partitions {partitions}")
    else:
        admin.delete_topics([args.topic])[args.topic].result()
        console.print(f"deleted {args.topic}")


def _describe(args: argparse.Namespace, url: str, admin: AdminClient, console: Console) -> None:
    topic = admin.list_topics(args.topic).topics[args.topic]
    consumer = _reader(args, url)
    table = Table(title=args.topic)
    for column in ("partition", "epoch", "state", "low", "high"):
        table.add_column(column)
    for p in topic.partitions.values():
        low, high = consumer.get_watermark_offsets(TopicPartition(args.topic, p.id))
        table.add_row(str(p.id), str(p.epoch), "sealed" if p.sealed else "open", str(low), str(high))
    consumer.close()
    console.print(table)


# -- produce ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Tally:
    """What became of the lines read: how many were produced, which failed on delivery and why."""

    produced: int = 0
    failed: dict[int, KafkaError] = dataclasses.field(default_factory=dict)

    def on_delivery(self, line: int) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self.produced += 1
            else:
                self.failed[line] = err
        return report

    def failures(self) -> str:
        """'' if every delivered line was produced, else which lines were not and the first reason."""
        if not self.failed:
            return ""
        first = min(self.failed)
        return f"; {len(self.failed)} lines were not produced: {_ranges(sorted(self.failed))} ({self.failed[first]})"


def _ranges(numbers: list[int]) -> str:
    """``1-3, 7`` for [1, 2, 3, 7] (sorted)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Numbered lines of ``stream`` as bytes, without their newline."""
    for number, line in enumerate(stream, 1):
        yield number, line[:-1] if line.endswith(b"\n") else line


def _record(args: argparse.Namespace, number: int, line: bytes) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line; a line that is not UTF-8 is refused unless ``--binary``."""
    if not args.binary:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(ErrorCode.INVALID_RECORD, f"line {number} is not UTF-8 ({exc.reason} at byte {exc.start}); "
                 "pass --binary to produce lines as raw bytes")
    separator = args.key_separator.encode() if args.key_separator else None
    if separator and separator in line:
        key, value = line.split(separator, 1)
        return key, value
    return None, line


def _produce_line(producer: Producer, args: argparse.Namespace, number: int, line: bytes, tally: _Tally) -> None:
    key, value = _record(args, number, line)
    while True:
        try:
            producer.produce(args.topic, value, key=key, partition=args.partition,
                             on_delivery=tally.on_delivery(number))
            break
        except BufferError:  # the queue is full: wait for deliveries, then queue this line
            producer.poll(0.1)
    producer.poll(0)


def _produce(args: argparse.Namespace, url: str) -> int:
    """Every line read before an error is produced or named as not produced; the count goes to stderr."""
    producer = Producer(_settings(args, url))
    tally, read = _Tally(), 0
    try:
        for number, line in _lines(sys.stdin.buffer):
            _produce_line(producer, args, number, line, tally)
            read = number
    except KafkaException as exc:
        producer.flush()
        raise KafkaException(KafkaError(exc.code, f"line {read + 1}: {exc.error.str()}; {tally.produced} records "
                                        f"produced from lines 1-{read}{tally.failures()}; line {read + 1} and the "
                                        "lines after it were not produced")) from exc
    producer.flush()
    if tally.failed:
        fail(tally.failed[min(tally.failed)].code(), f"{tally.produced} of {read} records produced to "
             f"{args.topic}{tally.failures()}")
    print(f"onceflow: produced {tally.produced} records to {args.topic}", file=sys.stderr)
    return 0


# -- consume ----------------------------------------------------------------------------------------------------


def _write(args: argparse.Namespace, message: Message) -> None:
    """Print one record: UTF-8 text (undecodable bytes replaced), or its exact bytes with ``--binary``."""
    value, key = message.value() or b"", message.key() or b""
    line = key + b"\t" + value if args.print_key else value
    if args.binary:
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()
    else:
        print(line.decode(errors="replace"), flush=True)


def _consume(args: argparse.Namespace, url: str) -> int:
    if args.timeout is not None and args.timeout < 0:
        fail(ErrorCode._INVALID_ARG, f"--timeout {args.timeout:g}: expected idle seconds >= 0 (leave it out to wait "
             "for records forever)")
    consumer = _reader(args, url, args.group, **{"auto.offset.reset": "earliest" if args.from_beginning else "latest"})
    try:
        if not args.topic.startswith("^"):
            consumer.list_topics(args.topic)  # UNKNOWN_TOPIC_OR_PART, with or without a group
        if args.group:
            consumer.subscribe([args.topic])
        else:
            partitions = consumer.list_topics(args.topic).topics[args.topic].partitions
            consumer.assign([TopicPartition(args.topic, p) for p in partitions])
        _print_records(args, consumer)
    finally:
        consumer.close()
    return 0


def _print_records(args: argparse.Namespace, consumer: Consumer) -> None:
    seen = 0
    while args.max_messages is None or seen < args.max_messages:
        message = consumer.poll(args.timeout if args.timeout is not None else 1.0)
        if message is None:
            if args.timeout is not None:
                return
            continue
        error = message.error()
        if error is not None:
            if error.code() == ErrorCode._PARTITION_EOF:
                continue
            raise KafkaException(error)
        try:
            _write(args, message)
        except BrokenPipeError:
            # Not delivered: a group reads it again (close() commits the position this seek sets).
            consumer.seek(TopicPartition(message.topic() or args.topic, message.partition() or 0,
                                         message.offset() or 0))
            raise
        seen += 1


# -- run --------------------------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, url: str | None, console: Console) -> int:
    """The main job; without ``--store`` in a scratch store that is removed afterwards (it never touches a
    store's existing data: on a given store it refuses to start if the job's topics are there)."""
    from onceflow.demos.cas_ledger import run

    if url is not None:
        return 0 if run(url, args.racers, args.operations, console) else 1
    with tempfile.TemporaryDirectory(prefix="onceflow-run-") as scratch:
        print(f"onceflow: run works in a scratch store in {scratch}, removed afterwards; pass --store URL to run "
              "it on a store of yours", file=sys.stderr)
        return 0 if run(f"sqlite://{scratch}/run.db", args.racers, args.operations, console) else 1


def _connect(args: argparse.Namespace, url: str | None) -> int:
    """A Connect worker until SIGTERM or Ctrl-C (it creates its store and streams, as Kafka Connect its topics)."""
    from onceflow.connect.app import run

    return run(args.mode, args.worker_properties, args.connector_properties, url)


def _dispatch(args: argparse.Namespace, console: Console) -> int:
    named = _store_url(args)
    if args.command == "run":
        return _run(args, named, console)
    if args.command == "connect":
        return _connect(args, named)
    url = named or DEFAULT_STORE_URL
    registry_command = args.command in registry_cli.COMMANDS
    if not (args.command == "topics" and args.action == "create") and not (
            registry_command and registry_cli.creates_store(args)):
        _existing(url)
    if named is None:
        _announce_default_store()
    if registry_command:
        return registry_cli.run(args, url)
    if args.command == "topics":
        _topics(args, url, console)
        return 0
    if args.command == "produce":
        return _produce(args, url)
    return _consume(args, url)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        return _dispatch(args, console)
    except KafkaException as exc:
        print(f"onceflow: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`onceflow consume t | head`): stop quietly
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
