"""A Spark application that exports exactly once with kafka2pc, however it is submitted.

Submit it as any PySpark application (``spark-submit`` in client or cluster mode, a Kubernetes
SparkApplication, a Databricks or EMR job). It computes a frame of orders and calls
``export_from_application``, which prepares one Kafka transaction per Spark partition and hands
them to the Airflow side through the decision topic; the DAG that submitted it
(``dags/kafka2pc_spark_submit.py``) accepts them with ``Kafka2PCHandoffSensor`` and commits them.

Kafka's address comes from ``KAFKA2PC_BOOTSTRAP_SERVERS`` (and its security settings from the
librdkafka properties file ``KAFKA2PC_CONFIG_FILE``) in the driver's and executors' environment;
the run's identity from the arguments the DAG templates: ``--dag-id {{ dag.dag_id }} --run-id
{{ run_id }} --task-id {{ task.task_id }}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dag-id", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--task-id", required=True, help="the task that submits this application")
    ap.add_argument("--prefix", required=True, help="the exporter's transactional id prefix")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--tag", default="order", help="the records' key prefix")
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kafka2pc.spark.application import export_from_application

    spark = SparkSession.builder.appName(f"kafka2pc {args.prefix}").getOrCreate()
    try:
        orders = spark.range(args.rows, numPartitions=args.partitions).select(
            F.concat(F.lit(f"{args.tag}-"), F.col("id").cast("string")).alias("key"),
            F.to_json(F.struct(F.col("id"), (F.col("id") % 97).alias("amount"), F.lit(args.run_id).alias("run"))).alias(
                "value"
            ),
        )
        handoff = export_from_application(
            orders,
            topic=args.topic,
            transactional_id_prefix=args.prefix,
            dag_id=args.dag_id,
            run_id=args.run_id,
            task_id=args.task_id,
        )
    finally:
        spark.stop()
    said = {"handed_off": handoff is not None}
    if handoff is not None:
        said.update(attempt=handoff.attempt, transactions=len(handoff.committables), records=handoff.records)
    print(json.dumps(said), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
