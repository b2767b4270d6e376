"""The soak's Spark prepare: one long-lived SparkSession (``local[2, 4]``: a failed task is retried,
as on a cluster) that runs the exporter's real prepare job for each request it reads on stdin.

Request (one JSON line): ``{"count": N, "records": R, "tag": T, "topic": ..., "prefix": ..., "slow_s": S}``;
the first row of every partition takes S seconds, so that a task lives long enough to be struck.
Answer (one JSON line): ``{"committables": [...], "retried": [slots]}`` or ``{"error": "..."}``.
Python workers are not reused, so a worker process exists only while a task runs: the harness
SIGKILLs one of them (``python_workers``) to make a real Spark task failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path


def python_workers(root: int) -> list[int]:
    """Forked Spark Python workers under ``root``: children of a ``pyspark.daemon`` process."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    under: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - under
        under |= frontier

    def is_daemon(p: int) -> bool:
        try:
            return b"pyspark.daemon" in Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            return False

    daemons = {p for p in under if is_daemon(p) and not is_daemon(parent.get(p, 0))}
    return sorted(p for p in under if parent.get(p) in daemons)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

    bootstrap = sys.argv[1]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2, 4]")
        .appName("kafka2pc-soak")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        tag, records, slow_s = req["tag"], int(req["records"]), float(req.get("slow_s", 0))

        def value(i: int, records: int = records, slow_s: float = slow_s) -> str:
            if i % records == 0:  # the first row of its partition
                time.sleep(slow_s)
            return str(i)

        df = spark.range(req["count"] * records, numPartitions=req["count"]).select(
            F.concat(
                F.lit(f"{tag}/"), F.spark_partition_id().cast("string"), F.lit("/"), F.col("id").cast("string")
            ).alias("key"),
            F.udf(value, "string")(F.col("id")).alias("value"),
        )
        settings = ExportSettings(req["prefix"], {"bootstrap.servers": bootstrap}, req["topic"])
        try:
            # The soak kills Python workers mid-write (transactions open): the slow first rows must run
            # in the write job, so the frame is not materialized first (the window tests cover that).
            result = export_dataframe(df, settings, window=WindowSettings(materialize=False))
            out = {"committables": [c.to_json() for c in result.committables], "retried": list(result.retried)}
        except Exception as e:  # reported to the harness, which treats it as a failed prepare
            out = {"error": f"{type(e).__name__}: {e}"[-2000:]}
        print(json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
