"""The ``kafka2pc`` connection form, in one place: the provider info and the hook both read it.

Plain data (no Airflow import): ``get_provider_info`` is read by Airflow without loading hooks.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.txn.kafka.config import SASL_MECHANISMS, SECURITY_PROTOCOLS
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S

# Keys of a kafka2pc connection's extra that are not librdkafka settings.
EXTRA_SECURITY_PROTOCOL = "security_protocol"
EXTRA_SASL_MECHANISM = "sasl_mechanism"
EXTRA_DECISION_TOPIC = "decision_topic"
EXTRA_CONFIG = "config"
EXTRA_CONNECT_TIMEOUT = "connect_timeout_s"

# Airflow 3's UI renders these (JSON schema ``enum`` -> a drop-down); the classic form is built
# from the same entries by Kafka2PCHook.get_connection_form_widgets. Airflow 3's form saves every
# field's value into the extra, null included, and offers a "null" choice for an enum that lists
# None; so every field has a default and no enum lists None: an unset SASL mechanism is the explicit
# "" choice "none" (the hook ignores empty values), the librdkafka settings default to {}.
NO_SASL = ""
CONN_FIELDS: dict[str, dict[str, Any]] = {
    EXTRA_SECURITY_PROTOCOL: {
        "label": "Security protocol",
        "description": "How clients reach the brokers",
        "schema": {"type": "string", "enum": list(SECURITY_PROTOCOLS), "default": "PLAINTEXT"},
    },
    EXTRA_SASL_MECHANISM: {
        "label": "SASL mechanism",
        "description": "With SASL_PLAINTEXT or SASL_SSL; OAUTHBEARER takes its sasl.oauthbearer.* settings below",
        "schema": {
            # Not required (a required field refuses ""), yet no "null" among the choices.
            "type": ["string", "null"],
            "enum": [NO_SASL, *SASL_MECHANISMS],
            "values_display": {NO_SASL: "none (PLAINTEXT or SSL)"},
            "default": NO_SASL,
        },
    },
    EXTRA_DECISION_TOPIC: {
        "label": "Decision topic",
        "description": "Compacted topic holding the commit decisions (created if missing)",
        "schema": {"type": "string", "default": DEFAULT_DECISION_TOPIC},
    },
    EXTRA_CONNECT_TIMEOUT: {
        "label": "Connect timeout (s)",
        "description": "How long the Test button, the tasks, the exporters page and the CLI wait for a broker "
        "to answer before saying why Kafka cannot be reached",
        "schema": {"type": "number", "exclusiveMinimum": 0, "default": DEFAULT_CONNECT_TIMEOUT_S},
    },
    EXTRA_CONFIG: {
        "label": "librdkafka settings",
        "description": 'Further client settings, e.g. {"ssl.ca.location": "/etc/ssl/ca.pem"}',
        "schema": {"type": "object", "default": {}},
    },
}

# Schema means nothing to Kafka. Port is shown, as the Spark provider's form shows it: the port of
# every bootstrap host that names none. Airflow 3.3.2's row Test button sends ``port: 0`` for a
# connection stored without a port and then refuses to test it ("The host or port to test differs
# from the stored connection"); a connection made in the form with its Port tests fine.
HIDDEN_FIELDS = ["schema"]
RELABELING = {"host": "Bootstrap servers", "port": "Port", "login": "SASL username", "password": "SASL password"}
PLACEHOLDERS = {"host": "broker1.example.com,broker2.example.com", "port": "9092"}

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
