"""The Airflow layer's exceptions, in one place (the core's are in ``txn.protocol.errors`` and
``txn.kafka.errors``, Spark's in ``spark.errors``). Each is a ``Kafka2PCError`` or a client
settings error, so a user catches them as the core's."""

from __future__ import annotations

from airflow_provider_kafka2pc.txn.kafka.errors import ClientConfigError
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError


class Kafka2PCConfigError(ClientConfigError):
    """The connection cannot be turned into a Kafka client config; ``field`` is the form field to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"connection field {field!r}: {message}")
        self.field = field


class PoolingNeedsOneActiveRunError(Kafka2PCError):
    """POOLING ids are shared by every run of the exporter: two runs at once would fence each other."""


class KafkaSourceNeedsOneActiveRunError(Kafka2PCError):
    """Two runs of a Kafka-sourced export at once would read the same range of its group."""


class ConnectionMismatchError(Kafka2PCError):
    """Committables prepared on one Kafka connection cannot be ended through another."""


class RecoveryError(Kafka2PCError):
    """The recovery trigger failed; its message says why."""


class HandoffWaitError(Kafka2PCError):
    """The handoff trigger failed; its message says why."""


__all__ = [
    "ConnectionMismatchError",
    "HandoffWaitError",
    "Kafka2PCConfigError",
    "KafkaSourceNeedsOneActiveRunError",
    "PoolingNeedsOneActiveRunError",
    "RecoveryError",
]
