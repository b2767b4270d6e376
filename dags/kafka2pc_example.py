"""Export a generated dataset to Kafka exactly once: create the topic if missing → recover → prepare
(Spark) → commit, or abort.

Needs a ``kafka2pc_default`` connection (``scripts/demo`` sets one up for a local broker). Its first
task makes the topic on a fresh cluster (the export never creates data topics: a mistyped topic
fails instead); drop it where the topic is managed elsewhere. Spark runs ``local[*]`` unless
``KAFKA2PC_EXAMPLE_SPARK_CONN_ID`` names a ``spark`` connection (docker-compose.yml sets it to its
standalone cluster's).
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_kafka2pc.operators.commit import topic_asset
from airflow_provider_kafka2pc.operators.create_topic import Kafka2PCCreateTopicOperator
from airflow_provider_kafka2pc.task_group import kafka2pc_export_group

TOPIC = "kafka2pc_example_orders"
SPARK_CONN_ID = os.environ.get("KAFKA2PC_EXAMPLE_SPARK_CONN_ID") or None
# The topic's asset (kafka://{bootstrap}/{topic}, as the commit names it) declared on the commit, so
# Airflow knows it before the first run: KAFKA2PC_EXAMPLE_BOOTSTRAP is the connection's bootstrap
# servers (scripts/demo and docker-compose.yml set it). Unset, the commit emits the asset through the
# kafka2pc asset alias, and Airflow warns that it creates the asset on the way.
BOOTSTRAP = os.environ.get("KAFKA2PC_EXAMPLE_BOOTSTRAP")


def generated_orders(spark: Any, context: Any) -> Any:
    """One record per order: key = order id, value = a JSON document tagged with the run."""
    rows = int(context["params"]["rows"])
    run_id = str(context["run_id"]).replace("'", "")
    return spark.range(rows, numPartitions=int(context["params"]["partitions"])).selectExpr(
        "CAST(id AS STRING) AS key",
        f"to_json(named_struct('order_id', id, 'amount_cents', id * 7 % 100000, 'run', '{run_id}')) AS value",
    )


with DAG(
    dag_id="kafka2pc_example",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # POOLING transactional ids: one run at a time
    params={
        "rows": Param(100_000, type="integer", minimum=0),
        "partitions": Param(8, type="integer", minimum=1),
    },
    tags=["kafka2pc", "example"],
) as dag:
    create_topic = Kafka2PCCreateTopicOperator(task_id="create_topic", topic=TOPIC, partitions=8)
    create_topic >> kafka2pc_export_group(
        group_id="orders",
        transactional_id_prefix="kafka2pc_example.orders",
        topic=TOPIC,
        source=generated_orders,
        spark_conn_id=SPARK_CONN_ID,
        retries=0,
        commit_kwargs={"retries": 3, "outlets": [topic_asset(BOOTSTRAP, TOPIC)] if BOOTSTRAP else []},
    )
