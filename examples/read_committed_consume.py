"""Transactions as readers see them: of a committed, an aborted and another committed transaction, a
``read_committed`` consumer reads the committed records only.

Usage: python read_committed_consume.py SERVER TOPIC

A confluent-kafka program: only the import line and the server's config key differ (see README.md).
"""

import sys

from onceflow.connector import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition


def write_transaction(producer: Producer, topic: str, values: list[str], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode(), partition=0)
    if commit:
        producer.commit_transaction()
    else:
        producer.flush()  # the records are written, then aborted: readers must never see them
        producer.abort_transaction()


def main(server: str, topic: str) -> None:
    producer = Producer({"store.url": server, "transactional.id": f"example-{topic}"})
    producer.init_transactions()
    write_transaction(producer, topic, ["first-1", "first-2"], commit=True)
    write_transaction(producer, topic, ["aborted-1", "aborted-2"], commit=False)
    write_transaction(producer, topic, ["second-1"], commit=True)

    consumer = Consumer({"store.url": server, "group.id": f"{topic}-reader", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    while True:
        msg = consumer.poll(timeout=10.0)
        if msg is None:
            raise SystemExit("no end-of-partition event within 10 s")
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                break  # read everything committed so far
            raise KafkaException(msg.error())
        print(msg.value().decode())
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
