"""The example DAG on a broker run as in production, end to end (``dag.test()``, real Spark).

SASL_SSL with SCRAM-SHA-512, the StandardAuthorizer denying what no ACL allows, and the exporter
holding exactly the ACLs of docs/acls.md (the example sets no ``transaction_timeout_ms``, so its
Cluster DescribeConfigs row too). Two runs; the second at DEBUG, whose whole log (Airflow, Spark,
librdkafka, kafka-python) and the Airflow database (XCom) must not hold the password, but for
dag.test()'s own echo of Airflow's MaskSecret request (see below). Judged as
the super user: read_committed, each run's orders exactly once, nothing open.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD
from tests.helpers.acls import example_acls, set_acls
from tests.helpers.airflow_dagtest import EXAMPLE_DAG, EXAMPLE_DAG_COMMITTED, DagTester
from tests.helpers.kafka import KafkaEnv, sasl_connection

pytestmark = pytest.mark.kafka

TOPIC = "kafka2pc_example_orders"  # dags/kafka2pc_example.py
PREFIX = "kafka2pc_example.orders"
DECISIONS = "kafka2pc_decisions"  # the default decision topic
ROWS = 4000
PRINCIPAL = f"User:{SECURE_EXPORTER}"


def runs_by_key(kafka: KafkaEnv) -> Counter[tuple[str, str]]:
    """(run id, order id) -> how many times a read_committed consumer sees it."""
    records = kafka.read_committed(TOPIC)
    return Counter((json.loads(r.value or b"{}")["run"], (r.key or b"").decode()) for r in records)


def test_example_dag_twice_with_exactly_the_documented_acls(kafka_secure: KafkaEnv, dag_tester: DagTester) -> None:
    # The worker's secured broker is the session's: test_security_standalone may have run the example
    # on it already (its topic, its runs). This test judges its own runs only.
    if TOPIC not in kafka_secure.wire.topics():
        kafka_secure.topic(partitions=4, name=TOPIC)
    earlier = {run for run, _ in runs_by_key(kafka_secure)}
    set_acls(kafka_secure, PRINCIPAL, example_acls(TOPIC, PREFIX, DECISIONS))
    try:
        results = []
        for debug in (False, True):
            connection = sasl_connection(
                kafka_secure, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD, debug="security,broker" if debug else None
            )
            env = {"AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps(connection)}
            if debug:
                env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "DEBUG"
            result = dag_tester.run(EXAMPLE_DAG, "kafka2pc_example", {"rows": ROWS, "partitions": 4}, env)
            assert result.state == "success", result.log
            assert result.tasks == EXAMPLE_DAG_COMMITTED
            results.append(result)
            seen = {k: n for k, n in runs_by_key(kafka_secure).items() if k[0] not in earlier}
            assert len(seen) == ROWS * len(results) and set(seen.values()) == {1}
            assert len({run for run, _ in seen}) == len(results)
            assert kafka_secure.open_transactions(PREFIX) == []
        # The second run read the first run's records in the decision log.
        assert kafka_secure.read_committed(DECISIONS)
        debug_log = results[1].log.read_text(errors="replace")
        # At DEBUG: Airflow's and kafka-python's loggers, and librdkafka's own debug lines (%7|...)
        # from the driver and from Spark's Python workers.
        assert "[debug" in debug_log and "Starting KafkaAdminClient" in debug_log and "%7|" in debug_log
        # dag.test()'s in-process supervisor (InProcessSupervisorComms.send, Task SDK 1.3.2) echoes at
        # DEBUG the MaskSecret request by which the task runner registers a connection's password with
        # the masker ("Sending request ... MaskSecret(value=...)"), for every connection of every
        # provider. Airflow's real supervisor logs that request with its body omitted, so a deployed
        # worker does not; that line is dag.test()'s, not ours. Every other line is checked.
        leaks = [ln for ln in debug_log.splitlines() if SECURE_EXPORTER_PASSWORD in ln]
        airflow_own = f"msg=MaskSecret(value='{SECURE_EXPORTER_PASSWORD}'"
        assert [ln for ln in leaks if airflow_own not in ln] == []
        assert SECURE_EXPORTER_PASSWORD not in results[0].log.read_text(errors="replace")
        database = b"".join(p.read_bytes() for p in dag_tester.home.glob("*.db*"))
        assert database and SECURE_EXPORTER_PASSWORD.encode() not in database
        decisions = b"".join((r.key or b"") + (r.value or b"") for r in kafka_secure.read_committed(DECISIONS))
        assert SECURE_EXPORTER_PASSWORD.encode() not in decisions
    finally:
        set_acls(kafka_secure, PRINCIPAL, set())


@pytest.mark.parametrize("what", ["wrong password", "wrong CA"])
def test_a_refused_login_or_certificate_fails_the_first_task_at_once_naming_it(
    kafka_secure: KafkaEnv, dag_tester: DagTester, what: str
) -> None:
    """The run's first task (the topic step, then the recovery sensor) fails within seconds naming the
    cause (not 30 s of "Broker transport failure"); the prepare never runs and the abort says so in
    one line."""
    import certifi

    connection = sasl_connection(kafka_secure, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD)
    if what == "wrong password":
        connection["password"] = "not-" + SECURE_EXPORTER_PASSWORD[:8]
        cause = "authentication failed: SASL SCRAM-SHA-512 as User:exporter"
    else:  # a real CA bundle, but not the one that signed the broker's certificate
        connection["extra"]["config"]["ssl.ca.location"] = certifi.where()
        cause = "SSL handshake failed with Kafka at"
    env = {"AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps(connection)}
    result = dag_tester.run(EXAMPLE_DAG, "kafka2pc_example", {"rows": 10, "partitions": 1}, env)
    assert result.state == "failed"
    assert result.tasks == {
        "create_topic": "failed",
        "orders.recover": "upstream_failed",
        "orders.prepare": "upstream_failed",
        "orders.commit": "upstream_failed",
        "orders.abort": "skipped",
    }
    log = result.log.read_text(errors="replace")
    assert cause in log, log[-5000:]
    if what == "wrong CA":
        assert "certificate verify failed" in log
    assert "Broker transport failure" not in log and "ECONNREFUSED" not in log
    assert "nothing to abort: export task(s) ['orders.prepare'] never ran (upstream_failed)" in log, log[-5000:]
    assert result.seconds < 30, result.seconds  # was 30 s in recover alone, then 30 s in the abort
    assert SECURE_EXPORTER_PASSWORD[:8] not in log
