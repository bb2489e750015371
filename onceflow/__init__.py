"""onceflow: exactly-once data movement on Kafka-compatible logs.

Every import name lives under this package: ``onceflow.connector`` (errors, config, stores and the
confluent-kafka-shaped clients), ``onceflow.txn`` (transactions), ``onceflow.schemas``, ``onceflow.spark_sinks``
and ``onceflow.integration`` (brokers and checkers for tests). The repository keeps those folders at its top;
the entries here link to them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("onceflow")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"
