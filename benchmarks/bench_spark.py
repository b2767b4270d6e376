"""Spark for the benchmark: the Kafka sink's jars (fetched with Maven once) and one local session."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench_env import kafka_local

SPARK_VERSION = "4.2.0"
POM = Path(__file__).resolve().with_name("pom.xml")


def sink_jars() -> list[Path]:
    """spark-sql-kafka and the jars pyspark lacks, in ``${KAFKA2PC_CACHE:-~/.cache/kafka2pc}``.

    Fetched by ``mvn dependency:copy-dependencies`` of ``benchmarks/pom.xml`` the first time, and
    again whenever the pom changes (its hash is kept in a marker file next to the jars)."""
    root: Path = kafka_local().cache_dir()
    libs = root / f"spark-sql-kafka-{SPARK_VERSION}"
    marker = root / f"spark-sql-kafka-{SPARK_VERSION}.complete"
    wanted = {"pom_sha256": hashlib.sha256(POM.read_bytes()).hexdigest()}
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".spark-sql-kafka.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = json.loads(marker.read_text()) if marker.is_file() else None
            if current != wanted or not any(libs.glob("*.jar")):
                _fetch(libs)
                marker.write_text(json.dumps(wanted) + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return sorted(libs.glob("*.jar"))


def _fetch(libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn not found on PATH; Maven fetches Spark's Kafka sink jars")
    shutil.rmtree(libs, ignore_errors=True)
    command = [mvn, "-q", "-B", "-f", str(POM), f"-Dspark.kafka.libs={libs}", "dependency:copy-dependencies"]
    print(f"fetching Spark's Kafka sink jars into {libs}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(libs.glob("*.jar")):
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")


@contextlib.contextmanager
def session(
    jars: list[Path], driver_memory: str = "4g", conf: Mapping[str, str] | None = None, master: str = "local[2]"
) -> Iterator[Any]:
    """One SparkSession (``local[2]``, or ``master``: e.g. the emulated cluster's standalone master) with
    the sink's jars and ``conf``; Python workers run this interpreter.

    The JVM is started from an empty temporary directory: Spark's Python workers run with the
    JVM's working directory first on ``sys.path``, and from the repository root that would
    shadow a copy of the package put on ``PYTHONPATH``."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    # pyspark 4.2 warns about pandas 3 on every Arrow UDF; the benchmark uses no pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    workdir = tempfile.mkdtemp(prefix="kafka2pc-bench-spark-")
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        builder = SparkSession.builder
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        spark = (
            builder.master(master)
            .appName("kafka2pc-benchmark")
            .config("spark.jars", ",".join(str(j) for j in jars))
            .config("spark.driver.memory", driver_memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
    finally:
        os.chdir(previous)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def connect_session(master: str, conf: Mapping[str, str], driver_memory: str) -> Iterator[Any]:
    """A Spark Connect server on ``master`` with ``conf`` (a child of this process, so that its CPU is
    counted where its executors are local; ``tests/helpers/spark_cluster.py`` starts it) and a
    client session of it: row (k), the export as a Connect client runs it."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from tests.helpers.spark_cluster import connect_server

    directory = Path(tempfile.mkdtemp(prefix="kafka2pc-bench-connect-"))
    settings = {"spark.driver.memory": driver_memory, "spark.sql.shuffle.partitions": "4", **conf}
    host = settings.get("spark.driver.host")  # the emulated cluster's: the daemon binds there too
    try:
        with connect_server(directory, master, settings, {"SPARK_LOCAL_IP": host} if host else None) as server:
            was_set = "SPARK_CONNECT_MODE_ENABLED" in os.environ
            session = ConnectSession.builder.remote(server.url).getOrCreate()
            try:
                yield session
            finally:
                session.stop()
                if not was_set:  # a classic session started later in this process would refuse to start
                    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def worker_package(spark: Any) -> str:
    """Where Spark's Python workers import ``airflow_provider_kafka2pc`` from (a scratch copy?)."""

    def where(_: Iterator[Any]) -> Iterator[str]:
        import airflow_provider_kafka2pc

        yield str(Path(airflow_provider_kafka2pc.__file__).parent)

    return str(spark.sparkContext.parallelize([0], 1).mapPartitions(where).first())
