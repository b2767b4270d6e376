"""Registry formats vs plain bytes: rows/s of an EXACTLY_ONCE export (prepare + commit) whose value is
a registry-framed Avro or JSON Schema record, against the same rows as plain bytes.

    .venv/bin/python benchmarks/bench_formats.py [--rows 1000000] [--repeat 2]

One process, one broker (started here), one Apicurio Registry (scripts/schema-registry-local), one
``local[2]`` SparkSession with spark-avro. The frame is ``spark.range(N, 4 partitions)`` → key (the row
number as a string) and a value struct (id BIGINT, name STRING, amount DOUBLE), cached and counted first:

| row | the value column |
| --- | --- |
| bytes | ``to_json(struct)`` as binary, built by the user in SQL: the same fields, no registry |
| avro | ``AvroFormat()``: ``to_avro`` behind the 5-byte header, the schema derived and registered once |
| json | ``JsonSchemaFormat()``: ``to_json`` behind the header |

Each timed run (the default writer, native where it can) writes a fresh 4-partition topic and is
verified by a read_committed count (not timed). Runs alternate between rows; the median is shown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_env import REPO, Kafka, broker, use_repo

use_repo()


def _registry() -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    import schema_registry_local

    return schema_registry_local


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    from bench_spark import session

    from airflow_provider_kafka2pc.registry.client import RegistrySettings
    from airflow_provider_kafka2pc.registry.formats import AvroFormat, JsonSchemaFormat
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from tests.helpers.registry import spark_avro_jar

    srl = _registry()
    registry_dir = Path(tempfile.mkdtemp(prefix="kafka2pc-bench-registry-"))
    state = srl.start_registry(registry_dir)
    try:
        with broker(None) as bootstrap, session([spark_avro_jar()], driver_memory="2g") as spark:
            kafka = Kafka(bootstrap)
            rows = spark.range(args.rows, numPartitions=4).selectExpr(
                "CAST(id AS STRING) AS key",
                "named_struct('id', id, 'name', concat('customer-', CAST(id % 1000 AS STRING)), "
                "'amount', id * 0.25) AS value",
            )
            plain = rows.selectExpr("key", "CAST(to_json(value) AS BINARY) AS value").cache()
            framed = rows.cache()
            plain.count(), framed.count()
            registry = RegistrySettings(state["url"])
            cases = {
                "bytes": (plain, None),
                "avro": (framed, RecordFormats(registry, value=AvroFormat())),
                "json": (framed, RecordFormats(registry, value=JsonSchemaFormat())),
            }
            log = DecisionLog(kafka.config, topic=f"bench_decisions_{uuid.uuid4().hex[:6]}")
            log.ensure_topic()
            wire = WireClient(kafka.config)
            seconds: dict[str, list[float]] = {name: [] for name in cases}
            for attempt in range(args.repeat + 1):  # the first round warms up and is not counted
                for name, (df, formats) in cases.items():
                    topic = kafka.topic(name)
                    settings = ExportSettings(f"bench_{name}_{uuid.uuid4().hex[:6]}", kafka.config, topic)
                    started = time.perf_counter()
                    result = export_dataframe(df, settings, formats=formats)
                    commit_prepared(result.committables, wire, log, run=f"{name}{attempt}")
                    took = time.perf_counter() - started
                    kafka.wait_stable(topic)
                    counted = kafka.count_committed(topic)
                    if counted != args.rows:
                        print(f"{name}: read_committed counted {counted}, not {args.rows}", file=sys.stderr)
                        return 1
                    if attempt:
                        seconds[name].append(took)
            wire.close()
            log.close()
            kafka.close()
    finally:
        srl.stop_registry(registry_dir)
    print(f"{args.rows:,} rows, 4 partitions, EXACTLY_ONCE (prepare + commit), median of {args.repeat}")
    print("| value | rows/s | vs bytes |")
    print("| --- | ---: | ---: |")
    base = args.rows / statistics.median(seconds["bytes"])
    for name, took in seconds.items():
        rate = args.rows / statistics.median(took)
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
