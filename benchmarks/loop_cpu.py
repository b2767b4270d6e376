"""CPU cost per record of ``write_partition``: a measure that survives a busy machine.

    .venv/bin/python benchmarks/loop_cpu.py --bootstrap HOST:PORT [--rows 400000] [--runs 5] [--shape plain|full]
        [--writers python,native] [--batch-rows 10000] [--set linger.ms=50 ...]

Feeds the Arrow batches Spark would hand one ``mapInArrow`` task (``--shape plain``: non-null
string key and value, as in the benchmark; ``full``: also topic, partition and headers columns)
to ``write_partition`` (EXACTLY_ONCE, one transaction per run), and reports, per record, the CPU
time of the Python thread (``thread_time``: the produce loop, conversions, delivery callbacks)
and of the whole process (``process_time``: plus librdkafka's threads). Wall clock is printed too,
but on a shared machine only the CPU columns compare variants. The prepared transactions are
aborted afterwards (``recover`` without a decision). ``--writers`` names the paths to compare
(``ExportSettings.writer``); their runs are interleaved, so a busy spell hits each alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import bench_data
from bench_env import Kafka, use_repo
from profile_write import abort_prefix


def _full_shape(partition: list[Any], topic: str) -> list[Any]:
    """The plain batches plus topic, partition and headers columns (the general produce loop)."""
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    out = []
    for b in partition:
        n = b.num_rows
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    b.column(0),
                    b.column(1),
                    pa.array([topic] * n, pa.string()),
                    pa.array([i % 4 for i in range(n)], pa.int32()),
                    pa.array([[{"key": "h", "value": b"v"}]] * n, pa.list_(header)),
                ],
                names=["key", "value", "topic", "partition", "headers"],
            )
        )
    return out


def one_run(
    kafka: Kafka, batches: list[Any], shape: str, timeout_ms: int, overrides: dict[str, Any], writer: str = "auto"
) -> tuple[float, float, float, str]:
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import write_partition

    topic = kafka.topic("loopcpu")
    if shape == "full":
        batches = _full_shape(batches, topic)
    config = {**kafka.config, **overrides}
    settings = ExportSettings(
        f"loopcpu{uuid.uuid4().hex[:8]}", config, topic, transaction_timeout_ms=timeout_ms, writer=writer
    )
    wall, thread, proc = time.perf_counter(), time.thread_time(), time.process_time()
    out = list(write_partition(settings, 0, 0, iter(batches)))
    wall, thread, proc = time.perf_counter() - wall, time.thread_time() - thread, time.process_time() - proc
    assert len(out) == 1 and out[0].column(2)[0].as_py() == sum(b.num_rows for b in batches)
    return wall, thread, proc, settings.transactional_id_prefix


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--rows", type=int, default=400_000, help="records per run (one partition)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--shape", choices=("plain", "full"), default="plain")
    ap.add_argument("--payload", choices=sorted(bench_data.PAYLOADS), default="lpad")
    ap.add_argument(
        "--batch-rows", type=int, default=10_000, help="rows per Arrow batch (Spark: arrow.maxRecordsPerBatch)"
    )
    ap.add_argument("--writers", default="auto", help="comma-separated: auto, native, python (interleaved runs)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a producer setting to try")
    args = ap.parse_args(argv)
    use_repo()
    from airflow_provider_kafka2pc.spark import job
    from airflow_provider_kafka2pc.txn.kafka.transactions import broker_max_transaction_timeout_ms

    kafka = Kafka(args.bootstrap)
    timeout_ms = broker_max_transaction_timeout_ms(kafka.config)
    batches = bench_data.arrow_partitions(args.rows, args.payload, partitions=1, batch_rows=args.batch_rows)[0]
    decisions = f"kafka2pc_loopcpu_decisions_{uuid.uuid4().hex[:8]}"
    overrides = dict(kv.split("=", 1) for kv in args.set)
    writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    for writer in writers:  # warm-up: imports, first connection
        abort_prefix(kafka, one_run(kafka, batches[:4], args.shape, timeout_ms, overrides, writer)[3], decisions)
    samples: dict[str, list[tuple[float, float, float, str]]] = {w: [] for w in writers}
    for _ in range(args.runs):
        for writer in writers:
            samples[writer].append(one_run(kafka, batches, args.shape, timeout_ms, overrides, writer))
    for runs in samples.values():
        for _, _, _, prefix in runs:
            abort_prefix(kafka, prefix, decisions)
    kafka.close()
    print(f"{job.__file__}: {args.rows:,} records ({args.shape}) {overrides or ''}, {args.runs} runs, median [min]")
    for writer, runs in samples.items():
        print(f" writer={writer}")
        ns = [tuple(1e9 * x / args.rows for x in s[:3]) for s in runs]
        for i, name in enumerate(("wall", "cpu thread", "cpu process")):
            col = [s[i] for s in ns]
            print(
                f"  {name:<12} {statistics.median(col):6.0f} ns/rec [{min(col):.0f}]"
                f"  = {1e9 / statistics.median(col):>10,.0f} rows/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
