"""The export's SparkSession, built the way the apache-spark provider's PySparkOperator builds one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow.sdk import BaseHook

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
    import warnings

    # PySpark warns on import that it does not fully support pandas 3; the export moves Arrow batches
    # (mapInArrow), not pandas frames, so the warning says nothing about the run.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    conf.set("spark.app.name", app_name)
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
    if url.startswith("sc://"):
        conf.set("spark.remote", url)
    for key, value in spark_conf.items():
        conf.set(key, str(value))
    if kafka_source and not conf.get("spark.remote"):
        from airflow_provider_kafka2pc.spark.kafka_source import kafka_source_package, needs_kafka_package

        _add_package(conf, needs_kafka_package, kafka_source_package())
    if avro and not conf.get("spark.remote"):
        from airflow_provider_kafka2pc.spark.record_formats import avro_package, needs_avro_package

        _add_package(conf, needs_avro_package, avro_package())
    if not conf.get("spark.remote") and not conf.get("spark.master"):
        conf.set("spark.master", url)
    # Forced off unless the user turned it on, which check_session then refuses loudly.
    if conf.get("spark.speculation") is None:
        conf.set("spark.speculation", "false")
    if not conf.get("spark.remote"):
        # The console progress bar is one huge stderr line (ERROR in a task log); the export logs
        # its own progress.
        if conf.get("spark.ui.showConsoleProgress") is None:
            conf.set("spark.ui.showConsoleProgress", "false")
        from airflow_provider_kafka2pc.spark.jvm_logs import launch_gateway_with_logs

        launch_gateway_with_logs(conf)
    return SparkSession.builder.config(conf=conf).getOrCreate()


def _add_package(conf: Any, needed: Callable[[Mapping[str, Any]], bool], package: str) -> None:
    """Append ``package`` to ``spark.jars.packages`` when ``needed`` says the session lacks it."""
    given = {k: conf.get(k) or "" for k in ("spark.jars", "spark.jars.packages")}
    if needed(given):
        conf.set("spark.jars.packages", ",".join(p for p in (given["spark.jars.packages"], package) if p))
