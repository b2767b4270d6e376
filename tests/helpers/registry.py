"""Test helpers around the real Apicurio Registry started by scripts/schema-registry-local, and a
SparkSession whose JVM has spark-avro on its class path."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow_provider_kafka2pc.registry.client import RegistryClient, RegistrySettings
from tests.helpers.jvm_options import stop_driver_jvm
from tests.helpers.kafka import kafka_local, load_script


def schema_registry_local() -> ModuleType:
    if "kafka_local" not in sys.modules:  # the registry script imports it by name: the fixtures' copy
        kafka_local()
    return load_script("schema_registry_local")


@dataclass(frozen=True)
class RegistryEnv:
    """One registry of the test session: HTTP basic auth required, one user."""

    directory: Path
    url: str  # the Confluent-compatible API
    user: str
    password: str = field(repr=False)

    def settings(self, **overrides: Any) -> RegistrySettings:
        given: dict[str, Any] = {"url": self.url, "username": self.user, "password": self.password}
        return RegistrySettings(**(given | overrides))

    def client(self) -> RegistryClient:
        return RegistryClient(self.settings())

    def confluent_client(self) -> Any:
        """confluent-kafka's own registry client: the reader the acceptance is judged by."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        # Its default is no timeout at all: one request left unanswered on a loaded machine held a test
        # for 12 minutes. With one, the client's own retries take over.
        auth = f"{self.user}:{self.password}"
        return SchemaRegistryClient({"url": self.url, "basic.auth.user.info": auth, "timeout": 10})


def spark_avro_jar() -> Path:
    """spark-avro for the installed PySpark (its Scala suffix too: 2.12 for 3.5), fetched once into
    the jar cache (``mvn dependency:copy``)."""
    from airflow_provider_kafka2pc.spark.versions import spark_build

    build = spark_build()
    version = build.version
    libs = kafka_local().cache_dir() / f"spark-avro-{version}"
    jar = libs / f"spark-avro_{build.scala}-{version}.jar"
    libs.mkdir(parents=True, exist_ok=True)
    with (libs.parent / ".spark-avro.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not jar.is_file():
                mvn = shutil.which("mvn")
                assert mvn is not None, "mvn not found on PATH; Maven fetches spark-avro"
                artifact = build.package("spark-avro")
                command = [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={libs}"]
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                assert result.returncode == 0 and jar.is_file(), f"{command} failed:\n{result.stdout}{result.stderr}"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return jar


@contextlib.contextmanager
def spark_with_avro() -> Iterator[Any]:
    """A local[2, 4] SparkSession in a JVM that has spark-avro, as the export operator's session has."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    jar = spark_avro_jar()
    stop_driver_jvm()  # spark.jars reaches the driver only when its JVM starts
    session = (
        SparkSession.builder.master("local[2, 4]")
        .appName("kafka2pc-registry-tests")
        .config("spark.jars", str(jar))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()
