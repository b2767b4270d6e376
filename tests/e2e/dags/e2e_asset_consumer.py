"""Scheduled on the e2e exporter's topic as an asset: runs when a commit made the topic visible.

The asset is written by hand, as a user would: ``kafka://{bootstrap}/{topic}`` from the
``kafka2pc_default`` connection (AIRFLOW_CONN_KAFKA2PC_DEFAULT, one broker) and E2E_TOPIC. Its
task returns the extra of the asset events that triggered the run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, task

BOOTSTRAP = json.loads(os.environ.get("AIRFLOW_CONN_KAFKA2PC_DEFAULT", '{"host": "localhost:9092"}'))["host"]
TOPIC_ASSET = Asset(f"kafka://{BOOTSTRAP}/{os.environ.get('E2E_TOPIC', 'e2e')}")

with DAG(
    dag_id="e2e_asset_consumer",
    schedule=[TOPIC_ASSET],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
):

    @task
    def triggered_by(**context: Any) -> list[dict[str, Any]]:
        return [dict(e.extra) for e in context["triggering_asset_events"][TOPIC_ASSET]]

    triggered_by()
