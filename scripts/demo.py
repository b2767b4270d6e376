"""The demo: the example DAG end to end on the embedded default, then the verification.

A local 1-broker Kafka (scripts/kafka-local), Spark ``local[*]``, Airflow on SQLite in
build/demo/airflow. Runs dags/kafka2pc_example.py with ``dag.test()`` on the fresh broker (its first
task creates the topic) and then checks what a
read_committed consumer sees and that no transaction of the exporter is left open.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG_FILE = REPO / "dags" / "kafka2pc_example.py"
DAG_ID, TOPIC, PREFIX = "kafka2pc_example", "kafka2pc_example_orders", "kafka2pc_example.orders"


# The lines of the run the demo shows: the topic step, the prepare, the commit, a recovery.
SHOWN = ("topic kafka2pc_example", "prepared ", "commit of run ", "recovery of")


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def read_committed(bootstrap: str) -> Counter[bytes]:
    """Every record a read_committed consumer sees, up to the end of each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka2pc-demo-verify",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        parts = list(consumer.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions)
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in parts])
        keys: Counter[bytes] = Counter()
        pending, deadline = set(parts), time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10000, timeout=0.5):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(str(msg.error()))
                keys[msg.key() or b""] += 1
        return keys
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=REPO / "build" / "demo")
    args = parser.parse_args()

    shutil.rmtree(args.dir, ignore_errors=True)
    import kafka_local as kl  # scripts/kafka_local.py: this script's own directory is on sys.path

    kafka_dir, home = args.dir / "kafka", args.dir / "airflow"
    say("starting a local Kafka broker")
    bootstrap = kl.start_cluster(kafka_dir, brokers=1)["bootstrap_servers"]
    try:
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
            "AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps({"conn_type": "kafka2pc", "host": bootstrap}),
            "KAFKA2PC_EXAMPLE_BOOTSTRAP": bootstrap,  # the DAG declares its topic's asset
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        say(f"Airflow on SQLite in {home.relative_to(REPO)}")
        airflow = Path(sys.executable).parent / "airflow"
        subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)
        say(f"running DAG {DAG_ID} with dag.test(): {args.rows} rows in {args.partitions} Spark partitions")
        log = args.dir / "dag-test.log"
        conf = json.dumps({"rows": args.rows, "partitions": args.partitions})
        with open(log, "wb") as out:
            done = subprocess.run(
                [sys.executable, str(REPO / "scripts" / "dag_test.py"), str(DAG_FILE), DAG_ID, conf],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        lines = log.read_text(errors="replace").splitlines()
        for line in lines:
            if "kafka2pc" in line and any(w in line for w in SHOWN):
                say("  " + line.split("[info     ]")[-1].split(" [airflow")[0].strip())
        result = json.loads(next((ln for ln in reversed(lines) if ln.startswith('{"run_id"')), "{}") or "{}")
        say(f"DAG run: {result.get('state', 'crashed')}; tasks {result.get('tasks')}; full log in {log}")

        from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
        from airflow_provider_kafka2pc.txn.kafka.wire import WireClient

        keys = read_committed(bootstrap)
        wire = WireClient({"bootstrap.servers": bootstrap})
        try:
            still_open = TransactionInspector(wire).list_prefix(PREFIX)
        finally:
            wire.close()
        records, unique = sum(keys.values()), len(keys)
        say(f"verification: a read_committed consumer of {TOPIC} sees {records} records, {unique} unique keys")
        say(f"verification: open transactions of {PREFIX}: {len(still_open)}")
        ok = done.returncode == 0 and result.get("state") == "success" and records == unique == args.rows
        ok = ok and not still_open
        say("exactly once: OK" if ok else "exactly once: FAILED")
        return 0 if ok else 1
    finally:
        kl.stop_cluster(kafka_dir)


if __name__ == "__main__":
    sys.exit(main())
