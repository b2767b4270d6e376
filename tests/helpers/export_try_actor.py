"""Run in a subprocess: one export try of a Spark frame, by the export task's steps without Airflow
(``Kafka2PCExportOperator._prepare``): the try id read first, the recovery pass, the prefix claim,
the run's status, the try's number (``PrepareSession.begin_try``), then ``export_run`` with the
session's at-once abort. ``--pause-after-seen``: it stops itself right after reading the try id.

``--gate``: the frame is computed before any transaction opens (``materialize``, said here though
it is the default), and its first row waits for that file, so the test can pause the try (SIGSTOP)
after it took its number and before its writers take their ids. Prints each committable as a JSON
line and exits 0; a superseded try says ``SupersededExportError: ...`` on stderr and exits 20.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

SUPERSEDED_EXIT = 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--decision-topic", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--run-key", default=None, help="INCREMENTING ids of this run key (default: POOLING)")
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--tag", required=True, help="the records' key prefix")
    ap.add_argument("--gate", default="")
    ap.add_argument("--pause-after-seen", action="store_true", help="stop itself (SIGSTOP) after it read the try id")
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("airflow_provider_kafka2pc").setLevel(logging.INFO)
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kafka2pc.spark.job import export_run
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
    from airflow_provider_kafka2pc.txn.protocol.errors import SupersededExportError
    from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

    config = {"bootstrap.servers": args.bootstrap}
    strategy = NamingStrategy.INCREMENTING if args.run_key else NamingStrategy.POOLING
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    gate = args.gate

    def value(i: int) -> str:
        while gate and i == 0 and not Path(gate).exists():  # the first row waits: the try is computing
            time.sleep(0.01)
        return f"v{i}"

    df = spark.range(args.rows, numPartitions=args.partitions).select(
        F.concat(F.lit(f"{args.tag}/"), F.col("id").cast("string")).alias("key"),
        F.udf(value, "string")(F.col("id")).alias("value"),
    )
    clients = KafkaClients(config, args.decision_topic, timeout_s=30.0)
    try:
        with PrepareSession(clients, args.prefix, args.run, args.run_key) as session:
            seen = session.see_try(Members(args.prefix, strategy, args.run_key))
            if args.pause_after_seen:  # stopped before its recovery pass, holding what it saw
                print("paused", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            session.recover_first("run the actor again", seen)
            session.claim(owner="export_try_actor")
            if session.run_status() is not None:
                print("the run is decided: nothing exported", file=sys.stderr, flush=True)
                return 0
            taken = session.begin_try(seen, config)
            settings = ExportSettings(
                args.prefix, config, args.topic, strategy, args.run_key, export_try=taken.as_tuple()
            )
            result = export_run(
                session,
                df,
                settings,
                window=WindowSettings(materialize=True),
                abort_opened=lambda: session.abort_opened(settings)[0],
            )
    except SupersededExportError as e:
        print(f"SupersededExportError: {e}", file=sys.stderr, flush=True)
        return SUPERSEDED_EXIT
    finally:
        spark.stop()
    for c in result.committables:
        print(c.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
