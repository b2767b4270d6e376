"""OpenLineage on real Airflow (``dag.test()``), the real openlineage provider (file transport),
real Spark with a Hive metastore, and the real broker: the export of a table through ``sql=``
names the table's stored data as its input and the topic as its output; the commit names the
topic it made visible."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.airflow_dagtest import DagTester, kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv

pytestmark = pytest.mark.kafka

LINEAGE_DAG = REPO / "tests" / "e2e" / "dags" / "e2e_lineage.py"
ROWS = 500

CREATE_TABLE = """
import json, sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for k, v in json.loads(sys.argv[1]).items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
spark.sql("CREATE DATABASE IF NOT EXISTS lineage_db")
df = spark.range(int(sys.argv[2])).selectExpr("id AS order_id", "id * 7 % 1000 + 1 AS amount_cents")
df.write.mode("overwrite").saveAsTable("lineage_db.orders")
spark.stop()
"""


def hive(tmp: Path) -> dict[str, str]:
    """A Hive catalog in Derby under ``tmp``: tables outlive the session that made them."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(tmp / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={tmp / 'metastore'};create=true",
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={tmp}",
    }


def complete_events(events: Path, job: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return [e for e in lines if e.get("eventType") == "COMPLETE" and e["job"]["name"] == job]


def test_lineage_names_the_source_table_and_the_topic(kafka: KafkaEnv, dag_tester: DagTester, tmp_path: Path) -> None:
    spark_conf = hive(tmp_path)
    made = subprocess.run(
        [sys.executable, "-c", CREATE_TABLE, json.dumps(spark_conf), str(ROWS)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    topic, events = kafka.topic(partitions=2), tmp_path / "openlineage.jsonl"
    env = {
        **kafka2pc_connection(kafka),
        "E2E_PREFIX": f"lineage_{uuid.uuid4().hex[:8]}",
        "E2E_TOPIC": topic,
        "E2E_SPARK_CONF": json.dumps(spark_conf),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "e2e",
    }
    result = dag_tester.run(LINEAGE_DAG, "e2e_lineage", {}, env)
    assert result.state == "success", result.log
    keys = [r.key for r in kafka.read_committed(topic)]
    assert len(keys) == ROWS and len(set(keys)) == ROWS

    output = {"namespace": f"kafka://{kafka.bootstrap}", "name": topic}
    (prepared,) = complete_events(events, "e2e_lineage.prepare")
    (stored,) = prepared["inputs"]
    assert (stored["namespace"], stored["name"]) == ("file", str(tmp_path / "warehouse" / "lineage_db.db" / "orders"))
    symlinks = stored["facets"]["symlinks"]["identifiers"]
    assert [(s["name"], s["type"]) for s in symlinks] == [("lineage_db.orders", "TABLE")]  # not the CTE
    assert [{k: d[k] for k in output} for d in prepared["outputs"]] == [output]
    (committed,) = complete_events(events, "e2e_lineage.commit")
    assert committed["inputs"] == []
    assert [{k: d[k] for k in output} for d in committed["outputs"]] == [output]
