"""Two exports feeding one commit and one abort (dags/kafka2pc_two_exports.py's shape), for faults.

Export ``a`` fails fast (its source raises on the driver); export ``b`` is slow (the first row of
its partition 0 sleeps ``sleep_s`` seconds inside the Spark job, the other partitions' transactions
already prepared and open). The abort (``all_done``) must wait for ``b`` to finish, then abort what
``b`` prepared. Environment as in e2e_kafka2pc.py: E2E_PREFIX (the exporters are
``{E2E_PREFIX}_two_a`` and ``{E2E_PREFIX}_two_b``), E2E_TOPIC, E2E_DEFERRABLE. The run's conf:
``tag``, ``rows``, ``partitions``, ``sleep_s``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_kafka2pc.operators.commit import Kafka2PCAbortOperator, Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

PREFIX = os.environ.get("E2E_PREFIX", "e2e")
TOPIC = os.environ.get("E2E_TOPIC", "e2e")
PREFIXES = {"a": f"{PREFIX}_two_a", "b": f"{PREFIX}_two_b"}


def fails_fast(spark: Any, context: Any) -> Any:
    raise RuntimeError("injected: export a cannot build its DataFrame")


def slow(spark: Any, context: Any) -> Any:
    from pyspark.sql import functions as F

    conf = context["dag_run"].conf or {}
    rows, partitions, tag = int(conf.get("rows", 2000)), int(conf.get("partitions", 4)), str(conf.get("tag", "two"))
    sleep_s = float(conf.get("sleep_s", 30))

    def value(i: int) -> str:
        if i == 0:
            time.sleep(sleep_s)
        return f"value-{i}"

    df = spark.range(rows, numPartitions=partitions)
    key = F.concat(F.lit(f"{tag}-"), F.col("id").cast("string"))
    return df.select(key.alias("key"), F.udf(value, "string")(F.col("id")).alias("value"))


with DAG(
    dag_id="e2e_two_exports",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
) as dag:
    exports = []
    for name, source in (("a", fails_fast), ("b", slow)):
        recover = Kafka2PCRecoverySensor(
            task_id=f"recover_{name}",
            transactional_id_prefix=PREFIXES[name],
            deferrable=os.environ.get("E2E_DEFERRABLE", "") == "1",
            poke_interval=1.0,
            timeout=300,
        )
        export = Kafka2PCExportOperator(
            task_id=f"prepare_{name}",
            transactional_id_prefix=PREFIXES[name],
            topic=TOPIC,
            source=source,
            spark_conf={"spark.master": "local[2]", "spark.ui.enabled": "false"},
            # b's slow row must run while its other partitions' transactions are open: in the write job.
            materialize=name != "b",
        )
        recover >> export
        exports.append(export)
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids=[e.task_id for e in exports])
    abort = Kafka2PCAbortOperator(
        task_id="abort",
        export_task_ids=[e.task_id for e in exports],
        transactional_id_prefixes=list(PREFIXES.values()),
    )
    exports >> commit
    exports >> abort
