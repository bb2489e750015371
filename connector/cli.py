"""The ``onceflow`` command line (kcat-like): topics, produce, consume, consumer groups, a Connect worker, and the
main job (``run``).

Which store a command uses is ``--store``, else ``$ONCEFLOW_STORE_URL``, else the default (``sqlite://onceflow.db``
in the working directory), which is then named on stderr. Only ``topics create`` and ``run --store`` may create a
store; every other command refuses a ``sqlite://`` store whose file does not exist. ``run`` without ``--store``
works in a scratch store of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from onceflow.connector.admin import AdminClient, ConsumerGroupTopicPartitions, OffsetSpec
from onceflow.connector.config import DEFAULT_STORE_URL
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.topic import OFFSET_BEGINNING, OFFSET_END, NewTopic, TopicPartition
from onceflow.schemas.registry import cli as registry_cli

STORE_ENV = "ONCEFLOW_STORE_URL"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away (`yes | head`)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description="Exactly-once data movement on Kafka-style logs. "
                                     "--store and -X may also follow the command.")
    parser.add_argument("--version", action="version", version=f"onceflow {_version()}")
    parser.add_argument("--store", help=f"store.url (default: ${STORE_ENV}, else {DEFAULT_STORE_URL})")
    parser.add_argument("-X", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a client setting (librdkafka names), e.g. -X session.timeout.ms=6000; repeatable")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topics = commands.add_parser("topics", help="create, list, describe, scale or delete topics",
                                 description="Create, list, describe, scale or delete topics.")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic (and the store, if it does not exist)")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1, help="partitions of its first epoch (default 1)")
    actions.add_parser("list", help="the topics' names, one a line")
    actions.add_parser("describe", help="each partition's epoch, state and offsets (low, high, records)"
                       ).add_argument("topic")
    scale = actions.add_parser("scale", help="seal the current partitions, open a new epoch")
    scale.add_argument("topic")
    scale.add_argument("--partitions", type=int, required=True, help="partitions of the new epoch")
    actions.add_parser("delete", help="delete a topic and its records").add_argument("topic")

    produce = commands.add_parser("produce", help="append stdin lines as records; the count goes to stderr")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", help="split each line into key and value at this separator")
    produce.add_argument("--partition", type=int, default=-1, help="-1 (default): the partitioner chooses")
    produce.add_argument("--binary", action="store_true",
                         help="lines are raw bytes (no UTF-8 check); a value cannot contain a newline")

    consume = commands.add_parser("consume", help="print records as they arrive (kcat -C)")
    consume.add_argument("topic")
    consume.add_argument("--group", help="consumer group (commits offsets); without it nothing is committed")
    consume.add_argument("--from-beginning", action="store_true", help="the same as --offset beginning")
    consume.add_argument("--offset", help="where to start, without --group (kcat -o): beginning, end, N "
                                          "(absolute), -N (N before the end), s@MS (first record at or after a "
                                          "timestamp in ms); default: end")
    consume.add_argument("--partition", type=int, help="read only this partition (kcat -p)")
    consume.add_argument("-e", "--exit", action="store_true", dest="exit_at_end",
                         help="exit when every partition was read to its end (kcat -e)")
    consume.add_argument("--max-messages", type=int, help="stop after this many records")
    consume.add_argument("--timeout", type=float,
                         help="stop after this many idle seconds (>= 0); without it, wait for records forever")
    consume.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")
    consume.add_argument("--format", help="kcat's -f: %%s value, %%k key, %%S value size, %%K key size, %%t topic, "
                                          "%%p partition, %%o offset, %%T timestamp (ms), %%h headers (k=v,...), "
                                          "%%%% a percent sign; \\n \\t \\r \\\\ escapes; no newline is added")
    consume.add_argument("--binary", action="store_true", help="write keys and values as raw bytes")

    groups = commands.add_parser("groups", help="list or describe consumer groups (with lag), reset their offsets",
                                 description="Consumer groups: list, describe (with each partition's lag), "
                                 "reset-offsets.")
    group_actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    group_actions.add_parser("list", help="each group's state and member count")
    group_actions.add_parser("describe", help="each partition's committed offset, end and lag, and its owner"
                             ).add_argument("group")
    reset = group_actions.add_parser("reset-offsets", help="move an empty group's committed offsets (prints the "
                                                           "plan; applies it only with --execute)")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partition", type=int, help="only this partition (default: every partition)")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="each partition's first offset")
    where.add_argument("--to-latest", action="store_true", help="each partition's end")
    where.add_argument("--to-offset", type=int, help="this offset (kept within each partition's offsets)")
    where.add_argument("--to-datetime", type=int, metavar="MS", help="the first record at or after this time (ms)")
    where.add_argument("--shift-by", type=int, help="move each committed offset by N (negative: back)")
    reset.add_argument("--execute", action="store_true", help="apply the plan (without it, only print it)")

    registry_cli.add_commands(commands)

    connect = commands.add_parser("connect", help="run a Kafka Connect-style worker (docs/connect.md); its store is "
                                                  "store.url in WORKER.properties, else --store")
    connect.add_argument("mode", choices=["standalone", "distributed"])
    connect.add_argument("worker_properties", metavar="WORKER.properties")
    connect.add_argument("connector_properties", metavar="CONNECTOR.properties", nargs="*",
                         help="standalone: connectors to run")

    run = commands.add_parser("run", help="the main job: CAS racers and a fenced zombie, verified "
                                          "(in a scratch store unless --store is given)")
    run.add_argument("--racers", type=int, default=4, help="processes racing to append (default 4)")
    run.add_argument("--operations", type=int, default=500, help="successful appends per racer")
    _global_options_everywhere(parser)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("onceflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _global_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--store`` and ``-X`` after any (sub)command too, into their own names: merged in :func:`_merged`,
    so that settings given before and after the command all count."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("--store", dest="store_after", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
                sub.add_argument("-X", dest="settings_after", action="append", default=argparse.SUPPRESS,
                                 help=argparse.SUPPRESS)
                _global_options_everywhere(sub)


def _merged(args: argparse.Namespace) -> argparse.Namespace:
    """``--store`` and ``-X`` given after the command join those given before it (the later --store wins)."""
    args.store = getattr(args, "store_after", None) or args.store
    args.settings = [*args.settings, *getattr(args, "settings_after", [])]
    return args


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
        _describe(args, admin, console)
    elif args.action == "scale":
        stream = admin.scale_topic(args.topic, args.partitions).result()
        partitions = list(stream.current.partitions)
        console.print(f"scaled {args.topic}: epoch {stream.current.epoch} has partitions {partitions}")
    else:
        admin.delete_topics([args.topic])[args.topic].result()
        console.print(f"deleted {args.topic}")


def _describe(args: argparse.Namespace, admin: AdminClient, console: Console) -> None:
    """Each partition of every epoch: its epoch, whether sealed, its first and end offsets and record count."""
    topic = admin.list_topics(args.topic).topics[args.topic]
    ids = sorted(topic.partitions)
    low, high = _watermarks(admin, args.topic, ids)
    table = Table(title=args.topic)
    for column in ("partition", "epoch", "state", "low", "high", "records"):
        table.add_column(column, justify="right" if column in ("low", "high", "records") else "left")
    for p in ids:
        meta = topic.partitions[p]
        table.add_row(str(p), str(meta.epoch), "sealed" if meta.sealed else "open", str(low[p]), str(high[p]),
                      str(high[p] - low[p]))
    console.print(table)


def _watermarks(admin: AdminClient, topic: str, partitions: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Each partition's first and end offsets, through the AdminClient's ``list_offsets``."""
    found = []
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions})
        found.append({tp.partition: future.result().offset for tp, future in futures.items()})
    return found[0], found[1]


# -- groups -----------------------------------------------------------------------------------------------------


def _groups(args: argparse.Namespace, url: str, console: Console) -> int:
    admin = AdminClient(_settings(args, url))
    if args.action == "list":
        listing = admin.list_consumer_groups().result()
        table = Table()
        for column in ("group", "state", "members"):
            table.add_column(column)
        for group in sorted(listing.valid or [], key=lambda g: g.group_id):
            described = admin.describe_consumer_groups([group.group_id])[group.group_id].result()
            table.add_row(group.group_id, group.state.name, str(len(described.members)))
        console.print(table)
    elif args.action == "describe":
        _describe_group(admin, args.group, console)
    else:
        _reset_offsets(args, admin, console)
    return 0


def _committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    """The group's offsets once every decided transaction set its own: a reset shifts from them, a lag counts
    from them."""
    request = [ConsumerGroupTopicPartitions(group)]
    found = admin.list_consumer_group_offsets(request, require_stable=True)[group].result().topic_partitions or []
    return {(tp.topic, tp.partition): tp.offset for tp in found}


def _describe_group(admin: AdminClient, group: str, console: Console) -> None:
    """Each partition the group committed or owns: committed offset, end, lag (end - committed) and owner."""
    described = admin.describe_consumer_groups([group])[group].result()
    owners = {(tp.topic, tp.partition): member.member_id for member in described.members
              for tp in member.assignment.topic_partitions}
    committed = _committed(admin, group)
    keys = sorted(set(committed) | set(owners))
    ends: dict[tuple[str, int], int] = {}
    if keys:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({TopicPartition(t, p): latest for t, p in keys})
        ends = {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}
    table = Table(title=f"{group} ({described.state.name}, {len(described.members)} members)")
    for column in ("topic", "partition", "committed", "end", "lag", "owner"):
        table.add_column(column, justify="right" if column in ("partition", "committed", "end", "lag") else "left")
    for key in keys:
        offset, end = committed.get(key), ends[key]
        table.add_row(key[0], str(key[1]), "-" if offset is None else str(offset), str(end),
                      str(end) if offset is None else str(end - offset), owners.get(key, "-"))
    console.print(table)


def _reset_offsets(args: argparse.Namespace, admin: AdminClient, console: Console) -> None:
    """Kafka's ``kafka-consumer-groups --reset-offsets``: print the plan; apply it with ``--execute``."""
    partitions = sorted(admin.list_topics(args.topic).topics[args.topic].partitions)
    if args.partition is not None:
        if args.partition not in partitions:
            fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"{args.topic} has no partition {args.partition}")
        partitions = [args.partition]
    low, high = _watermarks(admin, args.topic, partitions)
    committed = _committed(admin, args.group)
    plan: dict[int, int] = {}
    with _progress(f"planning {args.group} on {args.topic}", unit="partitions") as update:
        for p in partitions:  # one look-up each with --to-datetime: long on a topic of many partitions
            plan[p] = max(low[p], min(high[p], _target(args, admin, p, low[p], high[p], committed)))
            update(len(plan))
    table = Table(title=f"{args.group} on {args.topic}: " + ("reset" if args.execute else "plan (dry run: add "
                                                                                        "--execute to apply)"))
    for column in ("partition", "committed", "new offset"):
        table.add_column(column, justify="right")
    for p, offset in plan.items():
        before = committed.get((args.topic, p))
        table.add_row(str(p), "-" if before is None else str(before), str(offset))
    if args.execute:
        # The AdminClient reads topic, partition and offset of either TopicPartition type.
        request = ConsumerGroupTopicPartitions(args.group, [TopicPartition(args.topic, p, o)  # type: ignore[misc]
                                                            for p, o in plan.items()])
        admin.alter_consumer_group_offsets([request])[args.group].result()
    console.print(table)


def _target(args: argparse.Namespace, admin: AdminClient, partition: int, low: int, high: int,
            committed: dict[tuple[str, int], int]) -> int:
    """Where ``reset-offsets`` moves one partition, before clamping into [low, high]."""
    if args.to_earliest:
        return low
    if args.to_latest:
        return high
    if args.to_offset is not None:
        return int(args.to_offset)
    if args.shift_by is not None:
        return committed.get((args.topic, partition), low) + int(args.shift_by)
    tp = TopicPartition(args.topic, partition)
    found = admin.list_offsets({tp: OffsetSpec.for_timestamp(args.to_datetime)})[tp].result().offset
    return high if found < 0 else found


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


_PROGRESS_EVERY = 1000  # lines between updates of the progress line


@contextlib.contextmanager
def _progress(what: str, unit: str = "records", keep: bool = False,
              show: bool = True) -> Iterator[Callable[[int], None]]:
    """A live count on stderr while a long operation runs, only if stderr is a terminal (quiet when piped) and
    ``show``; yields ``update(count)``. ``keep``: the last count stays on the terminal (else it is erased, for
    the caller's own summary). Nothing else is redirected: stdout stays the caller's, byte for byte."""
    if not show or not sys.stderr.isatty():
        yield lambda count: None
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn(f"{{task.completed}} {unit}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=not keep, redirect_stdout=False,
                  redirect_stderr=False) as progress:
        task = progress.add_task(what, total=None)
        yield lambda count: progress.update(task, completed=count)


def _produce(args: argparse.Namespace, url: str) -> int:
    """Every line read before an error is produced or named as not produced; the count goes to stderr."""
    producer = Producer(_settings(args, url))
    producer.list_topics(args.topic)  # UNKNOWN_TOPIC_OR_PART before any line is read
    tally, read = _Tally(), 0
    try:
        with _progress(f"producing to {args.topic}") as update:
            for number, line in _lines(sys.stdin.buffer):
                _produce_line(producer, args, number, line, tally)
                read = number
                if number % _PROGRESS_EVERY == 0:
                    update(tally.produced)
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


_FORMAT_FIELDS: dict[str, Callable[[Message], bytes]] = {
    "s": lambda m: m.value() or b"",
    "k": lambda m: m.key() or b"",
    "S": lambda m: str(len(m.value() or b"")).encode(),
    "K": lambda m: str(len(m.key() or b"")).encode(),
    "t": lambda m: (m.topic() or "").encode(),
    "p": lambda m: str(m.partition()).encode(),
    "o": lambda m: str(m.offset()).encode(),
    "T": lambda m: str(m.timestamp()[1]).encode(),
    "h": lambda m: b",".join(name.encode() + b"=" + (value or b"") for name, value in m.headers() or []),
    "%": lambda m: b"%",
}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _compile_format(fmt: str) -> list[str | Callable[[Message], bytes]]:
    """kcat's ``-f`` format as literal pieces and field getters; an unknown ``%x`` is _INVALID_ARG."""
    pieces: list[str | Callable[[Message], bytes]] = []
    i = 0
    while i < len(fmt):
        char, following = fmt[i], fmt[i + 1] if i + 1 < len(fmt) else ""
        if char == "%":
            if following not in _FORMAT_FIELDS:
                fail(ErrorCode._INVALID_ARG, f"--format {fmt!r}: unknown placeholder %{following} (known: "
                     f"{' '.join('%' + k for k in _FORMAT_FIELDS)})")
            pieces.append(_FORMAT_FIELDS[following])
            i += 2
        elif char == "\\" and following in _ESCAPES:
            pieces.append(_ESCAPES[following])
            i += 2
        else:
            pieces.append(char)
            i += 1
    return pieces


def _render(args: argparse.Namespace, message: Message) -> bytes:
    """One record's output: ``--format`` as kcat's, else the value (``KEY<TAB>VALUE`` with --print-key) and a
    newline."""
    if args.format is not None:
        return b"".join(piece.encode() if isinstance(piece, str) else piece(message) for piece in args.format)
    value, key = message.value() or b"", message.key() or b""
    return (key + b"\t" + value if args.print_key else value) + b"\n"


def _write(args: argparse.Namespace, message: Message) -> None:
    """Print one record: UTF-8 text (undecodable bytes replaced), or its exact bytes with ``--binary``."""
    out = _render(args, message)
    if args.binary:
        sys.stdout.buffer.write(out)
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(out.decode(errors="replace"))
        sys.stdout.flush()


def _consume(args: argparse.Namespace, url: str) -> int:
    if args.timeout is not None and args.timeout < 0:
        fail(ErrorCode._INVALID_ARG, f"--timeout {args.timeout:g}: expected idle seconds >= 0 (leave it out to wait "
             "for records forever)")
    if args.group and (args.offset is not None or args.partition is not None):
        fail(ErrorCode._INVALID_ARG, "--offset and --partition read without a group: a group reads the partitions "
             "it is assigned from its committed offsets (move them with `groups reset-offsets`)")
    if args.format is not None:
        args.format = _compile_format(args.format)
    start = "beginning" if args.from_beginning else args.offset
    conf = {"auto.offset.reset": "earliest" if start == "beginning" else "latest"}
    if args.exit_at_end:
        conf["enable.partition.eof"] = "true"
    consumer = _reader(args, url, args.group, **conf)
    try:
        if not args.topic.startswith("^"):
            consumer.list_topics(args.topic)  # UNKNOWN_TOPIC_OR_PART, with or without a group
        if args.group:
            consumer.subscribe([args.topic])
        else:
            consumer.assign(_starts(args, consumer, start))
        # The count goes to a terminal only while the records do not (they show themselves there).
        with _progress(f"consuming from {args.topic}", keep=True, show=not sys.stdout.isatty()) as update:
            _print_records(args, consumer, update)
    finally:
        consumer.close()
    return 0


def _starts(args: argparse.Namespace, consumer: Consumer, start: str | None) -> list[TopicPartition]:
    """The partitions to read (``--partition`` or all) and where each starts, as kcat's ``-o``."""
    partitions = sorted(consumer.list_topics(args.topic).topics[args.topic].partitions)
    if args.partition is not None:
        if args.partition not in partitions:
            fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"{args.topic} has no partition {args.partition}")
        partitions = [args.partition]
    tps = [TopicPartition(args.topic, p) for p in partitions]
    if start is None:
        return tps  # as auto.offset.reset says: the end
    if start == "end":
        return [TopicPartition(args.topic, p, OFFSET_END) for p in partitions]
    if start == "beginning":
        return [TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in partitions]
    if start.startswith("s@") and start[2:].isdigit():
        return consumer.offsets_for_times([TopicPartition(args.topic, p, int(start[2:])) for p in partitions])
    try:
        offset = int(start)
    except ValueError:
        fail(ErrorCode._INVALID_ARG, f"--offset {start!r}: expected beginning, end, N, -N or s@MS")
    if offset >= 0:
        return [TopicPartition(args.topic, p, offset) for p in partitions]
    return [TopicPartition(tp.topic, tp.partition, max(low, high + offset))
            for tp in tps for low, high in [consumer.get_watermark_offsets(tp)]]


def _print_records(args: argparse.Namespace, consumer: Consumer, update: Callable[[int], None]) -> None:
    """Write records until ``--max-messages``, ``--timeout`` idle seconds or, with ``-e``, the end of every
    assigned partition; ``update`` hears the count every :data:`_PROGRESS_EVERY` records, when idle, and last."""
    seen = 0
    at_end: set[tuple[str, int]] = set()
    try:
        while args.max_messages is None or seen < args.max_messages:
            message = consumer.poll(args.timeout if args.timeout is not None else 1.0)
            if message is None:
                if args.timeout is not None:
                    return
                update(seen)
                continue
            error = message.error()
            if error is not None:
                if error.code() == ErrorCode._PARTITION_EOF:
                    at_end.add((message.topic() or args.topic, message.partition() or 0))
                    assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
                    if args.exit_at_end and assigned and assigned <= at_end:
                        return
                    continue
                raise KafkaException(error)
            at_end.discard((message.topic() or args.topic, message.partition() or 0))
            try:
                _write(args, message)
            except BrokenPipeError:
                # Not delivered: a group reads it again (close() commits the position this seek sets).
                consumer.seek(TopicPartition(message.topic() or args.topic, message.partition() or 0,
                                             message.offset() or 0))
                raise
            seen += 1
            if seen % _PROGRESS_EVERY == 0:
                update(seen)
    finally:
        update(seen)


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
    if args.command == "groups":
        return _groups(args, url, console)
    if args.command == "produce":
        return _produce(args, url)
    return _consume(args, url)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = _merged(_parser().parse_args(argv))
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
