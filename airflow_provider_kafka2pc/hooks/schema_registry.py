"""SchemaRegistryHook: a ``kafka2pc_schema_registry`` connection turned into registry settings and a client.

The connection's parts (``registry_settings``) are pure and unit-tested; the password (or bearer
token) goes only into the client's ``Authorization`` header: never logged, never in XCom, never in
``repr`` (``RegistrySettings`` hides it).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.connection_hook import ConnectionHook
from airflow_provider_kafka2pc.registry.client import DEFAULT_TIMEOUT_S, RegistryClient, RegistrySettings
from airflow_provider_kafka2pc.registry.connection_form import (
    AUTH_BASIC,
    AUTH_BEARER,
    AUTH_CHOICES,
    CONN_FIELDS,
    CONN_TYPE,
    EXTRA_AUTH,
    EXTRA_CA_FILE,
    EXTRA_TIMEOUT,
    HIDDEN_FIELDS,
    HOOK_NAME,
    PLACEHOLDERS,
    RELABELING,
)
from airflow_provider_kafka2pc.registry.errors import RegistryConfigError
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow.sdk import Connection


def registry_settings(
    host: str | None, port: int | None, login: str | None, password: str | None, extra: Mapping[str, Any]
) -> RegistrySettings:
    """The registry settings of a connection, from its parts (pure: unit-testable without Airflow)."""
    if not host:
        raise Kafka2PCConfigError(RELABELING["host"], "the connection names no registry URL")
    parts = urllib.parse.urlsplit(host if "://" in host else f"http://{host}")
    try:
        has_port = parts.port is not None
    except ValueError as e:
        raise Kafka2PCConfigError(RELABELING["host"], str(e)) from None
    if port and not has_port:
        parts = parts._replace(netloc=f"{parts.netloc}:{port}")
    url = urllib.parse.urlunsplit(parts)
    auth = str(extra.get(EXTRA_AUTH) or AUTH_BASIC)
    if auth not in AUTH_CHOICES:
        raise Kafka2PCConfigError(str(CONN_FIELDS[EXTRA_AUTH]["label"]), f"choose one of {list(AUTH_CHOICES)}")
    timeout = extra.get(EXTRA_TIMEOUT)
    try:
        seconds = DEFAULT_TIMEOUT_S if timeout in (None, "") else float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise Kafka2PCConfigError(str(CONN_FIELDS[EXTRA_TIMEOUT]["label"]), f"must be seconds > 0, got {timeout!r}")
    if auth == AUTH_BEARER and login:
        raise Kafka2PCConfigError(RELABELING["login"], "leave it empty with bearer authentication")
    try:
        return RegistrySettings(
            url=url,
            username=(login or None) if auth == AUTH_BASIC else None,
            password=(password or None) if auth == AUTH_BASIC else None,
            bearer_token=(password or None) if auth == AUTH_BEARER else None,
            ca_file=str(extra.get(EXTRA_CA_FILE) or "") or None,
            timeout_s=seconds,
        )
    except RegistryConfigError as e:
        raise Kafka2PCConfigError(RELABELING["host"], str(e)) from None


class SchemaRegistryHook(ConnectionHook):
    """A Confluent-compatible schema registry for kafka2pc's key and value formats.

    :param schema_registry_conn_id: a ``kafka2pc_schema_registry`` connection: host = the registry's
        URL, login/password = basic auth (or the password field holds a bearer token), extra fields
        for the authentication choice, a CA file and the request timeout.
    """

    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = "kafka2pc_schema_registry_default"
    conn_type = CONN_TYPE
    hook_name = HOOK_NAME
    conn_fields = CONN_FIELDS

    def __init__(self, schema_registry_conn_id: str = default_conn_name, connection: Connection | None = None) -> None:
        super().__init__(connection)
        self.schema_registry_conn_id = schema_registry_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": list(HIDDEN_FIELDS),
            "relabeling": dict(RELABELING),
            "placeholders": dict(PLACEHOLDERS),
        }

    def settings(self) -> RegistrySettings:
        c = self.connection
        return registry_settings(c.host, c.port, c.login, c.password, c.extra_dejson)

    def get_conn(self) -> RegistryClient:
        return RegistryClient(self.settings())

    def test_connection(self) -> tuple[bool, str]:
        """Ask the registry for its subjects and global compatibility level (the UI's Test button)."""
        try:
            settings = self.settings()
        except Kafka2PCConfigError as e:
            return False, f"configuration mistake, the registry was not contacted: {e}"
        client = RegistryClient(settings)
        try:
            subjects = client.subjects()
            level = client.compatibility_level()
        except Kafka2PCError as e:  # written for the user: unreachable, refused, or the registry's answer
            return False, str(e)
        except Exception as e:  # reported to the user, not raised: this is what the Test button shows
            return False, f"{type(e).__name__}: {e}"
        return True, f"connected to {settings.base_url}: {len(subjects)} subject(s), global compatibility {level}"


__all__ = ["SchemaRegistryHook", "registry_settings"]
