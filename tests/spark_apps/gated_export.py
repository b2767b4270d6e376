"""A Spark application for the handoff tests, submitted with spark-submit: the example's arguments
and orders (dags/spark_apps/export_orders.py), but written without materializing first and with
order 0 waiting for a gate file (``--gate``, or ``KAFKA2PC_TEST_GATE`` in the environment), so that
a kill or a pause of the driver lands while the other partitions' transactions are open
(``materialize=False`` keeps the wait inside the write job)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--dag-id", "--run-id", "--task-id", "--prefix", "--topic", "--tag"):
        ap.add_argument(name, required=True)
    ap.add_argument("--gate", default=os.environ.get("KAFKA2PC_TEST_GATE"))
    ap.add_argument("--rows", type=int, default=8_000)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kafka2pc.spark.application import export_from_application
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    gate = args.gate

    def value(i: int) -> str:
        while i == 0 and gate and not os.path.exists(gate):
            time.sleep(0.05)
        return f"value-{i}"

    spark = SparkSession.builder.appName("kafka2pc handoff test").getOrCreate()
    try:
        df = spark.range(args.rows, numPartitions=args.partitions).select(
            F.concat(F.lit(f"{args.tag}-"), F.col("id").cast("string")).alias("key"),
            F.udf(value, "string")(F.col("id")).alias("value"),
        )
        handoff = export_from_application(
            df,
            topic=args.topic,
            transactional_id_prefix=args.prefix,
            dag_id=args.dag_id,
            run_id=args.run_id,
            task_id=args.task_id,
            window=WindowSettings(materialize=False),
        )
    finally:
        spark.stop()
    print(json.dumps({"handed_off": handoff is not None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
