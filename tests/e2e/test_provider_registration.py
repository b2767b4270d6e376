"""The provider as Airflow sees it: registration through the entry point, and DAG parse cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.kafka import REPO

AIRFLOW = Path(sys.executable).parent / "airflow"


def airflow_cli(home: Path, *args: str) -> str:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([str(AIRFLOW), *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_airflow_lists_the_provider_its_hook_and_its_trigger(tmp_path: Path) -> None:
    providers = airflow_cli(tmp_path, "providers", "list", "--output", "json")
    [mine] = [p for p in json.loads(providers) if p["package_name"] == "airflow-provider-kafka2pc"]
    assert mine["version"] == "0.2.0.dev0"  # past 0.1.0: the CHANGELOG's unreleased 0.2.0

    hooks = json.loads(airflow_cli(tmp_path, "providers", "hooks", "--output", "json"))
    [hook] = [h for h in hooks if h["connection_type"] == "kafka2pc"]
    assert hook["class"] == "airflow_provider_kafka2pc.hooks.kafka2pc.Kafka2PCHook"
    assert (hook["package_name"], hook["conn_id_attribute_name"]) == ("airflow-provider-kafka2pc", "kafka2pc_conn_id")
    [registry] = [h for h in hooks if h["connection_type"] == "kafka2pc_schema_registry"]
    assert registry["class"] == "airflow_provider_kafka2pc.hooks.schema_registry.SchemaRegistryHook"
    assert registry["conn_id_attribute_name"] == "schema_registry_conn_id"

    triggers = json.loads(airflow_cli(tmp_path, "providers", "triggers", "--output", "json"))
    assert any(
        t["package_name"] == "airflow-provider-kafka2pc" and t["class"] == "airflow_provider_kafka2pc.triggers.recovery"
        for t in triggers
    ), triggers


PARSE = """
import importlib.util, json, sys, time
t0 = time.perf_counter()
import airflow.sdk
t1 = time.perf_counter()
spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
t2 = time.perf_counter()
heavy = sorted(m for m in ("pyspark", "confluent_kafka", "kafka", "pyarrow") if m in sys.modules)
print(json.dumps({"airflow_sdk_s": t1 - t0, "dag_file_s": t2 - t1, "heavy": heavy}))
"""


@pytest.mark.parametrize(
    "dag_file", ["dags/kafka2pc_example.py", "dags/kafka2pc_two_exports.py", "dags/kafka2pc_registry_formats.py"]
)
def test_parsing_a_dag_never_imports_spark_or_kafka_clients(tmp_path: Path, dag_file: str) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(REPO / dag_file)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"parse {dag_file}: {measured}")  # the numbers go into the docs; pytest -s shows them
    assert measured["heavy"] == []
