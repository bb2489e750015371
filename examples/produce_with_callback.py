"""Produce records and learn where each one landed from its delivery callback.

Usage: python produce_with_callback.py SERVER TOPIC COUNT

A confluent-kafka program: only the import line and the server's config key differ (see README.md).
"""

import sys

from onceflow.connector import KafkaError, Message, Producer


def delivery_report(err: KafkaError | None, msg: Message) -> None:
    """Called once per record, from poll() or flush(): with an error, or with where the record landed."""
    if err is not None:
        print(f"delivery of {msg.key()} failed: {err}")
    else:
        print(f"{msg.key().decode()} delivered to {msg.topic()}[{msg.partition()}] at offset {msg.offset()}")


def main(server: str, topic: str, count: int) -> None:
    producer = Producer({"store.url": server, "client.id": "example-producer"})
    for i in range(count):
        producer.produce(topic, value=f"value-{i}".encode(), key=f"key-{i}".encode(), partition=i % 3,
                         on_delivery=delivery_report)
        producer.poll(0)  # serve the delivery callbacks of records already delivered
    remaining = producer.flush(30)
    print(f"{remaining} records left undelivered")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
