"""The first hour's four mistakes (issue 32): a wrong port, an unknown host, a wrong password and a
wrong CA. The Test button and the CLI each name a different cause for each, within the connect
timeout, in the same words (the CLI adds its "kafka2pc: error: " prefix)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S, REFUSED
from tests.conftest import SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD
from tests.helpers.kafka import REPO, KafkaEnv, sasl_connection

pytestmark = pytest.mark.kafka

MARGIN_S = 2.0  # the Test button: the hook's own work around the connect timeout
CLI_START_S = 5.0  # the CLI: an interpreter and its imports on a busy machine, on top


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wrong_port(kafka: KafkaEnv, kafka_secure: KafkaEnv) -> dict[str, Any]:
    return {"conn_type": "kafka2pc", "host": f"127.0.0.1:{_closed_port()}"}


def unknown_host(kafka: KafkaEnv, kafka_secure: KafkaEnv) -> dict[str, Any]:
    # A real broker's port, on a name that cannot resolve (.invalid is reserved, RFC 2606).
    port = kafka.bootstrap.rsplit(":", 1)[1]
    return {"conn_type": "kafka2pc", "host": f"kafka2pc-{uuid.uuid4().hex[:6]}.invalid:{port}"}


def wrong_password(kafka: KafkaEnv, kafka_secure: KafkaEnv) -> dict[str, Any]:
    return sasl_connection(kafka_secure, SECURE_EXPORTER, "not-" + SECURE_EXPORTER_PASSWORD[:8])


def wrong_ca(kafka: KafkaEnv, kafka_secure: KafkaEnv) -> dict[str, Any]:
    import certifi

    connection = sasl_connection(kafka_secure, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD)
    connection["extra"]["config"]["ssl.ca.location"] = certifi.where()  # a real bundle, not the broker's CA
    return connection


MISTAKES: dict[str, tuple[Callable[[KafkaEnv, KafkaEnv], dict[str, Any]], str]] = {
    "wrong port": (wrong_port, "cannot reach Kafka at 127.0.0.1:{port}: " + REFUSED),
    "unknown host": (unknown_host, "cannot reach Kafka at {host}: the host name {name} could not be resolved ("),
    "wrong password": (
        wrong_password,
        "authentication failed: SASL SCRAM-SHA-512 as User:exporter over SASL_SSL at {host}: SASL authentication error",
    ),
    "wrong CA": (wrong_ca, "SSL handshake failed with Kafka at {host} (SASL SCRAM-SHA-512 as User:exporter"),
}


@pytest.fixture
def conn_id() -> Iterator[str]:
    conn_id = f"reach_{uuid.uuid4().hex[:8]}"
    yield conn_id
    os.environ.pop(f"AIRFLOW_CONN_{conn_id.upper()}", None)


def press_test_button(conn_id: str, connection: dict[str, Any]) -> tuple[bool, str, float]:
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(connection)
    started = time.monotonic()
    ok, message = Kafka2PCHook(conn_id).test_connection()
    return ok, message, time.monotonic() - started


def cli_list(config: dict[str, Any], directory: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """``kafka2pc list`` with the connection's own client settings (secrets in a file, not argv)."""
    settings = directory / f"client-{uuid.uuid4().hex[:6]}.properties"
    settings.write_text("".join(f"{k}={v}\n" for k, v in config.items() if k != "bootstrap.servers"))
    command = [
        "list",
        "--prefix",
        "p",
        "--bootstrap-servers",
        config["bootstrap.servers"],
        "--config-file",
        str(settings),
    ]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_kafka2pc.cli", *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    return proc, time.monotonic() - started


def test_four_mistakes_four_causes_within_the_timeout_the_test_buttons_text_is_the_clis(
    kafka: KafkaEnv, kafka_secure: KafkaEnv, conn_id: str, tmp_path: Path
) -> None:
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    for what, (make, expected) in MISTAKES.items():
        connection = make(kafka, kafka_secure)
        host = connection["host"]
        expected = expected.format(host=host, port=host.rsplit(":", 1)[1], name=host.rsplit(":", 1)[0])

        ok, message, button_took = press_test_button(conn_id, connection)
        assert not ok and message.startswith(expected), (what, message)
        assert button_took < DEFAULT_CONNECT_TIMEOUT_S + MARGIN_S, (what, button_took, message)
        assert SECURE_EXPORTER_PASSWORD[:8] not in message and "\n" not in message
        if what == "wrong CA":
            assert "certificate verify failed" in message and "ssl.ca.location is" in message, message

        proc, took = cli_list(Kafka2PCHook(conn_id).get_config(), tmp_path)
        assert proc.returncode == 3, (what, proc.stderr)
        assert proc.stderr == f"kafka2pc: error: {message}\n", what  # the same words, the CLI's prefix
        assert took < DEFAULT_CONNECT_TIMEOUT_S + MARGIN_S + CLI_START_S, (what, took)
        print(f"{what}: Test button {button_took:.1f} s, CLI {took:.1f} s")
        print(f"  Test button: {message}\n  CLI: {proc.stderr.strip()}")
