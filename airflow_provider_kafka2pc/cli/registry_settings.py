"""Where ``kafka2pc repair`` finds the schema registry of an export's key and value formats.

A run exported with ``key_format`` or ``value_format`` recorded digests of the registry-framed bytes
(magic byte, schema id, payload): its repair must frame the records again for the same registry, so
the command takes the export's format objects and that registry, either as an Airflow connection
(``--schema-registry-conn-id``, found where ``--conn-id`` finds Kafka's, mapped by the tasks' own
hook) or as a URL with its credentials in a file (``--schema-registry-config-file``, confluent's
names, one KEY=VALUE a line), never on the command line, where any user of the host could read them.
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import TYPE_CHECKING

from airflow_provider_kafka2pc.cli.arguments import UsageError
from airflow_provider_kafka2pc.txn.kafka.config import properties_lines

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.registry.client import RegistrySettings
    from airflow_provider_kafka2pc.registry.formats import RegistryFormat
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats

BASIC_AUTH = "basic.auth.user.info"  # USER:PASSWORD
BASIC_SOURCE = "basic.auth.credentials.source"  # confluent's files name it; only USER_INFO is meant here
BEARER_TOKEN = "bearer.auth.token"
CA_FILE = "ssl.ca.location"
TIMEOUT = "timeout"  # seconds (confluent's client counts them so too)
FILE_KEYS = (BASIC_AUTH, BASIC_SOURCE, BEARER_TOKEN, CA_FILE, TIMEOUT)


def record_formats(
    args: argparse.Namespace, key: RegistryFormat | None, value: RegistryFormat | None
) -> RecordFormats | None:
    """The formats with their registry, or None when the export had none."""
    given = args.schema_registry_conn_id or args.schema_registry_url or args.schema_registry_config_file
    if key is None and value is None:
        if given:
            raise UsageError("a schema registry was given without --key-format or --value-format: give the export's")
        return None
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats

    return RecordFormats(registry_settings(args), key=key, value=value)


def registry_settings(args: argparse.Namespace) -> RegistrySettings:
    from airflow_provider_kafka2pc.registry.client import RegistrySettings
    from airflow_provider_kafka2pc.registry.errors import RegistryConfigError

    if args.schema_registry_conn_id:
        for option, given in (("--schema-registry-url", args.schema_registry_url),
                              ("--schema-registry-config-file", args.schema_registry_config_file)):  # fmt: skip
            if given:
                raise UsageError(f"give either --schema-registry-conn-id or {option}, not both")
        return _from_connection(args.schema_registry_conn_id)
    if not args.schema_registry_url:
        raise UsageError(
            "--key-format and --value-format need the registry the export framed its records for: give "
            "--schema-registry-conn-id, or --schema-registry-url (credentials in --schema-registry-config-file)"
        )
    parts = urllib.parse.urlsplit(args.schema_registry_url)
    if parts.username or parts.password:  # never echoed: it holds a secret
        raise UsageError(
            "--schema-registry-url holds credentials, which any user of this host can read on a command line: "
            f"give the URL without them and put them in --schema-registry-config-file ({BASIC_AUTH}=USER:PASSWORD)"
        )
    found = _read_file(args.schema_registry_config_file) if args.schema_registry_config_file else {}
    if found.get(BASIC_SOURCE, "USER_INFO") != "USER_INFO":
        raise UsageError(f"--schema-registry-config-file: {BASIC_SOURCE} must be USER_INFO (the {BASIC_AUTH} line)")
    user, _, password = found.get(BASIC_AUTH, "").partition(":")
    try:
        timeout = float(found[TIMEOUT]) if TIMEOUT in found else None
    except ValueError:
        raise UsageError(f"--schema-registry-config-file: {TIMEOUT} must be seconds, e.g. 10") from None
    try:
        return RegistrySettings(
            url=args.schema_registry_url,
            username=user or None,
            password=password or None,
            bearer_token=found.get(BEARER_TOKEN) or None,
            ca_file=found.get(CA_FILE) or None,
            **({"timeout_s": timeout} if timeout is not None else {}),
        )
    except RegistryConfigError as e:
        raise UsageError(f"--schema-registry-url: {e}") from None


def _read_file(path: str) -> dict[str, str]:
    try:
        lines = properties_lines(path)
    except OSError as e:
        raise UsageError(f"cannot read --schema-registry-config-file {path}: {e.strerror}") from None
    found: dict[str, str] = {}
    for where, line in lines:
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or key not in FILE_KEYS:  # never echo the line: it may be a bare password
            raise UsageError(f"{where}: expected KEY=VALUE with KEY one of {', '.join(FILE_KEYS)}")
        found[key] = value.strip()
    return found


def _from_connection(conn_id: str) -> RegistrySettings:
    """A ``kafka2pc_schema_registry`` connection's settings, mapped by the tasks' own hook."""
    from airflow_provider_kafka2pc.cli.client_settings import find_airflow_connection, looked_in

    try:
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
        from airflow_provider_kafka2pc.hooks.schema_registry import SchemaRegistryHook
    except ImportError as e:
        raise UsageError(
            f"--schema-registry-conn-id needs Apache Airflow installed ({e}); give --schema-registry-url instead"
        ) from None
    try:
        return SchemaRegistryHook(conn_id, connection=find_airflow_connection(conn_id)).settings()
    except AirflowNotFoundException:
        raise UsageError(f"no Airflow connection {conn_id!r}: {looked_in(conn_id)}") from None
    except Kafka2PCConfigError as e:
        raise UsageError(f"connection {conn_id!r}: {e}") from None


__all__ = ["record_formats", "registry_settings"]
