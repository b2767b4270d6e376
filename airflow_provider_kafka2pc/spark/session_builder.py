"""A SparkSession for kafka2pc's jobs, from a SparkConf the caller filled: the export operator
(from the Spark connection, as the apache-spark provider's PySparkOperator does) and ``kafka2pc
repair`` (from its command line). Adds what the job needs and the user did not bring."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def spark_conf(app_name: str) -> Any:
    """An empty SparkConf named ``app_name``."""
    import warnings

    # PySpark warns on import that it does not fully support pandas 3; the export moves Arrow batches
    # (mapInArrow), not pandas frames, so the warning says nothing about the run.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark import SparkConf

    conf = SparkConf()
    conf.set("spark.app.name", app_name)
    return conf


def build_session(conf: Any, url: str, kafka_source: bool = False, avro: bool = False) -> Any:
    """The session at master ``url`` (``sc://``: Spark Connect) with ``conf``; with ``kafka_source``,
    Spark's Kafka source is added to ``spark.jars.packages`` unless ``conf`` already brings it (its
    jars or its package); with ``avro``, spark-avro likewise (the Avro formats use its ``to_avro``)."""
    from pyspark.sql import SparkSession

    if url.startswith("sc://"):
        conf.set("spark.remote", url)
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


__all__ = ["build_session", "spark_conf"]
