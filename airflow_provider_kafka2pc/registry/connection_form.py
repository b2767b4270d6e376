"""The schema registry connection's form, in one place: the provider info and the hook both read it.

Plain data (no Airflow import). Host is the registry's URL, with its path (Apicurio Registry:
``.../apis/ccompat/v7``); the password field holds the basic-auth password, or the bearer token when
the authentication choice says so, so that Airflow masks it wherever a connection is shown.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.registry.client import DEFAULT_TIMEOUT_S

CONN_TYPE = "kafka2pc_schema_registry"
HOOK_NAME = "Schema registry (kafka2pc)"

EXTRA_AUTH = "auth"
EXTRA_CA_FILE = "ca_file"
EXTRA_TIMEOUT = "timeout_s"
AUTH_BASIC = "basic"
AUTH_BEARER = "bearer"
AUTH_CHOICES = (AUTH_BASIC, AUTH_BEARER)

CONN_FIELDS: dict[str, dict[str, Any]] = {
    EXTRA_AUTH: {
        "label": "Authentication",
        "description": "basic: the login and password; bearer: the password field holds the token (no login)",
        "schema": {"type": "string", "enum": list(AUTH_CHOICES), "default": AUTH_BASIC},
    },
    EXTRA_CA_FILE: {
        "label": "CA file",
        "description": "PEM file of the CA that signed the registry's certificate, if not a public one",
        "schema": {"type": ["string", "null"], "default": ""},
    },
    EXTRA_TIMEOUT: {
        "label": "Timeout (s)",
        "description": "How long each request to the registry may take",
        "schema": {"type": "number", "exclusiveMinimum": 0, "default": DEFAULT_TIMEOUT_S},
    },
}
# Port is shown, as on the Kafka form: Airflow 3.3.2's row Test button refuses a connection stored
# without one. It is used only when the URL names no port.
HIDDEN_FIELDS = ["schema"]
RELABELING = {
    "host": "Registry URL",
    "port": "Port (if not in the URL)",
    "login": "Login (basic auth)",
    "password": "Password or bearer token",
}
PLACEHOLDERS = {"host": "https://registry.example.com/apis/ccompat/v7", "port": "8081", "login": "exporter"}

__all__ = ["CONN_FIELDS", "CONN_TYPE", "HIDDEN_FIELDS", "HOOK_NAME", "PLACEHOLDERS", "RELABELING"]
