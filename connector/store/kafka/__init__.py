"""The Kafka backend (``kafka://host:port[,host:port...][/namespace]``), on confluent-kafka.

Mapping:
- A stream's epoch 0 is the Kafka topic of the stream's name (prefixed ``namespace.`` if the URL has one), so
  plain Kafka consumers read it as usual; epoch ``e`` >= 1 is the topic ``<that name>.epoch-<e>``. Partition ids
  are global across epochs, as on every backend. A scale records each old partition's end offset in the
  catalog (:mod:`.catalog`); records that land past it are hidden from onceflow readers
  and their writer is told ``PARTITION_SEALED``.
- Plain appends use Kafka's idempotent producer. A ``writer.id`` is a ``transactional.id``: a newer writer
  fences the older one at ``init_transactions``, and each append is one Kafka transaction.
- CAS appends go through a fenced owner per partition (``transactional.id`` ``onceflow-cas-<topic>-<p>``): it
  reads the tail after fencing and checks the expectation before each transactional write, so of two racing
  writers at least one fails. A writer keeps its ownership until a rival takes it, and checks an expectation
  that matches what its own last append left without reading the tail again (a rival must fence it first; a
  plain append in between makes the write land elsewhere, which aborts it). A commit whose outcome the broker
  does not tell (an EndTxn error, a timeout) is decided by reading the transaction's first record back.
  Offsets are Kafka's: a transactional write is followed by a commit marker, so offsets after one are not dense.
- Consumer groups are Kafka's own (:mod:`.group`); committed offsets live in Kafka's group
  coordinator.

Needs Kafka 2.5+ features: idempotent and transactional producers, ``read_committed``.

Modules: :mod:`.store` (streams, reads, groups' offsets), :mod:`.writer` (the four ways to write), :mod:`.reader`
(partitions by offset, a tail's true end and last sequence), :mod:`.catalog`, :mod:`.group` (consumer group
members), :mod:`.probe` (does the broker hide aborted records?), :mod:`.clients` (confluent-kafka calls: errors,
retries through leader changes, topic creation).
"""

from onceflow.connector.store.kafka.store import KafkaStore

__all__ = ["KafkaStore"]
