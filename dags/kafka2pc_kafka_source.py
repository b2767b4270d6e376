"""Kafka in, Kafka out: enrich the example's orders topic into another topic exactly once, with the
consumer group's offsets committed in the same run (KIP-447).

Reads ``kafka2pc_example_orders`` (written by the ``kafka2pc_example`` DAG: run that first), keeps
orders of at least 10,000 cents, tags them, and exports them to ``kafka2pc_example_big_orders``.
Each run reads what arrived since the last committed run, exactly once; a run that fails or is
aborted moves neither the output nor the group ``kafka2pc-example-big-orders``. Spark's Kafka
source is fetched from Maven Central (``spark.jars.packages``) unless
``KAFKA2PC_EXAMPLE_SPARK_JARS`` names its jars (comma-separated paths).
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_kafka2pc.operators.create_topic import Kafka2PCCreateTopicOperator
from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource
from airflow_provider_kafka2pc.task_group import kafka2pc_export_group

SOURCE = "kafka2pc_example_orders"
TOPIC = "kafka2pc_example_big_orders"
JARS = os.environ.get("KAFKA2PC_EXAMPLE_SPARK_JARS")


def big_orders(df: Any, context: Any) -> Any:
    """The orders of 10,000 cents or more, keyed as before, their value tagged with this run."""
    run_id = str(context["run_id"]).replace("'", "")
    order = "from_json(json, 'order_id BIGINT, amount_cents BIGINT')"
    return (
        df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS json")
        .where("CAST(get_json_object(json, '$.amount_cents') AS BIGINT) >= 10000")
        .selectExpr("key", f"to_json(named_struct('order', {order}, 'run', '{run_id}')) AS value")
    )


with DAG(
    dag_id="kafka2pc_kafka_source",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # POOLING transactional ids, and one consumer group: one run at a time
    tags=["kafka2pc", "example"],
) as dag:
    create_topic = Kafka2PCCreateTopicOperator(task_id="create_topic", topic=TOPIC, partitions=4)
    create_topic >> kafka2pc_export_group(
        group_id="big_orders",
        transactional_id_prefix="kafka2pc_example.big_orders",
        topic=TOPIC,
        source=KafkaSource(SOURCE, group_id="kafka2pc-example-big-orders", transform=big_orders),
        spark_conf={"spark.jars": JARS} if JARS else {},
        retries=0,
        commit_kwargs={"retries": 3},
    )
