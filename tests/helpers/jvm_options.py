"""The options of every JVM the tests start: the C1 compiler only (one thread of it), the serial
collector, no perf data, and Spark's classes from a class-data-sharing archive made once per
checkout.

The suite is bound by the CPU of two cores, and Spark drivers are its largest share after the
brokers. A short Spark job measured on this machine: 20 CPU-s as Java starts it, 13 with C1 only,
8.5 with the archive as well (its wall time 11 s -> 7 s); a job of 200,000 rows through
``mapInArrow`` 9.1-9.8 CPU-s so, 7.9-8.5 with the serial collector, one compiler thread and no
hsperfdata sampler (what the brokers run with already). The brokers run C1 already
(scripts/kafka_local.py). The options reach every JVM through ``JDK_JAVA_OPTIONS``; a JVM whose
class path the archive does not match (a broker, a Kafka tool, the registry's newer Java) maps
nothing and goes on as before, and its CDS log lines are off, because the Spark launcher's stdout
is a command that spark-class reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.kafka import REPO, kafka_local

# Per checkout, beside the run's other build output; scripts/test makes it before the workers start.
ARCHIVE_DIR = REPO / "build" / "jvm-archives"
LEAN: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1", "-XX:+UseSerialGC", "-XX:-UsePerfData")
# The CDS messages of a JVM that cannot use the archive would land on stdout (the brokers' own).
CDS_QUIET: tuple[str, ...] = kafka_local().CDS_QUIET

# Runs in a fresh interpreter: Spark's driver JVM dumps the classes it loaded when it exits.
_ARCHIVE_JOB = """
import sys, tempfile
from pyspark.sql import SparkSession
from pyspark import SparkContext
archive = sys.argv[1]
session = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.extraJavaOptions", " ".join([f"-XX:ArchiveClassesAtExit={archive}", *sys.argv[2:]]))
    .getOrCreate()
)
frame = session.range(20000).selectExpr("id", "cast(id as string) as v").repartition(2)
frame.mapInArrow(lambda batches: batches, frame.schema).count()
with tempfile.TemporaryDirectory() as d:
    frame.write.parquet(d + "/p")
    session.read.parquet(d + "/p").localCheckpoint().count()
gateway = SparkContext._gateway
session.stop()
gateway.proc.stdin.close()  # the JVM exits when its stdin closes, and dumps the archive then
gateway.proc.wait(120)
"""


def _archive_path(directory: Path) -> Path:
    import pyspark

    java_home = os.environ.get("JAVA_HOME", "")
    key = f"{pyspark.__version__}|{pyspark.__file__}|{java_home}|{' '.join(LEAN)}"
    key = hashlib.sha256(key.encode()).hexdigest()[:12]
    return directory / f"spark-driver-{pyspark.__version__}-{key}.jsa"


def spark_class_archive(directory: Path = ARCHIVE_DIR) -> Path | None:
    """The archive of Spark's driver classes under ``directory``, made when missing; None (and the
    tests run without it) if this Java cannot make one."""
    archive = _archive_path(directory.resolve())
    if archive.is_file():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "JDK_JAVA_OPTIONS": " ".join(LEAN)}
    done = subprocess.run(
        [sys.executable, "-c", _ARCHIVE_JOB, str(partial), *CDS_QUIET],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        print(f"tests: no class-data-sharing archive for Spark (exit {done.returncode}): {done.stderr[-1500:]}")
        return None
    os.replace(partial, archive)  # whole or not at all, should two sessions make one at once
    return archive


def main() -> None:
    """``python -m tests.helpers.jvm_options``: make the archive (scripts/test, before the run)."""
    spark_class_archive()


def jdk_java_options(archive: Path | None) -> str:
    """``JDK_JAVA_OPTIONS`` for every JVM of the tests."""
    if archive is None:
        return " ".join(LEAN)
    return " ".join([*LEAN, f"-XX:SharedArchiveFile={archive}", *CDS_QUIET])


if __name__ == "__main__":
    main()


def stop_driver_jvm() -> None:
    """End this process's Spark driver JVM, so that the next session starts one of its own.

    PySpark starts the JVM once per process, with the settings of the first session as Java system
    properties, and every later session of the process takes them as defaults. So a session that needs
    something only a starting JVM reads (``spark.jars`` on the driver) stops it first, and a session
    whose settings must not outlive it (a driver address in an emulated network that is destroyed
    afterwards: the next module's local session failed to bind) stops it last."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:  # the JVM ends when its stdin closes
        with contextlib.suppress(OSError):
            proc.stdin.close()
        proc.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None
