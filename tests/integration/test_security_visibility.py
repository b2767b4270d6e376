"""What a principal may not see is never reported as "nothing there" (SASL_SSL broker with ACLs).

An exporter's transaction is left open under a COMMIT decision in force (the commit decided, then
stopped before its EndTxn). A second principal, ``ops``, runs the read-only commands and
``resolve``: without Describe on the transactional ids, or on the decision topic, every command
fails with a permission error that names the principal and the ACL, and nothing is aborted.
The exporter's own ``resolve`` then rolls the run forward: exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.two_phase.coordinator import Decided, decide_commit
from tests.conftest import SECURE_EXPORTER_PASSWORD, SECURE_OPERATOR, SECURE_OPERATOR_PASSWORD
from tests.helpers.acls import Acl, set_acls
from tests.helpers.kafka import REPO, KafkaEnv
from tests.integration.test_security_broker import PRINCIPAL, Exporter

pytestmark = pytest.mark.kafka

OPS = f"User:{SECURE_OPERATOR}"
RECORDS = 25


def cli(ex: Exporter, tmp_path: Path, user: str, password: str, *args: str) -> subprocess.CompletedProcess[str]:
    secrets = tmp_path / f"{user}.properties"
    secrets.write_text(f"sasl.password={password}\n")
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_kafka2pc.cli", *args, "--prefix", ex.prefix,
         "--bootstrap-servers", ex.env.bootstrap, "--decision-topic", ex.decision_topic,
         "--config", "security.protocol=SASL_SSL", "--config", "sasl.mechanism=SCRAM-SHA-512",
         "--config", f"sasl.username={user}", "--config", f"ssl.ca.location={ex.env.security['ssl.ca.location']}",
         "--config-file", str(secrets), "--timeout", "15"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


@pytest.fixture
def ex(kafka_secure: KafkaEnv) -> Iterator[Exporter]:
    tag = uuid.uuid4().hex[:8]
    yield Exporter(kafka_secure, kafka_secure.topic(partitions=2), f"vis{tag}", f"dec_vis_{tag}", f"k2p_vis_{tag}")
    set_acls(kafka_secure, PRINCIPAL, set())
    set_acls(kafka_secure, OPS, set())


def test_a_principal_that_may_not_see_is_told_so_and_aborts_nothing(ex: Exporter, tmp_path: Path) -> None:
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    hook = ex.hook()
    writer = TransactionalWriter(hook.producer_config(), naming.transactional_id(ex.prefix, 0), 300_000).open()
    for i in range(RECORDS):
        writer.produce(ex.topic, b"v", f"run-1/0/{i}".encode())
    committable = writer.prepare()
    assert committable is not None
    wire, log = hook.wire_client(), hook.decision_log()
    try:  # the commit's first half: the COMMIT is in force, no EndTxn was sent
        assert isinstance(decide_commit([committable], wire, log, "run-1", prefixes=[ex.prefix]), Decided)
    finally:
        log.close()
        wire.close()
    open_ids = [committable.transactional_id]
    try:
        # ops without any ACL: neither the transactions nor the decision topic can be seen.
        set_acls(ex.env, OPS, set())
        for command in (["list"], ["resolve", "--dry-run"], ["describe"], ["resolve"]):
            done = cli(ex, tmp_path, SECURE_OPERATOR, SECURE_OPERATOR_PASSWORD, *command)
            assert done.returncode == 3, f"{command}: {done.stdout}{done.stderr}"
            assert f"principal {OPS} may not Describe" in done.stderr, done.stderr
            assert "0 open transaction(s)" not in done.stdout and "no decisions" not in done.stdout
            assert SECURE_OPERATOR_PASSWORD not in done.stdout + done.stderr
            assert ex.env.open_transactions(ex.prefix) == open_ids
        # An operations account with Write on the ids (Write implies Describe) but no decision topic
        # ACL: the transaction is visible, the COMMIT that rules it is not: a permission error,
        # also with --allow-missing-decision-topic, which would otherwise abort a committed run.
        set_acls(ex.env, OPS, {Acl("TransactionalId", ex.prefix, "PREFIXED", "Write")})
        for command in (["list"], ["resolve", "--dry-run"], ["resolve", "--allow-missing-decision-topic"]):
            done = cli(ex, tmp_path, SECURE_OPERATOR, SECURE_OPERATOR_PASSWORD, *command)
            assert done.returncode == 3, f"{command}: {done.stdout}{done.stderr}"
            assert f"principal {OPS} may not Describe Topic '{ex.decision_topic}'" in done.stderr, done.stderr
            assert f"--operation Describe --topic {ex.decision_topic}" in done.stderr
            assert ex.env.open_transactions(ex.prefix) == open_ids
        assert ex.keys() == []
    finally:
        set_acls(ex.env, OPS, set())
        os.environ.pop(f"AIRFLOW_CONN_{ex.conn_id.upper()}", None)
    # The exporter itself sees the COMMIT and rolls the run forward.
    done = cli(ex, tmp_path, "exporter", SECURE_EXPORTER_PASSWORD, "resolve")
    assert done.returncode == 0, done.stdout + done.stderr
    keys = ex.keys()
    assert len(keys) == len(set(keys)) == RECORDS and ex.env.open_transactions(ex.prefix) == []


@pytest.mark.parametrize("command", ["describe", "list"])
def test_a_wrong_password_is_named_within_seconds_by_the_cli(ex: Exporter, tmp_path: Path, command: str) -> None:
    started = time.monotonic()
    done = cli(ex, tmp_path, "exporter", "not-the-password", command)
    took = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    assert "authentication failed: SASL SCRAM-SHA-512 as User:exporter" in done.stderr, done.stderr
    assert "not-the-password" not in done.stdout + done.stderr
    assert took < 10, took
    print(f"kafka2pc {command} with a wrong password: exit 3 after {took:.1f} s")
