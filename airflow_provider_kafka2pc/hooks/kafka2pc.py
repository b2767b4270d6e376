"""Kafka2PCHook: an Airflow connection turned into librdkafka settings and kafka2pc clients.

Nothing here builds a client at import or construction time; Kafka libraries load on first use.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.connection_form import (
    CONN_FIELDS,
    EXTRA_CONFIG,
    EXTRA_CONNECT_TIMEOUT,
    EXTRA_DECISION_TOPIC,
    EXTRA_SASL_MECHANISM,
    EXTRA_SECURITY_PROTOCOL,
    HIDDEN_FIELDS,
    PLACEHOLDERS,
    RELABELING,
    field_of_setting,
)
from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.connection_hook import ConnectionHook
from airflow_provider_kafka2pc.txn.kafka.client_logs import quiet_third_party_logs
from airflow_provider_kafka2pc.txn.kafka.config import kafka_python_settings, redact
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.errors import (
    UnmappableConfigError,
)
from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.protocol import naming
    from airflow_provider_kafka2pc.txn.protocol.records import Lease
    from airflow_provider_kafka2pc.txn.two_phase.handoff import Acceptance
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession
    from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult

log = logging.getLogger(__name__)

# The official apache-kafka provider's connection type: its extra is the librdkafka config itself.
KAFKA_CONN_TYPE = "kafka"
_FIELDS = tuple(CONN_FIELDS)
# How long a passed connection check stands for the hook's next clients: a trigger keeps one hook for
# hours, and a broker that went away meanwhile must be named as such again.
CHECK_VALID_S = 60.0


def client_config(
    conn_type: str,
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The librdkafka config of a connection, from its parts (pure: unit-testable without Airflow)."""
    if conn_type == KAFKA_CONN_TYPE:
        config = dict(extra)
    else:
        unknown = set(extra) - set(_FIELDS)
        if unknown:
            raise Kafka2PCConfigError(
                "Extra", f"unknown extra field(s) {sorted(unknown)}; librdkafka settings go under {EXTRA_CONFIG!r}"
            )
        nested = extra.get(EXTRA_CONFIG) or {}
        if not isinstance(nested, Mapping):
            raise Kafka2PCConfigError(
                field_of_setting(EXTRA_CONFIG), f"extra {EXTRA_CONFIG!r} must be an object of librdkafka settings"
            )
        config = dict(nested)
        if host:
            config["bootstrap.servers"] = bootstrap_servers(host, port)
        for field, key in ((EXTRA_SECURITY_PROTOCOL, "security.protocol"), (EXTRA_SASL_MECHANISM, "sasl.mechanism")):
            if extra.get(field):
                config[key] = extra[field]
        if login:
            config["sasl.username"] = login
        if password:
            config["sasl.password"] = password
    official = conn_type == KAFKA_CONN_TYPE
    if not config.get("bootstrap.servers"):
        raise Kafka2PCConfigError(
            field_of_setting("bootstrap.servers", official),
            "the connection names no Kafka bootstrap servers (host, or bootstrap.servers)",
        )
    config = {k: (str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v) for k, v in config.items()}
    # The commit side connects with kafka-python: refuse now, naming the setting, what it could not
    # honour, rather than fail later with "cannot reach Kafka".
    try:
        kafka_python_settings(config)
    except UnmappableConfigError as e:
        raise Kafka2PCConfigError(field_of_setting(e.key, official), str(e)) from e
    return config


def connect_timeout_s(conn_type: str, extra: Mapping[str, Any]) -> float:
    """How long a client of the connection waits to connect: its Connect timeout field (pure)."""
    value = None if conn_type == KAFKA_CONN_TYPE else extra.get(EXTRA_CONNECT_TIMEOUT)
    if value is None or value == "":
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise Kafka2PCConfigError(
            str(CONN_FIELDS[EXTRA_CONNECT_TIMEOUT]["label"]), f"must be a number of seconds > 0, got {value!r}"
        )
    return seconds


def bootstrap_servers(host: str, port: int | None) -> str:
    """The connection's Host, each entry without a port given the connection's Port (the form's
    Port field: "broker1,broker2" and 9092 make "broker1:9092,broker2:9092")."""
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    if not port:
        return ",".join(hosts)
    return ",".join(h if _has_port(h) else f"{h}:{port}" for h in hosts)


def _has_port(host: str) -> bool:
    if host.startswith("["):  # [::1]:9092
        return "]:" in host
    return ":" in host


class Kafka2PCHook(ConnectionHook):
    """Kafka settings and clients for kafka2pc's tasks.

    :param kafka2pc_conn_id: a ``kafka2pc`` connection (host = bootstrap servers, login/password =
        SASL credentials, extra fields for the security protocol, SASL mechanism, decision topic and
        further librdkafka settings), or an official ``kafka`` connection, whose extra is used as
        the librdkafka config unchanged.
    """

    conn_name_attr = "kafka2pc_conn_id"
    default_conn_name = "kafka2pc_default"
    conn_type = "kafka2pc"
    hook_name = "Kafka exactly-once export (kafka2pc)"
    conn_fields = CONN_FIELDS

    def __init__(
        self, kafka2pc_conn_id: str = default_conn_name, connection: Connection | None = None, patient: bool = True
    ) -> None:
        """``patient`` (the tasks): connecting waits out a broker that refuses or does not resolve
        until the connect timeout; a page or a person at the Test button is told at once."""
        super().__init__(connection)
        quiet_third_party_logs()  # every kafka2pc task builds this hook first
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self._patient = patient
        self._checked_at: float | None = None  # when check_connection last passed

    # -- the classic form methods (Airflow 3 reads conn-fields from the provider info first) --------
    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": list(HIDDEN_FIELDS),
            "relabeling": dict(RELABELING),
            "placeholders": {
                **PLACEHOLDERS,
                EXTRA_CONFIG: '{"ssl.ca.location": "/etc/ssl/ca.pem"}',
                EXTRA_DECISION_TOPIC: DEFAULT_DECISION_TOPIC,
            },
        }

    # -- configs -----------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The connection's librdkafka settings: for producers, admin clients and the coordinator."""
        c = self.connection
        return client_config(str(c.conn_type), c.host, c.port, c.login, c.password, c.extra_dejson)

    def producer_config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The producer config of an export: the connection's settings, then the task's ``overrides``."""
        config = self.get_config()
        config.update(overrides or {})
        return config

    @property
    def decision_topic(self) -> str:
        c = self.connection
        if c.conn_type == KAFKA_CONN_TYPE:
            return DEFAULT_DECISION_TOPIC
        return str(c.extra_dejson.get(EXTRA_DECISION_TOPIC) or DEFAULT_DECISION_TOPIC)

    @property
    def connect_timeout_s(self) -> float:
        """How long every client of this connection waits to connect (its Connect timeout field)."""
        c = self.connection
        return connect_timeout_s(str(c.conn_type), c.extra_dejson)

    def redacted_config(self) -> dict[str, Any]:
        return redact(self.get_config())

    # -- clients -----------------------------------------------------------------------------
    def get_conn(self) -> WireClient:
        return self.wire_client()

    def check_connection(self) -> None:
        """Before the first client: a broker that cannot be reached, a refused login or TLS handshake
        is named (``reachability.check_connection``), within the connection's connect timeout.

        The decision log's client (librdkafka) would otherwise wait its whole budget and report only
        "Broker transport failure". Raises ``KafkaAuthenticationError`` (``KafkaTlsError`` for a
        certificate problem) within a second, ``BrokerUnavailableError`` for a refused connection or
        a host name that does not resolve within a second or two, and when nothing answers within
        ``connect_timeout_s``. Once per hook. The tasks' hook is patient (a refused or unresolved
        broker is asked again until the connect timeout: a broker restarting answers within it); the
        Test button's is not (``test_connection``).
        """
        from airflow_provider_kafka2pc.txn.kafka.reachability import check_connection

        if self._checked_at is not None and time.monotonic() - self._checked_at < CHECK_VALID_S:
            return
        check_connection(self.get_config(), self.connect_timeout_s, patient=self._patient)
        self._checked_at = time.monotonic()

    def wire_client(self) -> WireClient:
        """The commit side's client, connecting within the connection's connect timeout."""
        from airflow_provider_kafka2pc.txn.kafka.wire import WireClient

        self.check_connection()
        return WireClient(self.get_config(), bootstrap_timeout_ms=int(self.connect_timeout_s * 1000), reachable=True)

    def decision_log(self) -> DecisionLog:
        from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog

        self.check_connection()
        return DecisionLog(self.get_config(), topic=self.decision_topic)

    def clients(self) -> KafkaClients:
        """A wire client and the decision log, built on first use and closed together (``with``)."""
        from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients

        self.check_connection()
        return KafkaClients(
            self.get_config(),
            self.decision_topic,
            timeout_s=30.0,
            request_timeout_s=15.0,
            connect_timeout_s=self.connect_timeout_s,
            reachable=True,
        )

    def prepare_session(self, prefix: str, run: str, run_key: str | None = None) -> PrepareSession:
        """Every Kafka step of one prepare of ``prefix`` over one set of clients (``with``)."""
        from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

        return PrepareSession(self.clients(), prefix, run, run_key)

    def recover(
        self, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> RecoveryResult:
        """Resolve every open transaction of ``prefix`` by the decision log (DESIGN §3.1), once.
        ``spare_own_loss``: a loss of ``run`` itself does not fail it (its export task repairs it)."""
        with self.prepare_session(prefix, run, run_key) as session:
            return session.recover(spare_own_loss)

    def accept_handoff(self, prefix: str, run: str, strategy: naming.NamingStrategy, run_key: str | None) -> Acceptance:
        """The run's Spark application handoff that the broker still holds open, or why there is
        none yet (``txn.two_phase.handoff``)."""
        from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
        from airflow_provider_kafka2pc.txn.two_phase.handoff import accept

        with self.prepare_session(prefix, run, run_key) as session:
            clients = session.clients
            return accept(clients.decision_log(), TransactionInspector(clients.wire()), prefix, run, strategy, run_key)

    def retire_handoffs(self, prefix: str, run: str) -> int:
        """Tombstone the handoff records of a run that has its decision (``txn.two_phase.handoff``)."""
        from airflow_provider_kafka2pc.txn.two_phase.handoff import retire_handoffs

        decision_log = self.decision_log()
        try:
            return retire_handoffs(decision_log, prefix, run)
        finally:
            decision_log.close()

    def take_turn(self, prefix: str, dag_id: str, run_id: str) -> Lease | None:
        """Queue this DAG run for the POOLING exporter ``prefix``; the live run ahead of it, or None.

        Runs of one POOLING exporter share transactional ids, so they take turns, backfills
        included (Airflow counts ``max_active_runs`` per backfill). The decision log orders the
        runs; the scheduler says which are still live, so a run that died never blocks the next.
        """
        with self.prepare_session(prefix, run_id) as session:
            return take_turn(session, dag_id, run_id)

    def check_export_access(self, topic: str | None) -> None:
        """Before a prepare: the data topic exists and the principal may do what an export needs
        (``PrepareSession.check_export_access``)."""
        from airflow_provider_kafka2pc.txn.two_phase.prepare_session import check_export_access

        with self.clients() as clients:
            check_export_access(clients, topic)

    def test_connection(self) -> tuple[bool, str]:
        """Reach the cluster and check that it can run transactions (the UI's Test button)."""
        try:
            self.get_config()
            self.connect_timeout_s  # noqa: B018  (read for its check: a mistake in the form)
        except Kafka2PCConfigError as e:  # before any network: a mistake in the form is not "cannot reach Kafka"
            return False, f"configuration mistake, Kafka was not contacted: {e}"
        self._patient = False  # a person waits at the button: a refused connection is said at once
        self._checked_at = None
        try:
            wire = self.wire_client()
            try:
                brokers = wire.broker_ids()
                kip939 = wire.supports_kip939()
            finally:
                wire.close()
        except Kafka2PCError as e:  # written for the user, as the CLI and the tasks say it: "cannot reach ..."
            return False, str(e)
        except Exception as e:  # reported to the user, not raised: this is what the Test button shows
            return False, f"{type(e).__name__}: {e}"
        return True, (
            f"connected to {len(brokers)} broker(s); decision topic {self.decision_topic!r}; "
            f"KIP-939 two-phase commit {'supported' if kip939 else 'not supported (not needed)'}"
        )


LIVE_DAG_RUN_STATES = ("queued", "running")


def take_turn(session: PrepareSession, dag_id: str, run_id: str) -> Lease | None:
    """Queue DAG run ``run_id`` for the session's POOLING exporter, as the scheduler sees runs live."""
    from airflow_provider_kafka2pc.txn.protocol.records import Lease

    return session.take_turn(Lease(session.prefix, dag_id, run_id, int(time.time() * 1000)), dag_run_is_live)


def dag_run_is_live(lease: Lease) -> bool:
    """Ask the scheduler (through the Task SDK, from a worker or the triggerer) about a DAG run.

    A typed answer, never an error's text: the number of DAG runs with this id in a live state
    (``get_dr_count``), 0 for a run that ended or was deleted. ``get_dagrun_state`` answers a
    deleted run with an error whose text differs between the API server ("... was not found") and
    ``dag.test()``'s in-process API ("Server returned error").
    """
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    count = RuntimeTaskInstance.get_dr_count(
        dag_id=lease.dag_id, run_ids=[lease.run_id], states=list(LIVE_DAG_RUN_STATES)
    )
    return int(count) > 0
