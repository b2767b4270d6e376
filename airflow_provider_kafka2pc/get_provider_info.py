"""The provider's self-description, read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from airflow_provider_kafka2pc import __version__
from airflow_provider_kafka2pc.connection_form import CONN_FIELDS, HIDDEN_FIELDS, PLACEHOLDERS, RELABELING
from airflow_provider_kafka2pc.registry import connection_form as registry_form

_PKG = "airflow_provider_kafka2pc"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-kafka2pc",
        "name": "kafka2pc",
        "description": "Exactly-once export of Spark DataFrames to Apache Kafka: Kafka transactions as "
        "two-phase-commit participants, the DAG run as the coordinator.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "kafka2pc",
                "external-doc-url": "https://kafka.apache.org/documentation/#semantics",
                "tags": ["apache"],
            }
        ],
        "operators": [
            {
                "integration-name": "kafka2pc",
                "python-modules": [
                    f"{_PKG}.operators.export",
                    f"{_PKG}.operators.commit",
                    f"{_PKG}.operators.abort",
                    f"{_PKG}.operators.create_topic",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "kafka2pc", "python-modules": [f"{_PKG}.sensors.recovery", f"{_PKG}.sensors.handoff"]}
        ],
        "hooks": [
            {
                "integration-name": "kafka2pc",
                "python-modules": [f"{_PKG}.hooks.kafka2pc", f"{_PKG}.hooks.schema_registry"],
            }
        ],
        "triggers": [
            {
                "integration-name": "kafka2pc",
                "python-modules": [f"{_PKG}.triggers.recovery", f"{_PKG}.triggers.handoff"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": f"{_PKG}.hooks.kafka2pc.Kafka2PCHook",
                "hook-name": "Kafka exactly-once export (kafka2pc)",
                "connection-type": "kafka2pc",
                "ui-field-behaviour": {
                    "hidden-fields": list(HIDDEN_FIELDS),
                    "relabeling": dict(RELABELING),
                    "placeholders": dict(PLACEHOLDERS),
                },
                "conn-fields": deepcopy(CONN_FIELDS),
            },
            {
                "hook-class-name": f"{_PKG}.hooks.schema_registry.SchemaRegistryHook",
                "hook-name": registry_form.HOOK_NAME,
                "connection-type": registry_form.CONN_TYPE,
                "ui-field-behaviour": {
                    "hidden-fields": list(registry_form.HIDDEN_FIELDS),
                    "relabeling": dict(registry_form.RELABELING),
                    "placeholders": dict(registry_form.PLACEHOLDERS),
                },
                "conn-fields": deepcopy(registry_form.CONN_FIELDS),
            },
        ],
    }
