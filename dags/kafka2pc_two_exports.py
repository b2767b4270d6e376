"""Two exports, one decision: orders and their order lines become visible together or not at all.

Each export prepares its own transactions; a single commit task commits both sets under one
decision, and a single abort task rolls both back if either prepare fails.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_kafka2pc.operators.abort import Kafka2PCAbortOperator
from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

ORDERS, LINES = "kafka2pc_two_orders", "kafka2pc_two_order_lines"
PREFIXES = {"orders": "kafka2pc_two.orders", "lines": "kafka2pc_two.lines"}


def orders(spark: Any, context: Any) -> Any:
    return spark.range(20_000, numPartitions=4).selectExpr(
        "CAST(id AS STRING) AS key", "to_json(named_struct('order_id', id)) AS value"
    )


def order_lines(spark: Any, context: Any) -> Any:
    # Three lines per order, keyed by order id and line number.
    return spark.range(60_000, numPartitions=4).selectExpr(
        "concat(CAST(id DIV 3 AS STRING), '/', CAST(id % 3 AS STRING)) AS key",
        "to_json(named_struct('order_id', id DIV 3, 'line', id % 3)) AS value",
    )


with DAG(
    dag_id="kafka2pc_two_exports",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["kafka2pc", "example"],
) as dag:
    exports = []
    for name, topic, source in (("orders", ORDERS, orders), ("lines", LINES, order_lines)):
        recover = Kafka2PCRecoverySensor(task_id=f"recover_{name}", transactional_id_prefix=PREFIXES[name])
        export = Kafka2PCExportOperator(
            task_id=f"prepare_{name}", transactional_id_prefix=PREFIXES[name], topic=topic, source=source
        )
        recover >> export
        exports.append(export)
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids=[e.task_id for e in exports], retries=3)
    abort = Kafka2PCAbortOperator(
        task_id="abort",
        export_task_ids=[e.task_id for e in exports],
        transactional_id_prefixes=list(PREFIXES.values()),
    )
    exports >> commit
    exports >> abort
