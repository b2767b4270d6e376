"""docker-compose.yml, its Dockerfile, the example DAG and the connections agree (no engine needed).

CI also runs ``docker-compose config`` on it (scripts/test); this checks what that cannot: names,
host names, ports and versions across the files, and the connections through the hook's mapping.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_kafka2pc.hooks.kafka2pc import client_config
from tests.helpers.kafka import kafka_local

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_COMPONENTS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def locked(package: str) -> str:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(package)}==(\S+)$", text, re.MULTILINE | re.IGNORECASE)
    assert match, package
    return match.group(1)


def dockerfile_args() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))


def dockerfile_stages() -> dict[str, str]:
    """Stage name -> its FROM, with the ARG defaults filled in."""
    args = dockerfile_args()
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return {
        stage: re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        for base, stage in re.findall(r"^FROM (\S+) AS (\w+)$", text, re.MULTILINE)
    }


def example_dag_constant(name: str) -> str:
    tree = ast.parse((ROOT / "dags" / "kafka2pc_example.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError(f"{name} not in the example DAG")


def env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in service["environment"].items()}


def connection(service: dict[str, Any], conn_id: str) -> dict[str, Any]:
    value = env(service).get(f"AIRFLOW_CONN_{conn_id.upper()}")
    assert value is not None, f"no connection {conn_id}"
    parsed = json.loads(value)
    assert isinstance(parsed, dict)
    return parsed


def test_the_services_and_their_official_images(services: dict[str, Any]) -> None:
    assert {"kafka", "kafka-init", "spark-master", "spark-worker", "postgres", "airflow-init"} | set(
        AIRFLOW_COMPONENTS
    ) <= set(services)
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_local().KAFKA_VERSION}"
    assert services["kafka-init"]["image"] == services["kafka"]["image"]
    assert services["postgres"]["image"].startswith("postgres:")

    stages = dockerfile_stages()
    airflow_image = f"apache/airflow:{locked('apache-airflow')}-python{dockerfile_args()['PYTHON_VERSION']}"
    assert stages["airflow"] == airflow_image  # the Airflow CI tests, the driver's Python
    spark_image = services["spark-master"]["image"]
    assert spark_image.startswith(f"apache/spark:{locked('pyspark')}-")  # cluster and driver: one Spark
    assert stages["spark"] == spark_image  # the worker is the master's image plus the package
    assert services["spark-worker"]["build"] == {"context": ".", "target": "spark"}
    for name, command in AIRFLOW_COMPONENTS.items():
        assert services[name]["build"] == {"context": ".", "target": "airflow"}
        assert services[name]["command"] == [command]
    assert services["airflow-init"]["command"] == ["db", "migrate"]


def test_airflow_runs_on_postgres_and_its_secrets_come_from_the_environment(services: dict[str, Any]) -> None:
    scheduler = env(services["airflow-scheduler"])
    assert re.fullmatch(
        r"postgresql\+psycopg2://airflow:\$\{KAFKA2PC_DB_PASSWORD:\?[^}]*\}@postgres:5432/airflow",
        scheduler["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
    )
    assert env(services["postgres"])["POSTGRES_PASSWORD"].startswith("${KAFKA2PC_DB_PASSWORD:?")
    assert scheduler["AIRFLOW__API_AUTH__JWT_SECRET"].startswith("${KAFKA2PC_JWT_SECRET:?")
    assert scheduler["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")
    assert "8080:8080" in services["airflow-apiserver"]["ports"]
    for name in AIRFLOW_COMPONENTS:  # one environment for every component (the merge key)
        assert env(services[name]) == scheduler


def test_the_example_dag_is_mounted_and_its_topic_created(services: dict[str, Any]) -> None:
    scheduler = services["airflow-scheduler"]
    [volume] = scheduler["volumes"]
    source, target, *_ = volume.split(":")
    assert (ROOT / source / "kafka2pc_example.py").is_file()
    assert target == env(scheduler)["AIRFLOW__CORE__DAGS_FOLDER"]
    init = services["kafka-init"]["command"]
    assert init[init.index("--topic") + 1] == example_dag_constant("TOPIC")
    assert init[init.index("--bootstrap-server") + 1] == "kafka:9092"


def test_the_connections_reach_the_services(services: dict[str, Any]) -> None:
    scheduler = services["airflow-scheduler"]
    kafka = connection(scheduler, "kafka2pc_default")
    config = client_config(kafka["conn_type"], kafka.get("host"), kafka.get("port"), None, None, kafka.get("extra", {}))
    kafka_env = env(services["kafka"])
    assert f"PLAINTEXT://{config['bootstrap.servers']}" in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")

    # The example's Spark connection: the master's host and port, the driver where tasks run.
    spark_conn_id = env(scheduler)["KAFKA2PC_EXAMPLE_SPARK_CONN_ID"]
    spark = connection(scheduler, spark_conn_id)
    assert spark["conn_type"] == "spark"
    master = services["spark-master"]
    assert f"{spark['host']}:{spark['port']}" == f"spark://{master['hostname']}:7077"
    assert spark["extra"]["spark.driver.host"] == scheduler["hostname"] == "airflow-scheduler"
    assert services["spark-worker"]["command"][-1] == f"spark://{master['hostname']}:7077"
