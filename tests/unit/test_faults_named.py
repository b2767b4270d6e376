"""Faults named as what they are (issue 21): a configuration mistake is not "Kafka unreachable", a
TLS failure names the certificate problem, kafka-python's connection chatter stays at DEBUG, and the
abort task says when a prepare never ran and gives up on an unreachable broker in bounded time."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.txn.kafka.errors import (
    ClientConfigError,
    KafkaAuthenticationError,
    KafkaTlsError,
    UnmappableConfigError,
)
from airflow_provider_kafka2pc.txn.kafka.reachability import _tls_message, check_connection
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, Kafka2PCError
from tests.unit.fakes import FakeBroker, MemoryDecisionLog
from tests.unit.test_phase_two_operators import RUN_ID, FakeTI, abort_task, context, kafka, no_kafka, payload

__all__ = ["kafka", "no_kafka"]  # fixtures used here


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- configuration mistakes --------------------------------------------------------------------


def test_turning_certificate_verification_off_is_a_configuration_mistake_found_before_kafka() -> None:
    config = {
        "bootstrap.servers": f"127.0.0.1:{closed_port()}",
        "security.protocol": "SSL",
        "enable.ssl.certificate.verification": "false",
    }
    started = time.monotonic()
    with pytest.raises(ClientConfigError, match=r"'enable\.ssl\.certificate\.verification'") as refused:
        check_connection(config, timeout_s=5)
    assert time.monotonic() - started < 1, "Kafka was contacted"
    assert isinstance(refused.value, UnmappableConfigError) and not isinstance(refused.value, Kafka2PCError)
    assert issubclass(Kafka2PCConfigError, ClientConfigError)  # the hook's: the same kind of mistake


def test_a_failed_certificate_check_names_the_ca_setting() -> None:
    text = (
        "sasl_ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: "
        "broker certificate could not be verified (after 9ms in state SSL_HANDSHAKE)"
    )
    config = {"bootstrap.servers": "b:9093", "security.protocol": "SSL", "ssl.ca.location": "/etc/ca.pem"}
    message = _tls_message(config, text)
    assert message.startswith("SSL handshake failed with Kafka at b:9093 (SSL as ")
    assert "certificate verify failed" in message and "after 9ms" not in message
    assert "ssl.ca.location is /etc/ca.pem: set ssl.ca.location to the CA" in message
    no_ca = _tls_message({"bootstrap.servers": "b:9093", "security.protocol": "SSL"}, text)
    assert "ssl.ca.location is not set, so the system's CA certificates were used" in no_ca
    assert issubclass(KafkaTlsError, KafkaAuthenticationError)


# --- kafka-python's connection chatter ---------------------------------------------------------


def test_an_unreachable_broker_is_one_error_not_kafka_pythons_connection_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient

    caplog.set_level(logging.INFO)
    kafka_logger = logging.getLogger("kafka")
    level = kafka_logger.level
    kafka_logger.setLevel(logging.WARNING)  # what quiet_third_party_logs sets in a task
    try:
        with pytest.raises(BrokerUnavailableError, match="cannot reach Kafka"):
            # reachable: past librdkafka's probe, which would answer first; this is about kafka-python
            WireClient({"bootstrap.servers": f"127.0.0.1:{closed_port()}"}, bootstrap_timeout_ms=1500, reachable=True)
    finally:
        kafka_logger.setLevel(level)
    noisy = [r for r in caplog.records if r.name.startswith("kafka") and r.levelno > logging.DEBUG]
    assert noisy == [], [r.getMessage() for r in noisy]


def test_at_debug_the_connection_lines_are_still_there_as_debug(caplog: pytest.LogCaptureFixture) -> None:
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient

    caplog.set_level(logging.DEBUG, logger="kafka")
    with pytest.raises(BrokerUnavailableError):
        WireClient({"bootstrap.servers": f"127.0.0.1:{closed_port()}"}, bootstrap_timeout_ms=800, reachable=True)
    refused = [r for r in caplog.records if r.name.startswith("kafka.net") and "ECONNREFUSED" in r.getMessage()]
    assert refused and all(r.levelno == logging.DEBUG for r in refused)


def test_the_io_loops_slow_step_warning_of_a_busy_host_is_debug_detail(caplog: pytest.LogCaptureFixture) -> None:
    """kafka-python's selector warns when one step of its IO loop took over 0.1 s of wall time; on a
    loaded Airflow worker that is common and says nothing about the transaction (CI saw it in a
    commit task's log)."""
    from airflow_provider_kafka2pc.txn.kafka.config import protect_kafka_python_logs

    logger = logging.getLogger("kafka.net.selector")
    protect_kafka_python_logs({})
    caplog.set_level(logging.INFO)
    slow = "Task %r ran for %.3fs (>%.3fs threshold). It is blocking the event loop"
    logger.warning(slow, "<Task>", 0.132, 0.1)
    assert [r for r in caplog.records if r.name == "kafka.net.selector"] == []
    caplog.set_level(logging.DEBUG, logger="kafka")
    logger.warning(slow, "<Task>", 0.132, 0.1)
    [shown] = [r for r in caplog.records if r.name == "kafka.net.selector"]
    assert shown.levelno == logging.DEBUG


# --- the abort task -----------------------------------------------------------------------------


class StatesTI(FakeTI):
    """A task instance that also answers the Task SDK's ``get_task_states`` from a table."""

    def __init__(self, states: dict[str, str], xcoms: dict[tuple[str, str], Any] | None = None) -> None:
        super().__init__(xcoms)
        self.states = states
        self.asked: list[dict[str, Any]] = []

    def get_task_states(self, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(kwargs)
        return {RUN_ID: {t: s for t, s in self.states.items() if t in kwargs["task_ids"]}}


def test_abort_says_in_one_line_that_the_prepare_never_ran(no_kafka: None) -> None:
    dag, op = abort_task(exports=("prepare",))
    ti = StatesTI({"prepare": "upstream_failed"})
    with pytest.raises(AirflowSkipException) as skipped:
        op.execute(context(dag, ti))
    assert str(skipped.value) == (
        "nothing to abort: export task(s) ['prepare'] never ran (upstream_failed), so this run prepared nothing; "
        "what an earlier run left open is ended by the exporter's next recovery"
    )
    assert ti.asked == [{"dag_id": dag.dag_id, "task_ids": ["prepare"], "run_ids": [RUN_ID]}]


def test_abort_of_a_run_whose_one_export_never_ran_aborts_what_the_other_prepared(
    monkeypatch: pytest.MonkeyPatch,
    kafka: tuple[FakeBroker, MemoryDecisionLog],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.unit.fakes import committable

    broker, _ = kafka
    monkeypatch.setattr(Kafka2PCHook, "take_turn", lambda *a: None)
    broker.prepared(committable("orders-0"))
    dag, op = abort_task()
    ti = StatesTI({"prepare_b": "upstream_failed"}, {("prepare_a", "return_value"): payload("orders", "orders-0")})
    counts = op.execute(context(dag, ti))
    assert counts["aborted"] == 1 and broker.aborts_sent() == ["orders-0"]
    # The operator logs through the task SDK's structlog, to stdout here.
    assert "export task(s) ['prepare_b'] never ran (upstream_failed): aborting the run" in capsys.readouterr().out


def test_abort_with_the_export_failed_keeps_its_line(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Kafka2PCHook, "take_turn", lambda *a: None)
    dag, op = abort_task(exports=("prepare",))
    op.execute(context(dag, StatesTI({"prepare": "failed"})))
    assert "export task(s) ['prepare'] failed: aborting the run" in capsys.readouterr().out


def test_abort_gives_up_on_an_unreachable_broker_in_bounded_time_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = closed_port()
    connection = {"conn_type": "kafka2pc", "host": f"127.0.0.1:{port}", "extra": {"connect_timeout_s": 3}}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps(connection))
    dag, op = abort_task(exports=("prepare",))
    caplog.set_level(logging.INFO)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as failed:
        op.execute(context(dag, StatesTI({"prepare": "failed"})))
    assert time.monotonic() - started < 5
    message = str(failed.value)
    assert message.startswith(
        f"abort of run {dag.dag_id}/{RUN_ID}: cannot reach Kafka at 127.0.0.1:{port}: connection refused"
    ), message
    assert "Nothing was aborted" in message and "\n" not in message
    noisy = [r for r in caplog.records if r.name.startswith("kafka") and r.levelno > logging.DEBUG]
    assert noisy == [], [r.getMessage() for r in noisy]
