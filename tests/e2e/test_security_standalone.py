"""The example DAG on a deployed Airflow (standalone, PostgreSQL, LocalExecutor) at DEBUG level,
against the SASL_SSL broker with exactly the documented ACLs: the password appears in no file
Airflow, Spark, librdkafka or kafka-python wrote (task logs, component logs), not in XCom or
anywhere else in the metadata database, and not in the decision topic. Unlike ``dag.test()``
(see test_security_dag.py), a deployed worker has no line to tolerate."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD
from tests.helpers.acls import example_acls, set_acls
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import REPO, KafkaEnv, sasl_connection

pytestmark = [pytest.mark.kafka, pytest.mark.airflow_standalone]

DAG_ID, TOPIC, PREFIX = "kafka2pc_example", "kafka2pc_example_orders", "kafka2pc_example.orders"
ROWS = 3000


@pytest.fixture
def airflow_debug(kafka_secure: KafkaEnv, tmp_path: Path) -> Iterator[StandaloneAirflow]:
    connection = sasl_connection(kafka_secure, SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD, debug="security,broker")
    env = {
        "AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps(connection),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    af = StandaloneAirflow(tmp_path / "home", REPO / "dags", env, config={"LOGGING__LOGGING_LEVEL": "DEBUG"},
                           dag_ids=[DAG_ID])  # fmt: skip
    with af:
        yield af


def test_no_password_anywhere_at_debug_on_a_deployed_airflow(
    kafka_secure: KafkaEnv, airflow_debug: StandaloneAirflow
) -> None:
    from confluent_kafka.admin import AdminClient

    if TOPIC not in AdminClient(kafka_secure.config).list_topics(timeout=30).topics:  # test_security_dag's
        kafka_secure.topic(partitions=2, name=TOPIC)
    set_acls(kafka_secure, f"User:{SECURE_EXPORTER}", example_acls(TOPIC, PREFIX))
    try:
        run_id = airflow_debug.trigger(DAG_ID, {"rows": ROWS, "partitions": 2})
        assert airflow_debug.wait_run(DAG_ID, run_id, timeout=420) == "success", airflow_debug.logs_tail()
        mine = [r.key for r in kafka_secure.read_committed(TOPIC) if run_id in (r.value or b"").decode()]
        assert len(mine) == ROWS and len(set(mine)) == ROWS
        assert kafka_secure.open_transactions(PREFIX) == []

        logs = [p for p in airflow_debug.home.rglob("*") if p.is_file()]
        task_logs = [p for p in logs if "dag_id=" in str(p)]
        assert len(task_logs) >= 3  # recover, prepare, commit at least
        debug_lines = "".join(p.read_text(errors="replace") for p in task_logs)
        assert '"level":"debug"' in debug_lines.replace(" ", "") or "[debug" in debug_lines
        assert "Starting KafkaAdminClient" in debug_lines  # kafka-python at DEBUG, quieted of nothing
        leaks = [str(p) for p in logs if SECURE_EXPORTER_PASSWORD.encode() in p.read_bytes()]
        assert leaks == []
        tables = airflow_debug.metadata_query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        for (table,) in tables:
            rows = airflow_debug.metadata_query(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s',
                                                (f"%{SECURE_EXPORTER_PASSWORD}%",))  # fmt: skip
            assert rows == [(0,)], f"the password is in table {table}"
        decisions = b"".join(
            (r.key or b"") + (r.value or b"") for r in kafka_secure.read_committed("kafka2pc_decisions")
        )
        assert decisions and SECURE_EXPORTER_PASSWORD.encode() not in decisions
    finally:
        set_acls(kafka_secure, f"User:{SECURE_EXPORTER}", set())
