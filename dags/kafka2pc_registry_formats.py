"""Avro keys and values for a schema registry: generated orders exported exactly once, each record
framed with its schema's id (magic byte 0, 4-byte id) for consumers that deserialize with the registry.

Needs a ``kafka2pc_default`` connection (Kafka) and a ``kafka2pc_schema_registry_default`` connection
(type *Schema registry (kafka2pc)*: the registry's URL, e.g. ``http://127.0.0.1:8081`` for Confluent
or ``.../apis/ccompat/v7`` for Apicurio Registry, which ``scripts/schema-registry-local`` runs). The
key is an Avro string, the value an Avro record whose schema is derived from the DataFrame and
registered under ``kafka2pc_example_avro_orders-value`` if new (after the registry's compatibility
check, logged by the prepare task). The operator adds spark-avro to the Spark session's packages
(from Maven Central) unless ``KAFKA2PC_EXAMPLE_SPARK_JARS`` names its jar.
"""

from __future__ import annotations

import os
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_kafka2pc.operators.create_topic import Kafka2PCCreateTopicOperator
from airflow_provider_kafka2pc.registry.formats import AvroFormat
from airflow_provider_kafka2pc.task_group import kafka2pc_export_group

TOPIC = "kafka2pc_example_avro_orders"
JARS = os.environ.get("KAFKA2PC_EXAMPLE_SPARK_JARS")


def avro_orders(spark: Any, context: Any) -> Any:
    """key: the order id as a string; value: the order as a struct, which the format encodes."""
    rows = int(context["params"]["rows"])
    return spark.range(rows, numPartitions=4).selectExpr(
        "CAST(id AS STRING) AS key",
        "named_struct('order_id', id, 'amount_cents', id * 7 % 100000, "
        "'customer', concat('customer-', CAST(id % 1000 AS STRING))) AS value",
    )


with DAG(
    dag_id="kafka2pc_registry_formats",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # POOLING transactional ids: one run at a time
    params={"rows": Param(10_000, type="integer", minimum=0)},
    tags=["kafka2pc", "example"],
) as dag:
    create_topic = Kafka2PCCreateTopicOperator(task_id="create_topic", topic=TOPIC, partitions=4)
    create_topic >> kafka2pc_export_group(
        group_id="avro_orders",
        transactional_id_prefix="kafka2pc_example.avro_orders",
        topic=TOPIC,
        source=avro_orders,
        key_format=AvroFormat(),
        value_format=AvroFormat(record_name="kafka2pc.example.Order"),
        schema_registry_conn_id="kafka2pc_schema_registry_default",
        spark_conf={"spark.jars": JARS} if JARS else {},
        retries=0,
        commit_kwargs={"retries": 3},
    )
