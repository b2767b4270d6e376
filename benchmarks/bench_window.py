"""The window row: how long an export hides other producers' records from read_committed readers.

A source whose computation takes about a minute on ``local[2]`` (16,000 records in 8 partitions, the
first row of each sleeping 15 s in the JVM) is exported and committed twice: not materialized first
(the computation runs inside the transaction window, as before issue 20) and materialized first (the
default). Meanwhile a plain producer writes one record every 100 ms to the same topic and a
read_committed consumer notes when each becomes readable (``tests/helpers/stall.py``). Reported:
the compute and write times, the commit, and the longest and median delay of those records sent
while the export ran.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

from bench_env import Kafka

ROWS, PARTITIONS, FIRST_ROW_SLEEP_MS = 16_000, 8, 15_000


def slow_source(spark: Any) -> Any:
    per_partition = ROWS // PARTITIONS
    sleep = f"java_method('java.lang.Thread', 'sleep', CAST({FIRST_ROW_SLEEP_MS} AS BIGINT))"
    return spark.range(ROWS, numPartitions=PARTITIONS).selectExpr(
        "CAST(id AS STRING) AS key",
        f"concat('value-', CAST(id AS STRING), coalesce(CASE WHEN id % {per_partition} = 0 THEN {sleep} END, ''))"
        " AS value",
    )


def window_run(kafka: Kafka, spark: Any, decisions: str, materialize: bool) -> dict[str, Any]:
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from tests.helpers.stall import StallProbe

    topic = kafka.topic(f"window{int(materialize)}")
    settings = ExportSettings(f"benchw{uuid.uuid4().hex[:8]}", kafka.config, topic)
    decision_log = DecisionLog(kafka.config, topic=decisions)
    with WireClient(kafka.config) as wire, StallProbe(kafka.config, topic) as probe:
        time.sleep(1)
        started = time.monotonic()
        result = export_dataframe(slow_source(spark), settings, window=WindowSettings(materialize=materialize))
        prepared = time.monotonic()
        commit_prepared(result.committables, wire, decision_log, run=f"bench-{settings.transactional_id_prefix}")
        done = time.monotonic()
        time.sleep(1)
        probe.stop()
    decision_log.close()
    during = [probe.seen.get(k, float("inf")) - t for k, t in probe.sent.items() if started <= t <= done]
    committed = kafka.count_committed(topic)
    return {
        "materialize": materialize,
        "records": result.records,
        "compute_s": round(result.materialize_s, 3) if materialize else None,
        "write_s": round(result.write_s, 3),  # not materialized: the compute runs inside it
        "commit_s": round(done - prepared, 3),
        "export_and_commit_s": round(done - started, 3),
        "probe_records": len(during),
        "longest_delay_s": round(max(during), 3),
        "median_delay_s": round(statistics.median(during), 3),
        "read_committed": committed,
        "verified": committed == ROWS + len(probe.sent) and all(d != float("inf") for d in during),
    }


def render(runs: list[dict[str, Any]]) -> str:
    lines = [
        "Window: a ~60 s source, 16,000 records in 8 partitions; a plain producer's records (1 per 100 ms) "
        "on the same topic, read_committed delay"
    ]
    for r in runs:
        compute = f"compute {r['compute_s']:.1f} s, " if r["compute_s"] is not None else "compute inside the write, "
        how = "materialized first" if r["materialize"] else "not materialized  "
        lines.append(
            f"  {how}: {compute}write {r['write_s']:.1f} s, commit {r['commit_s']:.2f} s; delay of "
            f"{r['probe_records']} records: longest {r['longest_delay_s']:.2f} s, median {r['median_delay_s']:.2f} s; "
            f"verified {'yes' if r['verified'] else 'NO <<<<<<<<'}"
        )
    return "\n".join(lines)
