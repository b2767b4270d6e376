"""``kafka2pc``: look at and resolve one exporter's transactions from a shell, without Airflow.

``arguments`` is the command line, ``client_settings`` where the client settings come from,
``commands`` reads Kafka and the decision log and builds each command's report; ``render`` prints it.
"""

from airflow_provider_kafka2pc.cli.arguments import (
    ENV_BOOTSTRAP,
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_OPEN,
    EXIT_SOURCE_BEHIND,
    EXIT_USAGE,
)
from airflow_provider_kafka2pc.cli.commands import main
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients as Connection

__all__ = [
    "ENV_BOOTSTRAP",
    "EXIT_FAILED",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_OPEN",
    "EXIT_SOURCE_BEHIND",
    "EXIT_USAGE",
    "Connection",
    "main",
]
