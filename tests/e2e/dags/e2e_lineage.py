"""An export of a Hive table through ``sql=``, for OpenLineage: prepare → commit.

Env: E2E_PREFIX, E2E_TOPIC, and E2E_SPARK_CONF (JSON: the Hive metastore and warehouse the test
created its table in).
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator

SQL = """
WITH paid AS (SELECT order_id, amount_cents FROM lineage_db.orders WHERE amount_cents > 0)
SELECT CAST(order_id AS STRING) AS key, to_json(named_struct('amount_cents', amount_cents)) AS value FROM paid
"""

with DAG(
    dag_id="e2e_lineage",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # POOLING transactional ids: one run at a time
) as dag:
    prepare = Kafka2PCExportOperator(
        task_id="prepare",
        transactional_id_prefix=os.environ.get("E2E_PREFIX", "e2e_lineage"),
        topic=os.environ.get("E2E_TOPIC", "e2e"),
        sql=SQL,
        spark_conf=json.loads(os.environ.get("E2E_SPARK_CONF", "{}")),
    )
    prepare >> Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
