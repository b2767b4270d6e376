"""The export's SparkSession, built the way the apache-spark provider's PySparkOperator builds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_kafka2pc.spark.session_builder import build_session

# What the apache-spark provider's PySparkOperator uses when no Spark connection is given.
DEFAULT_SPARK_MASTER = "local[*]"
SPARK_CONNECT_CONN_TYPE = "spark_connect"


def spark_session(
    spark_conn_id: str | None,
    spark_conf: Mapping[str, Any],
    app_name: str,
    kafka_source: bool = False,
    avro: bool = False,
) -> Any:
    """A SparkSession the way the apache-spark provider's PySparkOperator builds one; with
    ``kafka_source``, Spark's Kafka source is added to ``spark.jars.packages`` unless the
    connection or ``spark_conf`` already brings it (its jars or its package); with ``avro``,
    spark-avro likewise (the Avro key and value formats encode with its ``to_avro``)."""
    from airflow_provider_kafka2pc.spark.session_builder import spark_conf as new_conf

    conf = new_conf(app_name)
    url = DEFAULT_SPARK_MASTER
    if spark_conn_id:
        conn = BaseHook.get_connection(spark_conn_id)
        if conn.conn_type == SPARK_CONNECT_CONN_TYPE:
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            url = SparkConnectHook(spark_conn_id).get_connection_url()
        elif conn.port:
            url = f"{conn.host}:{conn.port}"
        elif conn.host:
            url = conn.host
        for key, value in conn.extra_dejson.items():
            conf.set(key, str(value))
    for key, value in spark_conf.items():
        conf.set(key, str(value))
    return build_session(conf, url, kafka_source=kafka_source, avro=avro)
