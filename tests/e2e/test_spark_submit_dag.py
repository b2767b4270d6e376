"""dags/kafka2pc_spark_submit.py through ``dag.test()``: ``SparkSubmitOperator`` submits the example
application (its own driver, outside the task), ``Kafka2PCHandoffSensor`` accepts its handoff, the
commit makes it visible. Real spark-submit, real Spark, a real broker; judged by a read_committed
consumer and the transactions left open."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.airflow_dagtest import DagTester, kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv

pytestmark = pytest.mark.kafka

DAG_FILE = REPO / "dags" / "kafka2pc_spark_submit.py"
PREFIX = "kafka2pc_spark_submit.orders"


def _env(kafka: KafkaEnv, topic: str) -> dict[str, str]:
    return {
        **kafka2pc_connection(kafka),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": kafka.bootstrap,
        "KAFKA2PC_SPARK_SUBMIT_TOPIC": topic,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit
        "PYSPARK_PYTHON": sys.executable,
    }


def test_a_submitted_application_is_committed_once_through_its_handoff(kafka: KafkaEnv, dag_tester: DagTester) -> None:
    topic, rows = kafka.topic(partitions=2), 20_000
    # The sensor deferrable, as [operators] default_deferrable makes it: its wait runs as a trigger.
    env = {**_env(kafka, topic), "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True"}
    result = dag_tester.run(DAG_FILE, "kafka2pc_spark_submit", {"rows": rows, "partitions": 4}, env)
    assert result.state == "success", result.log.read_text(errors="replace")[-4000:]
    assert result.tasks == {"submit": "success", "handoff": "success", "commit": "success", "abort": "skipped"}
    keys = [r.key for r in kafka.read_committed(topic) if r.key and r.key.startswith(result.run_id.encode())]
    assert (len(keys), len(set(keys))) == (rows, rows)
    assert kafka.open_transactions(PREFIX) == []
    text = result.log.read_text(errors="replace")
    assert "Pausing task as DEFERRED" in text and "[DAG TEST] Trigger completed" in text  # the sensor deferred
    assert "kafka2pc: accepted attempt local-" in text and "4 transaction(s), 20000 records, open on the broker" in text
