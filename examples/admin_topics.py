"""Create topics, describe them and look up their offsets with the AdminClient.

Usage: python admin_topics.py SERVER TOPIC [TOPIC ...]

A confluent-kafka program: only the import lines and the server's config key (``store.url`` here,
``bootstrap.servers`` for confluent-kafka) differ from the original (see README.md).
"""

import sys
import time

from onceflow.connector import KafkaError, KafkaException, TopicCollection, TopicPartition
from onceflow.connector.admin import AdminClient, NewTopic, OffsetSpec

NOT_READY = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION)


def results(request, attempts: int = 50) -> dict:
    """Every future's result of an admin request, asked again while the topics are not ready: on a Kafka cluster
    a new topic's partitions get their leaders a moment after create_topics() completes."""
    for attempt in range(attempts):
        try:
            return {key: future.result() for key, future in request().items()}
        except KafkaException as exc:
            if exc.args[0].code() not in NOT_READY or attempt == attempts - 1:
                raise
            time.sleep(0.2)
    return {}


def main(server: str, topics: list[str]) -> None:
    admin = AdminClient({"store.url": server})
    new_topics = [NewTopic(topic, num_partitions=3) for topic in topics]
    for topic, future in admin.create_topics(new_topics).items():
        future.result()  # raises KafkaException if the topic could not be created
        print(f"created {topic}")

    for description in results(lambda: admin.describe_topics(TopicCollection(topics))).values():
        print(f"{description.name}: partitions {[p.id for p in description.partitions]}")

    latest = {TopicPartition(topic, p): OffsetSpec.latest() for topic in topics for p in range(3)}
    for tp, info in sorted(results(lambda: admin.list_offsets(latest)).items()):
        print(f"{tp.topic}[{tp.partition}] ends at offset {info.offset}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
