"""Where the CLI's client settings come from: an Airflow connection (found where ``airflow connections
get`` finds it, mapped by the tasks' own hook) or the options, then ``--config-file`` and ``--config``."""

from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple

from airflow_provider_kafka2pc.cli.arguments import DEFAULT_BOOTSTRAP, ENV_BOOTSTRAP, UsageError
from airflow_provider_kafka2pc.txn.kafka.config import properties_lines
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S


class ClientSettings(NamedTuple):
    config: dict[str, Any]
    decision_topic: str
    connect_timeout_s: float  # the connection's (the Test button's and the tasks'), or the default


def client_config(args: argparse.Namespace) -> ClientSettings:
    """The client settings, decision topic and connect timeout: an Airflow connection's or the
    options', then --config."""
    config: dict[str, Any]
    if args.conn_id:
        if args.bootstrap_servers is not None:
            raise UsageError("give either --conn-id or --bootstrap-servers, not both")
        config, decision_topic, connect_timeout_s = airflow_connection(args.conn_id)
    else:
        config = {"bootstrap.servers": str(args.bootstrap_servers or os.environ.get(ENV_BOOTSTRAP, DEFAULT_BOOTSTRAP))}
        decision_topic, connect_timeout_s = DEFAULT_DECISION_TOPIC, DEFAULT_CONNECT_TIMEOUT_S
    items: list[tuple[str, str]] = []
    for path in args.config_file:
        items += _read_properties(path)
    items += [(f"--config #{i + 1}", item) for i, item in enumerate(args.config)]
    for where, item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        # Never echo the item: a mistyped one may be a bare password.
        if not sep or not key:
            raise UsageError(f"{where}: expected KEY=VALUE")
        if key == "bootstrap.servers":
            raise UsageError(f"{where}: set bootstrap.servers with --bootstrap-servers or the connection")
        config[key] = value
    return ClientSettings(config, args.decision_topic or decision_topic, connect_timeout_s)


def airflow_connection(conn_id: str) -> ClientSettings:
    """An Airflow connection's client settings, decision topic and connect timeout, mapped by the
    tasks' own hook.

    Found where ``airflow connections get`` finds it (``find_airflow_connection``). Imported here,
    not at the top: the CLI runs without Airflow, and only --conn-id needs it.
    """
    try:
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
        from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
    except ImportError as e:
        raise UsageError(
            f"--conn-id needs Apache Airflow installed ({e}); give --bootstrap-servers and --config instead"
        ) from None
    try:
        hook = Kafka2PCHook(conn_id, connection=find_airflow_connection(conn_id))
        return ClientSettings(hook.get_config(), hook.decision_topic, hook.connect_timeout_s)
    except AirflowNotFoundException:
        raise UsageError(f"no Airflow connection {conn_id!r}: {looked_in(conn_id)}") from None
    except Kafka2PCConfigError as e:
        raise UsageError(f"connection {conn_id!r}: {e}") from None


def find_airflow_connection(conn_id: str) -> Any:
    """The connection as ``airflow connections get`` finds it: the AIRFLOW_CONN_<ID> variable, the
    configured secrets backend, and, where Airflow is configured in this shell, its metadata
    database (``Connection.get_connection_from_secrets``, the call that command makes). Elsewhere the
    Task SDK's lookup, without the database: Airflow would otherwise read, and SQLite create, a
    database in its default home. Raises ``AirflowNotFoundException``. Either Connection class has
    the fields the hook reads, hence ``Any``."""
    from airflow.sdk import Connection

    if _airflow_home() is None or _airflow_core() is None:
        return Connection.get(conn_id)
    from airflow.models.connection import Connection as StoredConnection

    return StoredConnection.get_connection_from_secrets(conn_id)


def _airflow_home() -> str | None:
    """Where Airflow is configured in this shell: $AIRFLOW_HOME, or its default ~/airflow when that
    holds an airflow.cfg or the database is set in the environment; None when it is not."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    database_set = any(k.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") for k in os.environ)
    if os.environ.get("AIRFLOW_HOME") or database_set or os.path.isfile(os.path.join(home, "airflow.cfg")):
        return home
    return None


def _airflow_core() -> str | None:
    """apache-airflow-core's version where it is installed (the metadata database needs it; a worker
    may have only the Task SDK)."""
    from importlib import metadata

    try:
        return metadata.version("apache-airflow-core")
    except metadata.PackageNotFoundError:
        return None


def looked_in(conn_id: str) -> str:
    """Where ``find_airflow_connection`` looked, and why not in a database: the not-found message."""
    from airflow.sdk import conf

    backend = str(conf.get("secrets", "backend", fallback="") or "")
    places = [f"the environment variable AIRFLOW_CONN_{conn_id.upper()}"]
    if backend:
        places.append(f"the secrets backend {backend}")
    none = "" if backend else " (no secrets backend is configured)"
    home = _airflow_home()
    if home is not None and _airflow_core() is not None:
        places.append(f"the metadata database of AIRFLOW_HOME={home}")
        return f"looked where `airflow connections get {conn_id}` looks: {', '.join(places)}{none}"
    if home is None:
        why = "Airflow is not configured in this shell (set AIRFLOW_HOME to the home whose database holds it)"
    else:
        why = f"apache-airflow-core, which reads the metadata database of AIRFLOW_HOME={home}, is not installed"
    return f"looked in {' and '.join(places)}{none}; not in a metadata database: {why}"


def _read_properties(path: str) -> list[tuple[str, str]]:
    try:
        return properties_lines(path)
    except OSError as e:
        raise UsageError(f"cannot read --config-file {path}: {e.strerror}") from None
