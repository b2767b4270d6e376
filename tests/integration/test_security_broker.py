"""kafka2pc against a broker run as in production, by the project's own scripts/kafka-local.

SASL_SSL with SCRAM-SHA-512 and a CA made by kafka-local, the StandardAuthorizer with
``allow.everyone.if.no.acl.found=false``, and an exporter principal holding exactly the ACLs of
docs/acls.md. Each outcome is judged as the super user: a read_committed consumer (counts, unique
keys) and no open transaction of the exporter.

The export path here is the export operator's without Spark (its ACL check, recovery pass,
decision log, one librdkafka writer per partition, then the commit): Spark's executors run the
same writer with the same config, and Spark's start-up would triple this file's runtime.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from tests.conftest import OIDC_CLIENT, OIDC_SECRET, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD
from tests.helpers.acls import Acl, acls_of, set_acls
from tests.helpers.kafka import REPO, KafkaEnv, kafka_local, sasl_connection

pytestmark = pytest.mark.kafka

PRINCIPAL = f"User:{SECURE_EXPORTER}"
RECORDS = 40  # per partition writer
SLOTS = 2
TIMEOUT_MS = 300_000  # set, so no Cluster DescribeConfigs is needed (docs/acls.md)


@dataclass
class Exporter:
    env: KafkaEnv
    topic: str
    prefix: str
    decision_topic: str
    conn_id: str

    def documented_acls(self, create_decision_topic: bool = True) -> list[Acl]:
        """docs/acls.md, for this exporter (transaction_timeout_ms set, so no cluster ACL)."""
        acls = [
            Acl("Topic", self.topic, "LITERAL", "Write"),
            Acl("TransactionalId", self.prefix, "PREFIXED", "Write"),
            Acl("Topic", self.decision_topic, "LITERAL", "Read"),
            Acl("Topic", self.decision_topic, "LITERAL", "Write"),
            Acl("Topic", self.decision_topic, "LITERAL", "DescribeConfigs"),
            Acl("Group", "kafka2pc-decision-reader", "LITERAL", "Describe"),  # recommended: no DENIED lines
        ]
        if create_decision_topic:
            acls.append(Acl("Topic", self.decision_topic, "LITERAL", "Create"))
        return acls

    def hook(self, password: str = SECURE_EXPORTER_PASSWORD, debug: str | None = None, connection: Any = None) -> Any:
        from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

        connection = connection or sasl_connection(self.env, SECURE_EXPORTER, password, self.decision_topic, debug)
        os.environ[f"AIRFLOW_CONN_{self.conn_id.upper()}"] = json.dumps(connection)
        return Kafka2PCHook(self.conn_id)

    def export(
        self, run: str, timeout_ms: int | None = TIMEOUT_MS, big: int = 0, hook: Any = None
    ) -> list[Committable]:
        """The export operator's path, then the commit task's: what one DAG run does."""
        from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

        hook = hook or self.hook()
        hook.check_export_access(self.topic)
        assert hook.recover(self.prefix, run).done
        committables = []
        for slot in range(SLOTS):
            writer = TransactionalWriter(
                hook.producer_config(),
                naming.transactional_id(self.prefix, slot),
                timeout_ms,
                id_prefix=self.prefix,
            ).open()
            for i in range(RECORDS):
                writer.produce(self.topic, b"v" * 20, f"{run}/{slot}/{i}".encode())
            if big and slot == 0:
                writer.produce(self.topic, os.urandom(big), f"{run}/{slot}/big".encode(), partition=0)
            committable = writer.prepare()
            assert committable is not None
            committables.append(committable)
        wire, decision_log = hook.wire_client(), hook.decision_log()
        try:
            commit_prepared(committables, wire, decision_log, run, prefixes=[self.prefix])
        finally:
            decision_log.close()
            wire.close()
        return committables

    def keys(self) -> list[bytes]:
        return [r.key or b"" for r in self.env.read_committed(self.topic)]

    def oauth_connection(self, client_id: str, secret: str) -> dict[str, Any]:
        """An official ``kafka`` connection (its extra is the librdkafka config) using OIDC client credentials."""
        assert self.env.oidc_url
        config = {
            "bootstrap.servers": self.env.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": client_id,
            "sasl.oauthbearer.client.secret": secret,
            "sasl.oauthbearer.token.endpoint.url": f"{self.env.oidc_url}/token",
            "ssl.ca.location": self.env.security["ssl.ca.location"],
        }
        return {"conn_type": "kafka", "extra": config}

    def assert_exactly_once(self, runs: list[str]) -> None:
        keys = self.keys()
        assert len(keys) == len(set(keys)) == len(runs) * SLOTS * RECORDS
        assert {k.decode().split("/")[0] for k in keys} == set(runs)
        assert self.env.open_transactions(self.prefix) == []


@pytest.fixture
def exporter(kafka_secure: KafkaEnv, request: pytest.FixtureRequest) -> Iterator[Exporter]:
    tag = uuid.uuid4().hex[:8]
    ex = Exporter(kafka_secure, kafka_secure.topic(partitions=2), f"sec{tag}", f"dec_{tag}", f"k2p_{tag}")
    try:
        yield ex
    finally:
        os.environ.pop(f"AIRFLOW_CONN_{ex.conn_id.upper()}", None)
        set_acls(kafka_secure, PRINCIPAL, set())


def test_documented_acls_export_twice_exactly_once(exporter: Exporter) -> None:
    """Exactly docs/acls.md, granted with its kafka-acls commands: two runs, exactly once, nothing open."""
    kl = kafka_local()
    ex = exporter
    commands = [
        ["--operation", "Write", "--topic", ex.topic],
        ["--operation", "Write", "--transactional-id", ex.prefix, "--resource-pattern-type", "prefixed"],
        ["--operation", "Read", "--operation", "Write", "--operation", "DescribeConfigs", "--topic", ex.decision_topic],
        ["--operation", "Create", "--topic", ex.decision_topic],
        ["--operation", "Describe", "--group", "kafka2pc-decision-reader"],  # recommended: no DENIED lines
    ]
    for args in commands:
        proc = kl.run_tool(ex.env.directory, "acls", ["--add", "--allow-principal", PRINCIPAL, *args], timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert acls_of(ex.env, PRINCIPAL) == set(ex.documented_acls())

    ex.export("run1")
    ex.assert_exactly_once(["run1"])
    # The second run reads a decision log that is not empty (run 1's records are in it).
    assert ex.env.read_committed(ex.decision_topic)
    ex.export("run2")
    ex.assert_exactly_once(["run1", "run2"])


MISSING = ["data Write", "id Write", "decision Read", "decision Write", "decision DescribeConfigs", "decision Create"]


@pytest.mark.parametrize("missing", MISSING)
def test_each_missing_acl_is_named_before_anything_is_written(exporter: Exporter, missing: str) -> None:
    """Without one documented ACL: an error naming it, nothing visible, nothing open; granting it
    (the user's next step) makes the same run go through exactly once."""
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
    from airflow_provider_kafka2pc.txn.protocol.errors import MissingTopicError

    ex = exporter
    documented = set(ex.documented_acls())
    if missing != "decision Create":  # every other case runs against an existing decision topic
        set_acls(ex.env, PRINCIPAL, documented)
        ex.export("warmup")
    where, operation = missing.split()
    name = {"data": ex.topic, "id": ex.prefix, "decision": ex.decision_topic}[where]
    (acl,) = [a for a in documented if a.name == name and a.operation == operation]
    set_acls(ex.env, PRINCIPAL, documented - {acl})
    runs = [] if missing == "decision Create" else ["warmup"]

    with pytest.raises((KafkaAuthorizationError, MissingTopicError)) as failed:
        ex.export("run1")
    message = str(failed.value)
    assert name in message and operation in message, message
    if isinstance(failed.value, KafkaAuthorizationError):
        assert failed.value.resource_type == acl.resource_type and failed.value.operation == operation
        assert f"--operation {operation}" in message and PRINCIPAL in message
    ex.assert_exactly_once(runs)

    set_acls(ex.env, PRINCIPAL, documented)
    ex.export("run1")
    ex.assert_exactly_once([*runs, "run1"])


def test_the_topic_step_needs_create_only_for_a_missing_topic_and_names_it(exporter: Exporter) -> None:
    """An existing topic passes with the export's own ACLs (Write implies Describe); a missing one
    without Create on it is refused naming the ACL and its command, and nothing is created."""
    from airflow_provider_kafka2pc.txn.kafka.data_topic import create_topic_if_missing
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError

    ex = exporter
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    config = ex.hook().get_config()
    assert create_topic_if_missing(config, ex.topic, 4).created is False
    missing = f"{ex.topic}_new"
    write_missing = Acl("Topic", missing, "LITERAL", "Write")  # what its export will need anyway
    set_acls(ex.env, PRINCIPAL, {*ex.documented_acls(), write_missing})
    with pytest.raises(KafkaAuthorizationError) as refused:
        create_topic_if_missing(config, missing, 4)
    message = str(refused.value)
    assert refused.value.resource_type == "Topic" and refused.value.operation == "Create", message
    assert missing in message and "--operation Create" in message and PRINCIPAL in message
    assert missing not in ex.env.wire.topics()
    set_acls(ex.env, PRINCIPAL, {*ex.documented_acls(), write_missing, Acl("Topic", missing, "LITERAL", "Create")})
    assert create_topic_if_missing(config, missing, 4).created is True


def test_cluster_describe_configs_is_needed_only_without_a_transaction_timeout(exporter: Exporter) -> None:
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError

    ex = exporter
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    with pytest.raises(KafkaAuthorizationError, match="DescribeConfigs Cluster") as failed:
        ex.export("run1", timeout_ms=None)
    assert "transaction_timeout_ms" in str(failed.value) and "--cluster" in str(failed.value)
    ex.assert_exactly_once([])
    ex.export("run1")  # the user's next step: set the timeout
    ex.assert_exactly_once(["run1"])


def test_an_mtls_client_is_named_by_its_certificate_subject_as_the_broker_authorizes_it(exporter: Exporter) -> None:
    """SSL with a client certificate (the broker's mTLS listener): the principal a refusal names and the
    kafka-acls command it gives are the broker's own. The command, run as given, grants the missing
    ACL; the documented ACLs for that principal then let the export through exactly once."""
    import shlex

    from airflow_provider_kafka2pc.txn.kafka.access import principal_of
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
    from airflow_provider_kafka2pc.txn.protocol.errors import MissingTopicError

    ex, kl = exporter, kafka_local()
    client = kl.client_certificate(ex.env.directory, f"mtls-{ex.prefix}")
    principal = f"User:CN=mtls-{ex.prefix},OU=tests,O=kafka2pc"
    assert principal_of(client) == principal
    settings = {k: v for k, v in client.items() if k.startswith("ssl.")}
    extra = {"security_protocol": "SSL", "decision_topic": ex.decision_topic, "config": settings}
    hook = ex.hook(connection={"conn_type": "kafka2pc", "host": client["bootstrap.servers"], "extra": extra})
    try:
        # Nothing granted: the data topic is hidden from the principal (Kafka answers as if missing).
        with pytest.raises((KafkaAuthorizationError, MissingTopicError)) as refused:
            ex.export("run1", hook=hook)
        message = str(refused.value)
        assert f"{principal} may not" in message, message
        command = shlex.split(message[message.index("kafka-acls ") :])
        assert command[:3] == ["kafka-acls", "--bootstrap-server", client["bootstrap.servers"]], command
        proc = kl.run_tool(ex.env.directory, "acls", command[command.index("--add") :], timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        granted = acls_of(ex.env, principal)
        assert len(granted) == 1 and granted <= set(ex.documented_acls()), granted
        ex.assert_exactly_once([])

        set_acls(ex.env, principal, set(ex.documented_acls()))
        ex.export("run1", hook=hook)
        ex.assert_exactly_once(["run1"])
    finally:
        set_acls(ex.env, principal, set())


def test_wrong_password_says_authentication_failed_within_10_s(exporter: Exporter) -> None:
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthenticationError

    ex = exporter
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    wrong = "not-" + SECURE_EXPORTER_PASSWORD[:8]
    hook = ex.hook(password=wrong)

    started = time.monotonic()
    ok, message = hook.test_connection()
    took = time.monotonic() - started
    assert not ok and took < 10, (took, message)
    assert message.startswith("authentication failed: SASL SCRAM-SHA-512 as User:exporter"), message
    assert wrong not in message

    started = time.monotonic()
    with pytest.raises(KafkaAuthenticationError, match="authentication failed: SASL SCRAM-SHA-512") as failed:
        ex.export("run1", hook=hook)
    assert time.monotonic() - started < 10 and wrong not in str(failed.value)

    props = ex.env.directory / f"wrong-{ex.prefix}.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.username={SECURE_EXPORTER}\nsasl.password={wrong}\nssl.ca.location={ex.env.security['ssl.ca.location']}\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_kafka2pc.cli",
            "list",
            "--prefix",
            ex.prefix,
            "--bootstrap-servers",
            ex.env.bootstrap,
            "--config-file",
            str(props),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    took = time.monotonic() - started  # includes the interpreter's start
    assert proc.returncode == 3 and took < 10, (took, proc.stderr)
    assert "kafka2pc: error: authentication failed: SASL SCRAM-SHA-512 as User:exporter" in proc.stderr
    assert wrong not in proc.stderr + proc.stdout
    ex.assert_exactly_once([])


def _bad_connection(ex: Exporter, what: str) -> dict[str, Any]:
    """The exporter's connection with one thing wrong: the password, the CA, or no CA at all."""
    import certifi

    connection = sasl_connection(ex.env, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD, ex.decision_topic)
    if what == "wrong password":
        connection["password"] = "not-" + SECURE_EXPORTER_PASSWORD[:8]
    elif what == "wrong CA":  # a real CA bundle, but not the one that signed the broker's certificate
        connection["extra"]["config"]["ssl.ca.location"] = certifi.where()
    else:  # no CA: the system's CA certificates
        del connection["extra"]["config"]["ssl.ca.location"]
    return connection


BAD_CONNECTIONS = {
    "wrong password": "authentication failed: SASL SCRAM-SHA-512 as User:exporter",
    "wrong CA": "SSL handshake failed with Kafka at",
    "no CA": "SSL handshake failed with Kafka at",
}


@pytest.mark.parametrize("what", list(BAD_CONNECTIONS))
def test_the_first_task_names_a_refused_login_or_certificate_within_10_s(exporter: Exporter, what: str) -> None:
    """The recovery sensor is a run's first task: its first Kafka call (POOLING: take_turn on the
    decision log; INCREMENTING: recover) and the trigger that runs it in the triggerer, then the
    commit/abort's first client, each fail within 10 s naming the cause, not "Broker transport failure"."""
    import asyncio

    from airflow_provider_kafka2pc.triggers.recovery import Kafka2PCRecoveryTrigger
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthenticationError, KafkaTlsError

    ex = exporter
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    expected = BAD_CONNECTIONS[what]
    kind = KafkaAuthenticationError if what == "wrong password" else KafkaTlsError

    def fails_fast(call: Any) -> str:
        started = time.monotonic()
        with pytest.raises(kind) as failed:
            call(ex.hook(connection=_bad_connection(ex, what)))
        took = time.monotonic() - started
        message = str(failed.value)
        assert took < 10 and message.startswith(expected), (took, message)
        assert SECURE_EXPORTER_PASSWORD[:8] not in message
        if kind is KafkaTlsError:
            assert "certificate verify failed" in message and "ssl.ca.location" in message, message
        return message

    fails_fast(lambda hook: hook.take_turn(ex.prefix, "dag", "run1"))
    fails_fast(lambda hook: hook.recover(ex.prefix, "dag/run1", run_key="run1"))
    fails_fast(lambda hook: hook.decision_log())
    fails_fast(lambda hook: hook.wire_client())

    async def first_event() -> dict[str, Any]:
        trigger = Kafka2PCRecoveryTrigger(ex.prefix, "dag/run1", ex.conn_id, turn=("dag", "run1"))
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger fired nothing")

    ex.hook(connection=_bad_connection(ex, what))  # sets the connection's environment variable
    started = time.monotonic()
    event = asyncio.run(first_event())
    took = time.monotonic() - started
    assert event["status"] == "error" and took < 10, (took, event)
    assert f"{kind.__name__}: {expected}" in event["message"], event
    ex.assert_exactly_once([])


def test_a_missing_decision_topic_write_is_named_by_the_first_task(exporter: Exporter) -> None:
    """Without Write on the decision topic, the recovery sensor's first append (its POOLING lease, or
    INCREMENTING recovery's ABORT of an undecided transaction) names principal, ACL and command."""
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter

    ex = exporter
    documented = set(ex.documented_acls())
    set_acls(ex.env, PRINCIPAL, documented)
    ex.export("warmup")
    # An undecided transaction, left open as by a prepare that died.
    writer = TransactionalWriter(
        ex.hook().producer_config(), naming.transactional_id(ex.prefix, 0), TIMEOUT_MS, id_prefix=ex.prefix
    ).open()
    writer.produce(ex.topic, b"v", b"dead/0/0")
    assert writer.prepare() is not None
    (write,) = [a for a in documented if a.name == ex.decision_topic and a.operation == "Write"]
    set_acls(ex.env, PRINCIPAL, documented - {write})

    for first_call in (
        lambda hook: hook.take_turn(ex.prefix, "dag", "run1"),
        lambda hook: hook.recover(ex.prefix, "dag/run1"),
    ):
        started = time.monotonic()
        with pytest.raises(KafkaAuthorizationError) as failed:
            first_call(ex.hook())
        message = str(failed.value)
        assert time.monotonic() - started < 10, message
        assert failed.value.resource_type == "Topic" and failed.value.resource == ex.decision_topic
        assert failed.value.operation == "Write" and PRINCIPAL in message, message
        assert f"--operation Write --topic {ex.decision_topic}" in message, message
    assert ex.env.open_transactions(ex.prefix) != [], "nothing may be aborted without its ABORT decision"

    set_acls(ex.env, PRINCIPAL, documented)  # the user's next step
    assert ex.hook().recover(ex.prefix, "dag/run1").done
    ex.assert_exactly_once(["warmup"])


def test_debug_run_shows_the_password_nowhere(exporter: Exporter, capfd: pytest.CaptureFixture[str]) -> None:
    """Every logger at DEBUG (kafka-python's and ours), librdkafka's own debug output on stderr,
    the XCom payload and every decision record: no password."""
    from airflow_provider_kafka2pc.operators.payload import ExportPayload

    ex = exporter
    set_acls(ex.env, PRINCIPAL, set(ex.documented_acls()))
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    touched = [logging.getLogger(n) for n in ("kafka", "airflow_provider_kafka2pc")]
    old_levels = [lg.level for lg in touched]
    for lg in touched:
        lg.setLevel(logging.DEBUG)
    try:
        committables = ex.export("run1", hook=ex.hook(debug="security,broker"))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        for lg, level in zip(touched, old_levels, strict=True):
            lg.setLevel(level)
    logs = buffer.getvalue()
    out, err = capfd.readouterr()
    # The run really logged at DEBUG: kafka-python's admin client and librdkafka's security debug.
    assert "sasl_plain_username" in logs and "SASL" in err, (logs[-2000:], err[-2000:])
    payload = ExportPayload(
        conn_id=ex.conn_id,
        prefix=ex.prefix,
        naming_strategy="POOLING",
        run_key=None,
        delivery_guarantee="EXACTLY_ONCE",
        committables=tuple(committables),
        summary={},
    ).to_xcom()
    decisions = b"".join((r.key or b"") + (r.value or b"") for r in ex.env.read_committed(ex.decision_topic))
    assert decisions
    for where, text in (("logs", logs), ("stdout", out), ("stderr", err), ("xcom", json.dumps(payload))):
        assert SECURE_EXPORTER_PASSWORD not in text, where
    assert SECURE_EXPORTER_PASSWORD.encode() not in decisions
    ex.assert_exactly_once(["run1"])


def test_record_over_the_topic_limit_names_partition_and_limit(exporter: Exporter, kafka_secure: KafkaEnv) -> None:
    """The prepare fails naming the partition, the record's size and the topic's limit, and aborts
    its own transaction: nothing visible, nothing open, without waiting for the broker's timeout."""
    from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError

    ex = exporter
    ex.topic = kafka_secure.topic(partitions=2, config={"max.message.bytes": "20000"})
    # DescribeConfigs on the data topic is optional (docs/acls.md): it lets the error name the limit.
    set_acls(ex.env, PRINCIPAL, {*ex.documented_acls(), Acl("Topic", ex.topic, "LITERAL", "DescribeConfigs")})
    with pytest.raises(DeliveryError) as failed:
        ex.export("run1", big=50_000)
    message = str(failed.value)
    assert f"{ex.topic} partition 0" in message and "max.message.bytes is 20000" in message, message
    assert f"a record of {50_000 + len(b'run1/0/big')} bytes" in message, message
    assert ex.keys() == []
    assert ex.env.open_transactions(ex.prefix) == [], "the failed prepare left its transaction open"


def test_oauthbearer_oidc_client_credentials_on_both_clients(exporter: Exporter) -> None:
    """The broker validates RS256 tokens of a local OIDC provider (tests/helpers/oidc.py); librdkafka
    (producers, decision log) and kafka-python (commit, recovery) fetch them with the same client
    credentials. The official kafka connection type uses the default decision topic."""
    from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthenticationError

    ex = exporter
    ex.decision_topic = DEFAULT_DECISION_TOPIC
    principal = f"User:{OIDC_CLIENT}"
    set_acls(ex.env, principal, set(ex.documented_acls()))
    try:
        ex.export("run1", hook=ex.hook(connection=ex.oauth_connection(OIDC_CLIENT, OIDC_SECRET)))
        ex.assert_exactly_once(["run1"])

        wrong = ex.hook(connection=ex.oauth_connection(OIDC_CLIENT, "not-the-secret"))
        started = time.monotonic()
        ok, message = wrong.test_connection()
        assert not ok and time.monotonic() - started < 10, message
        assert message.startswith(f"authentication failed: SASL OAUTHBEARER as {principal}"), message
        assert "not-the-secret" not in message
        with pytest.raises(KafkaAuthenticationError):
            ex.export("run2", hook=wrong)
        ex.assert_exactly_once(["run1"])
    finally:
        set_acls(ex.env, principal, set())


def test_decision_log_reads_leave_no_denied_line_with_the_reader_group_acl(exporter: Exporter) -> None:
    """librdkafka's consumer looks its group's coordinator up (FindCoordinator) though the decision
    reader only assigns partitions: without Describe on the reader's group every read works but the
    authorizer logs a DENIED line per lookup (teams that alert on denials get paged); with the
    Group ACL of docs/acls.md, an append, reads and a whole run leave no DENIED line at all."""
    from pathlib import Path

    from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import READER_GROUP

    ex = exporter
    documented = set(ex.documented_acls())
    server_log = Path(kafka_local().load_state(ex.env.directory)["nodes"][0]["log_dir"]) / "server.log"

    def denied_while_reading(run: str | None = None) -> list[str]:
        start = server_log.stat().st_size
        if run is not None:
            ex.export(run)
        hook = ex.hook()
        decision_log = hook.decision_log()
        try:
            decision_log.claim_prefix(ex.prefix, "dag.export")  # reads, then appends the claim
            assert decision_log.read_for(ex.prefix).claims[ex.prefix] == "dag.export"
        finally:
            decision_log.close()
        time.sleep(1.0)  # the broker answers the last lookups
        with server_log.open("rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
        return [line for line in lines if "denied" in line.lower()]

    set_acls(ex.env, PRINCIPAL, documented - {Acl("Group", READER_GROUP, "LITERAL", "Describe")})
    without = denied_while_reading()
    assert without and all(f"Group:LITERAL:{READER_GROUP}" in line for line in without), without
    set_acls(ex.env, PRINCIPAL, documented | {Acl("Group", READER_GROUP, "LITERAL", "Describe")})
    denied = denied_while_reading("run1")
    ex.assert_exactly_once(["run1"])
    print(f"DENIED lines in the authorizer log: {len(without)} without the reader group's ACL, {len(denied)} with it")
    assert denied == [], denied


@pytest.mark.parametrize("missing", ["source Read", "group Read"])
def test_a_kafka_source_s_missing_acl_is_named_before_anything_is_written(exporter: Exporter, missing: str) -> None:
    """A Kafka source (KIP-447) as docs/acls.md lists it: Read on the source topic and on the group.
    Without one, the snapshot or the offsets participant names it and the group does not move;
    granting it, the run's offsets commit. (The range is read here without Spark: Spark's Kafka
    source reads it with the same principal; see the file's docstring.)"""
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
    from airflow_provider_kafka2pc.txn.kafka.offsets_writer import prepare_offsets
    from airflow_provider_kafka2pc.txn.kafka.source_snapshot import KafkaSourceSpec, group_offsets, snapshot_source
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    ex = exporter
    source, group = ex.env.topic(partitions=1), f"grp{uuid.uuid4().hex[:8]}"
    from confluent_kafka import Producer

    p = Producer({**ex.env.config, "transactional.id": f"seed-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(7):
        p.produce(source, key=f"k{i}".encode(), value=b"v")
    p.commit_transaction(30)
    documented = set(ex.documented_acls()) | {
        Acl("Topic", source, "LITERAL", "Read"),
        Acl("Group", group, "LITERAL", "Read"),
    }
    where, operation = missing.split()
    name = {"source": source, "group": group}[where]
    (acl,) = [a for a in documented if a.name == name and a.operation == operation]
    set_acls(ex.env, PRINCIPAL, documented - {acl})
    hook = ex.hook()
    config = hook.producer_config({"transaction.timeout.ms": TIMEOUT_MS})
    tid = naming.transactional_id(ex.prefix, naming.OFFSETS_SLOT)
    with pytest.raises(KafkaAuthorizationError) as refused:
        read = snapshot_source(config, KafkaSourceSpec(group, topics=(source,)))
        prepare_offsets(config, tid, read, TIMEOUT_MS, ex.prefix)
    message = str(refused.value)
    assert name in message and f"--operation {operation}" in message and PRINCIPAL in message, message
    assert group_offsets(ex.env.config, group, [(source, 0)]) == {(source, 0): None}
    assert ex.env.open_transactions(ex.prefix) == []

    set_acls(ex.env, PRINCIPAL, documented)
    read = snapshot_source(config, KafkaSourceSpec(group, topics=(source,)))
    offsets = prepare_offsets(config, tid, read, TIMEOUT_MS, ex.prefix)
    wire, log = hook.wire_client(), hook.decision_log()
    try:
        commit_prepared([offsets], wire, log, run="src-run")
    finally:
        log.close()
        wire.close()
    assert group_offsets(ex.env.config, group, [(source, 0)]) == {(source, 0): 8}  # 7 records and a marker
    assert ex.env.open_transactions(ex.prefix) == []
