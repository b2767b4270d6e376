"""Run in a subprocess: export one partition larger than the Spark JVM's heap, commit it, and print
what it took as JSON (the test judges the outcome on the broker).

A process of its own so that its SparkSession gets a small ``spark.driver.memory`` (the heap of the
local executor too). A thread samples the anonymous resident memory of the Spark Python workers
(``pyspark.daemon`` and its forks): what they hold beyond the staged file's pages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

from airflow_provider_kafka2pc.spark.job import export_dataframe
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings


def _workers_anon_kb() -> int:
    """The largest RssAnon of a Spark Python worker process now (kB)."""
    peak = 0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"pyspark.daemon" not in (proc / "cmdline").read_bytes():
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:  # gone meanwhile
            continue
    return peak


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="client settings as JSON")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--decisions", required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--value-bytes", type=int, required=True)
    ap.add_argument("--heap", default="512m")
    args = ap.parse_args()
    config = json.loads(args.config)
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("kafka2pc-bounded")
        .config("spark.driver.memory", args.heap)
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    heap = int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())
    df = spark.range(args.rows, numPartitions=1).selectExpr(
        "concat('mem-', CAST(id AS STRING)) AS key",
        f"concat(CAST(id AS STRING), repeat('x', {args.value_bytes})) AS value",
    )
    peak = {"kb": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak["kb"] = max(peak["kb"], _workers_anon_kb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = export_dataframe(df, ExportSettings(args.prefix, config, args.topic))
    finally:
        done.set()
        sampler.join()
    with WireClient(config) as wire:
        log = DecisionLog(config, topic=args.decisions)
        try:
            commit_prepared(result.committables, wire, log, run="bounded")
        finally:
            log.close()
    spark.stop()
    print(
        json.dumps(
            {
                "records": result.records,
                "bytes": result.bytes,
                "staged_bytes": result.staged_bytes,
                "heap_bytes": heap,
                "workers_peak_anon_bytes": peak["kb"] * 1024,
                "materialize_s": result.materialize_s,
                "write_s": result.write_s,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
