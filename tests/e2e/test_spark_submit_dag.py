"""dags/kafka2pc_spark_submit.py through ``dag.test()``: ``SparkSubmitOperator`` submits the example
application (its own driver, outside the task), ``Kafka2PCHandoffSensor`` accepts its handoff, the
commit makes it visible. Real spark-submit, real Spark, a real broker; judged by a read_committed
consumer and the transactions left open."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.naming import decision_run_name
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
    # The run has its record: the commit retired its handoff (nothing reads it again).
    state = _decisions(kafka, result.run_id)
    assert state.run_status(PREFIX, _run(result.run_id)) is not None and state.handoffs.get(_key(result.run_id)) in (
        None,
        {},
    ), state.handoffs
    assert "retired 1 handoff record(s) of run" in text


def _run(run_id: str) -> str:
    return decision_run_name("kafka2pc_spark_submit", run_id)


def _key(run_id: str) -> tuple[str, str]:
    return (PREFIX, _run(run_id))


def _decisions(kafka: KafkaEnv, run_id: str) -> LogState:
    log = DecisionLog(kafka.config, topic=DEFAULT_DECISION_TOPIC)
    try:
        return log.read_for(PREFIX, _run(run_id))
    finally:
        log.close()


def _drivers(topic: str) -> list[int]:
    """This test's gated application's driver processes (spark-submit's JVM and its Python), by the
    topic in their arguments: another test's may run beside it."""
    out = subprocess.run(["pgrep", "-f", f"gated_export.py .*--topic {topic} "], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _strike_when_writing(
    kafka: KafkaEnv, topic: str, fenced: set[tuple[str, int, int]], deadline: float
) -> set[tuple[str, int, int]]:
    """Wait until a new driver attempt holds three transactions open (order 0's waits for the gate),
    then SIGKILL its driver; the transactions it held."""
    while True:
        described = TransactionInspector(kafka.wire).describe_prefix(PREFIX)
        open_now = {(s.transactional_id, s.producer_id, s.producer_epoch) for s in described}
        if len(open_now - fenced) >= 3 and _drivers(topic):
            for pid in _drivers(topic):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return open_now
        assert time.monotonic() < deadline, "no attempt of the application got to write"
        time.sleep(0.2)


@pytest.mark.parametrize("kills", [1, 2])
def test_a_driver_killed_mid_write_is_retried_by_airflow_or_aborted_whole(
    kafka: KafkaEnv, dag_tester: DagTester, tmp_path: Path, kills: int
) -> None:
    """The submit task's application is SIGKILLed while three of its four transactions are open.
    Once: Airflow's retry resubmits it, the new attempt fences the first on the same ids, hands off,
    and the run is committed once. Twice (the retry struck too): the submit fails for good, the
    handoff sensor never runs, and the abort still ends what the application left open (it prepared
    elsewhere). Nothing open either way; nothing visible in the second."""
    topic, rows, gate = kafka.topic(partitions=2), 8_000, tmp_path / "gate"
    env = {
        **_env(kafka, topic),
        "KAFKA2PC_SPARK_SUBMIT_APPLICATION": str(REPO / "tests" / "spark_apps" / "gated_export.py"),
        "KAFKA2PC_TEST_GATE": str(gate),
    }
    proc, log = dag_tester.start(DAG_FILE, "kafka2pc_spark_submit", {"rows": rows, "partitions": 4}, env)
    try:
        deadline, fenced = time.monotonic() + 600, set[tuple[str, int, int]]()
        for _ in range(kills):
            fenced |= _strike_when_writing(kafka, topic, fenced, deadline)
        gate.touch()
        proc.wait(timeout=600)
    finally:
        gate.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = dag_tester.result(proc, log)
    keys = [r.key for r in kafka.read_committed(topic) if r.key and r.key.startswith(result.run_id.encode())]
    if kills == 1:
        assert result.state == "success", log.read_text(errors="replace")[-4000:]
        assert (len(keys), len(set(keys))) == (rows, rows)
    else:
        assert result.state == "failed" and result.tasks["abort"] == "success", result.tasks
        assert result.tasks["handoff"] == "upstream_failed" and keys == []
    assert kafka.open_transactions(PREFIX) == []
