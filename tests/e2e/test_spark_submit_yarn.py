"""Spark applications on YARN in cluster deploy mode (DESIGN §16): the driver runs in a YARN
container, the ApplicationMaster, on Hadoop's own MiniYARNCluster (tests/helpers/yarn_cluster.py),
neither in the Airflow task nor beside spark-submit. It prepares with ``export_from_application``
and hands off through the decision topic.

- dags/kafka2pc_spark_submit.py through ``dag.test()``, its spark connection ``yarn`` with
  ``deploy-mode: cluster``: exactly once, the handoff accepted from the YARN application's attempt.
- YARN restarts a killed driver (``spark.yarn.maxAppAttempts=2``): the first attempt's
  ApplicationMaster is SIGKILLed while three of its four transactions are open; YARN's second attempt
  writes ids of its own, its recovery pass aborts the first's, and its handoff is the one accepted:
  the commit makes the run visible once, nothing is left open.

Judged by a read_committed consumer and the transactions left open.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, decision_run_name, sanitize_run_key
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from tests.helpers.airflow_dagtest import DagTester, kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv
from tests.helpers.yarn_cluster import YarnCluster, application_masters, mini_yarn
from tests.integration.test_handoff_spark import DAG, _accept, _three_open, _visible, submit_gated

pytestmark = pytest.mark.kafka

DAG_FILE = REPO / "dags" / "kafka2pc_spark_submit.py"
PREFIX = "kafka2pc_spark_submit.orders"
# What a YARN container needs: this virtualenv's Python (which has PySpark and kafka2pc: nothing is
# shipped), small sizes, and the driver restarted once.
SETTINGS = {
    "spark.pyspark.python": sys.executable,
    "spark.driver.memory": "512m",
    "spark.executor.memory": "512m",
    "spark.executor.instances": "2",
    "spark.executor.cores": "1",
    "spark.yarn.maxAppAttempts": "2",
}


@pytest.fixture(scope="module")
def yarn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[YarnCluster]:
    with mini_yarn(tmp_path_factory.mktemp("yarn")) as cluster:
        yield cluster


def _yarn_env(yarn: YarnCluster) -> dict[str, str]:
    """spark-submit's environment for the cluster. pip's PySpark has no python/lib/pyspark.zip to
    ship: the containers' Python has PySpark already, so the archives named are a local path."""
    import pyspark

    return {
        "HADOOP_CONF_DIR": str(yarn.conf_dir),
        "PYSPARK_ARCHIVES_PATH": f"local:{Path(pyspark.__file__).parent.parent}",
    }


def test_the_spark_submit_dag_in_yarn_cluster_mode_is_committed_once_through_its_handoff(
    kafka: KafkaEnv, dag_tester: DagTester, yarn: YarnCluster
) -> None:
    topic, rows = kafka.topic(partitions=2), 8_000
    env = {
        **kafka2pc_connection(kafka),
        **_yarn_env(yarn),
        # Cluster mode, tracked through the ResourceManager's REST API (the provider's durable default).
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {
                "conn_type": "spark",
                "host": "yarn",
                "extra": {"deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": yarn.rm_webapp},
            }
        ),
        "KAFKA2PC_SPARK_SUBMIT_OPTIONS": json.dumps({"yarn_track_via_rm_api": True}),
        "KAFKA2PC_SPARK_SUBMIT_CONF": json.dumps(SETTINGS),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": kafka.bootstrap,
        "KAFKA2PC_SPARK_SUBMIT_TOPIC": topic,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit
        "PYSPARK_PYTHON": sys.executable,
    }
    result = dag_tester.run(DAG_FILE, "kafka2pc_spark_submit", {"rows": rows, "partitions": 4}, env)
    text = result.log.read_text(errors="replace")
    assert result.state == "success", text[-4000:]
    assert result.tasks == {"submit": "success", "handoff": "success", "commit": "success", "abort": "skipped"}
    keys = [r.key for r in kafka.read_committed(topic) if r.key and r.key.startswith(result.run_id.encode())]
    assert (len(keys), len(set(keys))) == (rows, rows)
    assert kafka.open_transactions(PREFIX) == []
    # The driver was YARN's ApplicationMaster: the accepted attempt is the YARN application's first.
    assert "kafka2pc: accepted attempt application_" in text, text[-4000:]


def test_a_driver_yarn_restarts_after_a_kill_mid_write_is_committed_once(
    kafka: KafkaEnv, yarn: YarnCluster, tmp_path: Path
) -> None:
    prefix, topic, run_id = f"hy{uuid.uuid4().hex[:8]}", kafka.topic(partitions=2), "manual__2026-12-06T18:00"
    options = [
        "--deploy-mode",
        "cluster",
        "--conf",
        f"spark.yarn.appMasterEnv.KAFKA2PC_BOOTSTRAP_SERVERS={kafka.bootstrap}",
    ]
    options += [a for k, v in SETTINGS.items() for a in ("--conf", f"{k}={v}")]
    gate, log = tmp_path / "gate", tmp_path / "submit.log"
    submitted = submit_gated(kafka, prefix, topic, run_id, gate, log, "yarn", options, _yarn_env(yarn))
    try:
        _three_open(kafka, prefix, submitted, log)
        application = _application_id(log)
        [master] = application_masters(application)
        os.killpg(master, signal.SIGKILL)  # the first attempt's driver, mid-write
        gate.touch()  # YARN's second attempt does not wait
        submitted.communicate(timeout=600)
        assert submitted.returncode == 0, log.read_text()[-4000:]
    finally:
        if submitted.poll() is None:
            os.killpg(submitted.pid, signal.SIGKILL)
            submitted.wait(60)
    driver = yarn.container_logs(application)
    assert '{"handed_off": true}' in driver, driver[-4000:]
    found = _accept(kafka, prefix, run_id)
    assert found.handoff is not None and found.handoff.attempt == f"{application}.2", found
    decision_log = DecisionLog(kafka.config)
    try:
        members = Members(prefix, NamingStrategy.INCREMENTING, sanitize_run_key(run_id))
        run = decision_run_name(DAG, run_id)
        report = commit_prepared(found.handoff.committables, kafka.wire, decision_log, run, prefixes=[members])
    finally:
        decision_log.close()
    assert report.count(Verdict.COMMITTED) == 4
    assert _visible(kafka, topic, "gated") == (8_000, 8_000)
    assert kafka.open_transactions(prefix) == []


def _application_id(log: Path) -> str:
    """The YARN application spark-submit made, as its log names it."""
    import re

    deadline = time.monotonic() + 60
    while not (found := re.search(r"application_\d+_\d+", log.read_text(errors="replace"))):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return found.group(0)
