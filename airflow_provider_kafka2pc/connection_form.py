"""The ``kafka2pc`` connection form, in one place: the provider info and the hook both read it.

Plain data (no Airflow import): ``get_provider_info`` is read by Airflow without loading hooks.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.txn.config import SASL_MECHANISMS, SECURITY_PROTOCOLS
from airflow_provider_kafka2pc.txn.decision_log import DEFAULT_DECISION_TOPIC

# Keys of a kafka2pc connection's extra that are not librdkafka settings.
EXTRA_SECURITY_PROTOCOL = "security_protocol"
EXTRA_SASL_MECHANISM = "sasl_mechanism"
EXTRA_DECISION_TOPIC = "decision_topic"
EXTRA_CONFIG = "config"

# Airflow 3's UI renders these (JSON schema ``enum`` → a drop-down); the classic form is built
# from the same entries by Kafka2PCHook.get_connection_form_widgets.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    EXTRA_SECURITY_PROTOCOL: {
        "label": "Security protocol",
        "description": "How clients reach the brokers",
        "schema": {"type": ["string", "null"], "enum": [*SECURITY_PROTOCOLS, None], "default": "PLAINTEXT"},
    },
    EXTRA_SASL_MECHANISM: {
        "label": "SASL mechanism",
        "description": "With SASL_PLAINTEXT or SASL_SSL; OAUTHBEARER takes its sasl.oauthbearer.* settings below",
        "schema": {"type": ["string", "null"], "enum": [*SASL_MECHANISMS, None]},
    },
    EXTRA_DECISION_TOPIC: {
        "label": "Decision topic",
        "description": "Compacted topic holding the commit decisions (created if missing)",
        "schema": {"type": ["string", "null"], "default": DEFAULT_DECISION_TOPIC},
    },
    EXTRA_CONFIG: {
        "label": "librdkafka settings",
        "description": 'Further client settings, e.g. {"ssl.ca.location": "/etc/ssl/ca.pem"}',
        "schema": {"type": ["object", "null"]},
    },
}

# Port is folded into the host ("broker:9092"), schema means nothing to Kafka.
HIDDEN_FIELDS = ["schema", "port"]
RELABELING = {"host": "Bootstrap servers", "login": "SASL username", "password": "SASL password"}
PLACEHOLDERS = {"host": "broker1:9092,broker2:9092"}

# librdkafka setting -> the form field a mistake in it is fixed in.
_FIELD_OF_SETTING: dict[str, str] = {
    "bootstrap.servers": RELABELING["host"],
    "security.protocol": str(CONN_FIELDS[EXTRA_SECURITY_PROTOCOL]["label"]),
    "sasl.mechanism": str(CONN_FIELDS[EXTRA_SASL_MECHANISM]["label"]),
    "sasl.mechanisms": str(CONN_FIELDS[EXTRA_SASL_MECHANISM]["label"]),
    "sasl.username": RELABELING["login"],
    "sasl.password": RELABELING["password"],
}


def field_of_setting(key: str, official_kafka: bool = False) -> str:
    """The form field that holds librdkafka setting ``key`` (an official kafka connection: its extra)."""
    if official_kafka:
        return "Extra"
    return _FIELD_OF_SETTING.get(key, str(CONN_FIELDS[EXTRA_CONFIG]["label"]))
