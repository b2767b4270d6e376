"""The Kafka-sourced export of the end-to-end tests (KIP-447): Kafka in, Spark, Kafka out.

From the environment: E2E_PREFIX (or E2E_SOURCE_PREFIX), E2E_TOPIC (the output, or
E2E_SOURCE_OUTPUT), E2E_SOURCE_TOPIC, E2E_GROUP, E2E_MAX_OFFSETS (the source's cap per run,
unset: none), E2E_SPARK_CONF (or E2E_SOURCE_SPARK_CONF; JSON: the tests give Spark's Kafka source
jars there, as a user without Maven access would). The run's conf may give ``fault``:

- ``commit_waits``: the commit's first try waits for the conf's ``gate`` file (the test looks at
  the broker between prepare and commit, or moves the group meanwhile);
- ``offsets_hang``: the prepare sleeps once its offsets participant is open (the test kills the run);
- ``decided_then_hang``: the commit's first try decides COMMIT and sleeps before any EndTxn (the
  test kills the run);
- ``transform_fails``: the transformation fails in Spark (the output's transactions are aborted).

The transformation upper-cases the value and keeps the key: the output's keys are the source's.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.operators.commit import Kafka2PCAbortOperator, Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

# E2E_SOURCE_PREFIX, E2E_SOURCE_OUTPUT and E2E_SOURCE_SPARK_CONF, where set, win: a standalone
# Airflow that also runs e2e_kafka2pc (whose E2E_PREFIX, E2E_TOPIC and E2E_SPARK_CONF they are)
# gives this exporter its own (the Kafka source's jars: e2e_kafka2pc's Spark jobs need none).
PREFIX = os.environ.get("E2E_SOURCE_PREFIX") or os.environ.get("E2E_PREFIX", "e2e_src")
TOPIC = os.environ.get("E2E_SOURCE_OUTPUT") or os.environ.get("E2E_TOPIC", "e2e_src_out")
SOURCE_TOPIC = os.environ.get("E2E_SOURCE_TOPIC", "e2e_src_in")
GROUP = os.environ.get("E2E_GROUP", "e2e_src_group")
MAX_OFFSETS = int(os.environ["E2E_MAX_OFFSETS"]) if os.environ.get("E2E_MAX_OFFSETS") else None


def fault_of(context: Any) -> str:
    return str((context["dag_run"].conf or {}).get("fault", ""))


def transform(df: Any, context: Any) -> Any:
    from pyspark.sql import functions as F

    out = df.select(F.col("key").cast("string").alias("key"), F.upper(F.col("value").cast("string")).alias("value"))
    if fault_of(context) == "transform_fails":

        def fail(v: str) -> str:
            raise RuntimeError(f"injected: {v} cannot be transformed")

        return out.select("key", F.udf(fail, "string")(F.col("value")).alias("value"))
    return out


class SourceExportOperator(Kafka2PCExportOperator):
    def _open_offsets(self, *args: Any, **kwargs: Any) -> Any:
        opened = super()._open_offsets(*args, **kwargs)
        if self._fault == "offsets_hang":
            self.log.info("e2e: offsets participant open, hanging")
            time.sleep(3600)
        return opened

    def execute(self, context: Any) -> dict[str, Any]:
        self._fault = fault_of(context)
        return super().execute(context)


class SourceCommitOperator(Kafka2PCCommitOperator):
    def execute(self, context: Any) -> dict[str, Any]:
        fault, first = fault_of(context), context["ti"].try_number == 1
        if fault == "commit_waits" and first:
            gate = Path(str(context["dag_run"].conf["gate"]))
            deadline = time.monotonic() + 300
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        if fault == "decided_then_hang" and first:
            from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
            from airflow_provider_kafka2pc.txn.two_phase.coordinator import decide_commit

            payloads = [p for p in self.payloads(context).values() if p is not None]
            hook = Kafka2PCHook(self.kafka2pc_conn_id)
            committables = [c for p in payloads for c in p.committables]
            decide_commit(
                committables, hook.wire_client(), hook.decision_log(), decision_run(context), prefixes=[PREFIX]
            )
            self.log.info("e2e: decided, hanging")
            time.sleep(3600)
        return super().execute(context)


with DAG(
    dag_id="e2e_kafka_source",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    max_active_runs=1,
) as dag:
    recover = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix=PREFIX, poke_interval=1.0, timeout=300)
    prepare = SourceExportOperator(
        task_id="prepare",
        transactional_id_prefix=PREFIX,
        topic=TOPIC,
        source=KafkaSource(SOURCE_TOPIC, group_id=GROUP, transform=transform, max_offsets_per_run=MAX_OFFSETS),
        spark_conf={
            "spark.master": "local[2]",
            "spark.ui.enabled": "false",
            **json.loads(os.environ.get("E2E_SOURCE_SPARK_CONF") or os.environ.get("E2E_SPARK_CONF", "{}")),
        },
    )
    commit = SourceCommitOperator(
        task_id="commit",
        export_task_ids="prepare",
        retries=int(os.environ.get("E2E_COMMIT_RETRIES", "1")),
        retry_delay=timedelta(seconds=1),
    )
    abort = Kafka2PCAbortOperator(task_id="abort", export_task_ids="prepare", transactional_id_prefixes=PREFIX)
    recover >> prepare >> [commit, abort]
