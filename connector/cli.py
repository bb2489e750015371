"""The ``onceflow`` command line: topics, produce, consume, and the main job (``run``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from onceflow.connector.admin import AdminClient
from onceflow.connector.config import DEFAULT_STORE_URL
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.topic import NewTopic, TopicPartition

STORE_ENV = "ONCEFLOW_STORE_URL"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description="Exactly-once data movement on Kafka-style logs.")
    parser.add_argument("--store", default=os.environ.get(STORE_ENV, DEFAULT_STORE_URL),
                        help=f"store.url (default: ${STORE_ENV} or {DEFAULT_STORE_URL})")
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

    produce = commands.add_parser("produce", help="append stdin lines as records")
    produce.add_argument("topic")
    produce.add_argument("--key-separator", help="split each line into key and value at this separator")
    produce.add_argument("--partition", type=int, default=-1)

    consume = commands.add_parser("consume", help="print records as they arrive")
    consume.add_argument("topic")
    consume.add_argument("--group", help="consumer group (commits offsets)")
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--max-messages", type=int, help="stop after this many records")
    consume.add_argument("--timeout", type=float, help="stop after this many idle seconds")
    consume.add_argument("--print-key", action="store_true")

    run = commands.add_parser("run", help="the main job: CAS racers and a fenced zombie, verified")
    run.add_argument("--racers", type=int, default=4)
    run.add_argument("--operations", type=int, default=500, help="successful appends per racer")
    return parser


def _settings(args: argparse.Namespace) -> dict[str, str]:
    """``store.url`` and every ``-X key=value``."""
    conf = {"store.url": args.store}
    for item in args.settings:
        name, sep, value = item.partition("=")
        if not sep:
            raise KafkaException(KafkaError(ErrorCode.INVALID_CONFIG, f"-X {item!r}: expected KEY=VALUE"))
        conf[name] = value
    return conf


def _topics(args: argparse.Namespace, console: Console) -> None:
    admin = AdminClient({"store.url": args.store})
    if args.action == "create":
        admin.create_topics([NewTopic(args.topic, args.partitions)])[args.topic].result()
        console.print(f"created {args.topic} with {args.partitions} partitions")
    elif args.action == "list":
        for name in sorted(admin.list_topics().topics):
            console.print(name, highlight=False)
    elif args.action == "describe":
        topic = admin.list_topics(args.topic).topics[args.topic]
        consumer = Consumer({"store.url": args.store})
        table = Table(title=args.topic)
        for column in ("partition", "epoch", "state", "low", "high"):
            table.add_column(column)
        for p in topic.partitions.values():
            low, high = consumer.get_watermark_offsets(TopicPartition(args.topic, p.id))
            table.add_row(str(p.id), str(p.epoch), "sealed" if p.sealed else "open", str(low), str(high))
        console.print(table)
    elif args.action == "scale":
        stream = admin.scale_topic(args.topic, args.partitions).result()
        partitions = list(stream.current.partitions)
        console.print(f"scaled {args.topic}: epoch {stream.current.epoch} has partitions {partitions}")
    else:
        admin.delete_topics([args.topic])[args.topic].result()
        console.print(f"deleted {args.topic}")


def _produce(args: argparse.Namespace) -> int:
    producer = Producer(_settings(args))
    failures: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(err)

    for line in sys.stdin:
        text = line.rstrip("\n")
        key = None
        if args.key_separator and args.key_separator in text:
            key, text = text.split(args.key_separator, 1)
        producer.produce(args.topic, text, key=key, partition=args.partition, on_delivery=report)
        producer.poll(0)
    producer.flush()
    if failures:
        raise KafkaException(failures[0])
    return 0


def _consume(args: argparse.Namespace) -> int:
    conf = {**_settings(args), "auto.offset.reset": "earliest" if args.from_beginning else "latest"}
    consumer = Consumer({**conf, "group.id": args.group} if args.group else conf)
    if args.group:
        consumer.subscribe([args.topic])
    else:
        partitions = consumer.list_topics(args.topic).topics[args.topic].partitions
        consumer.assign([TopicPartition(args.topic, p) for p in partitions])
    seen = 0
    try:
        while args.max_messages is None or seen < args.max_messages:
            message = consumer.poll(args.timeout if args.timeout is not None else 1.0)
            if message is None:
                if args.timeout is not None:
                    break
                continue
            if message.error() is not None:
                raise KafkaException(message.error())  # type: ignore[arg-type]
            value = (message.value() or b"").decode(errors="replace")
            key = (message.key() or b"").decode(errors="replace")
            print(f"{key}\t{value}" if args.print_key else value, flush=True)
            seen += 1
    finally:
        consumer.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    try:
        if args.command == "topics":
            _topics(args, console)
            return 0
        if args.command == "produce":
            return _produce(args)
        if args.command == "consume":
            return _consume(args)
        from onceflow.connector.cas_ledger import run

        return 0 if run(args.store, args.racers, args.operations, console) else 1
    except KafkaException as exc:
        print(f"onceflow: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
