"""Run in a subprocess: write keyed rows through Spark's own Kafka sink (``format("kafka")``).

A subprocess because the sink's jars must be on the classpath of a JVM started for them: a
pytest process may already run a JVM started by another test module, and Spark does not add
``spark.jars`` to a running driver's class path. The jars come from the benchmark's Maven
helper (``benchmarks/bench_spark.sink_jars``), fetched once into the jar cache.
"""

from __future__ import annotations

import argparse
import sys

from tests.helpers.kafka import REPO


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--value", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_spark

    with bench_spark.session(bench_spark.sink_jars(), driver_memory="1g") as spark:
        df = spark.range(args.keys, numPartitions=2).selectExpr(
            "concat('order-', cast(id as string)) as key", f"'{args.value}' as value"
        )
        df.write.format("kafka").option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.topic).save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
