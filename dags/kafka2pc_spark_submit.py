"""Exactly once from a Spark application that Airflow submits, its driver not the Airflow task:
submit → accept the handoff → commit, or abort.

``SparkSubmitOperator`` (the apache-spark provider) runs ``dags/spark_apps/export_orders.py`` on the
``spark`` connection ``KAFKA2PC_SPARK_SUBMIT_CONN_ID`` (default ``spark_default``: any master and
deploy mode spark-submit takes). The application prepares one Kafka transaction per Spark partition
with ``export_from_application`` and hands them off through the decision topic;
``Kafka2PCHandoffSensor`` accepts the driver attempt the broker still holds open and pushes its
committables; the commit makes them visible, or the abort ends everything the run left open when
the application failed or never handed off. Needs a ``kafka2pc_default`` connection, the data topic
``KAFKA2PC_SPARK_SUBMIT_TOPIC`` (default ``kafka2pc_submitted_orders``), and Kafka's address for the
application in ``KAFKA2PC_EXAMPLE_BOOTSTRAP``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

from airflow_provider_kafka2pc.operators.abort import Kafka2PCAbortOperator
from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.sensors.handoff import Kafka2PCHandoffSensor

PREFIX = "kafka2pc_spark_submit.orders"
TOPIC = os.environ.get("KAFKA2PC_SPARK_SUBMIT_TOPIC", "kafka2pc_submitted_orders")
# Your own application takes its place: any that calls export_from_application with these arguments.
APPLICATION = os.environ.get("KAFKA2PC_SPARK_SUBMIT_APPLICATION") or str(
    Path(__file__).parent / "spark_apps" / "export_orders.py"
)
# The run's identity goes to the application as arguments: it hands off under this DAG run.
APPLICATION_ARGS = [
    "--dag-id", "{{ dag.dag_id }}", "--run-id", "{{ run_id }}", "--task-id", "{{ task.task_id }}",
    "--prefix", PREFIX, "--topic", TOPIC,
    "--rows", "{{ params.rows }}", "--partitions", "{{ params.partitions }}", "--tag", "{{ run_id }}",
]  # fmt: skip

with DAG(
    dag_id="kafka2pc_spark_submit",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"rows": Param(100_000, type="integer", minimum=1), "partitions": Param(4, type="integer", minimum=1)},
    tags=["kafka2pc"],
) as dag:
    submit = SparkSubmitOperator(
        task_id="submit",
        application=APPLICATION,
        conn_id=os.environ.get("KAFKA2PC_SPARK_SUBMIT_CONN_ID", "spark_default"),
        name="kafka2pc-orders",
        application_args=APPLICATION_ARGS,
        # Your cluster's settings on top, as JSON in KAFKA2PC_SPARK_SUBMIT_CONF (executor sizes, the
        # Python of YARN's containers, spark.yarn.maxAppAttempts, ...).
        conf={
            "spark.ui.enabled": "false",
            "spark.speculation": "false",
            **json.loads(os.environ.get("KAFKA2PC_SPARK_SUBMIT_CONF") or "{}"),
        },
        # Kafka's address for the application; PYSPARK_PYTHON: the interpreter that has kafka2pc.
        env_vars={
            "KAFKA2PC_BOOTSTRAP_SERVERS": os.environ.get("KAFKA2PC_EXAMPLE_BOOTSTRAP", "127.0.0.1:9092"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        },
        retries=1,
        retry_delay=timedelta(seconds=5),
        # The submit operator's own options for your cluster, as JSON in KAFKA2PC_SPARK_SUBMIT_OPTIONS
        # (YARN cluster mode: {"yarn_track_via_rm_api": true}, the connection naming the RM's webapp).
        **json.loads(os.environ.get("KAFKA2PC_SPARK_SUBMIT_OPTIONS") or "{}"),
    )
    handoff = Kafka2PCHandoffSensor(task_id="handoff", transactional_id_prefix=PREFIX, poke_interval=2.0, timeout=1800)
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="handoff")
    abort = Kafka2PCAbortOperator(
        task_id="abort", export_task_ids="handoff", transactional_id_prefixes=PREFIX, naming_strategy="INCREMENTING"
    )
    submit >> handoff >> [commit, abort]
