"""The DAG of the end-to-end tests: the exporter's tasks wired by hand, with failures to inject.

Everything comes from the environment, so a test (or a standalone Airflow) picks the scenario:
E2E_TOPIC, E2E_PREFIX, E2E_FAULT (see FAULTS), E2E_DEFERRABLE, E2E_COMMIT_RETRIES, E2E_SPARK_CONF
(JSON, merged into the export's Spark settings), E2E_MATERIALIZE (0: the export's
materialize=False), E2E_CONN_ID (the kafka2pc connection; default kafka2pc_default). The run's
conf gives ``tag`` (key prefix of its records), ``rows`` and ``partitions``, and may give
``fault`` to override E2E_FAULT for that run only (one long-lived Airflow, different scenarios per
run), ``gate`` (the file the commit_waits fault waits for), ``zombie_out`` (where the
decided_then_pause fault's commit writes what it ended with once resumed), ``sleep_s`` (the first row of
partition 0 sleeps that long inside the Spark job: a slow prepare with transactions open, so not
materialized first), ``compute_ms`` (the first row of every partition sleeps that long in the JVM:
a slow source, computed before any transaction opens unless E2E_MATERIALIZE=0) and
``tag_by_date`` (the run's logical date is appended to its tag, so the runs of one backfill,
which share a conf, write different keys).

Three DAGs, same tasks: ``e2e_kafka2pc`` (manual runs only), ``e2e_kafka2pc_scheduled`` (daily,
for backfills; its own prefix E2E_PREFIX + "_sched"; its end date lies in the past so the
scheduler never creates a run by itself, while manual runs and backfills of January still run) and
``e2e_kafka2pc_repair`` (manual; prefix E2E_PREFIX + "_rep", 30 s transactions, for repairs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, get_current_context

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.operators.commit import Kafka2PCAbortOperator, Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

# prepare_fails:   the last row of the last partition raises: the Spark job fails mid-write.
# prepare_hangs:   the last row of the last partition sleeps: the test kills the run meanwhile.
# commit_half:     first try of commit: decide, commit half of the transactions, then die.
# decided_then_die: first try of commit: decide, then die before any EndTxn.
# decided_then_hang: first try of commit: decide, then hang before any EndTxn (the test kills its host).
# commit_waits:    first try of commit: wait for the conf's ``gate`` file (the test stops Kafka meanwhile).
# decided_then_pause: first try of commit: the real commit stops itself (SIGSTOP) once its COMMIT is read
#                  back, before any EndTxn; the test freezes its host and resumes it after others moved on.
FAULTS = ("", "prepare_fails", "prepare_hangs", "commit_half", "decided_then_die", "decided_then_hang", "commit_waits",
          "decided_then_pause")  # fmt: skip
FAULT = os.environ.get("E2E_FAULT", "")
assert FAULT in FAULTS, FAULT
PREFIX = os.environ.get("E2E_PREFIX", "e2e")
TOPIC = os.environ.get("E2E_TOPIC", "e2e")
CONN_ID = os.environ.get("E2E_CONN_ID", "kafka2pc_default")


def fault_of(context: Any) -> str:
    """The run's fault: its conf's ``fault`` if there is one, else E2E_FAULT."""
    fault = str((context["dag_run"].conf or {}).get("fault", FAULT))
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    return fault


def source(spark: Any, context: Any) -> Any:
    from pyspark.sql import functions as F

    conf = context["dag_run"].conf or {}
    rows, partitions, tag = int(conf.get("rows", 2000)), int(conf.get("partitions", 4)), str(conf.get("tag", "r"))
    if conf.get("tag_by_date") and context.get("logical_date") is not None:
        tag = f"{tag}{context['logical_date']:%Y%m%d}"
    df = spark.range(rows, numPartitions=partitions)
    key = F.concat(F.lit(f"{tag}-"), F.col("id").cast("string"))
    fault = fault_of(context)
    compute_ms = int(conf.get("compute_ms", 0))
    if compute_ms > 0 and not fault:
        first = f"id % {-(-rows // partitions)} = 0"
        sleep = f"CASE WHEN {first} THEN java_method('java.lang.Thread', 'sleep', CAST({compute_ms} AS BIGINT)) END"
        return df.select(
            key.alias("key"), F.expr(f"concat('value-', CAST(id AS STRING), coalesce({sleep}, ''))").alias("value")
        )
    sleep_s = float(conf.get("sleep_s", 0))
    if sleep_s > 0 and not fault:

        def slow(i: int) -> str:
            if i == 0:
                time.sleep(sleep_s)
            return f"value-{i}"

        return df.select(key.alias("key"), F.udf(slow, "string")(F.col("id")).alias("value"))
    if fault in ("prepare_fails", "prepare_hangs"):
        last = rows - 1

        def value(i: int) -> str:
            if i == last:
                if fault == "prepare_fails":
                    raise RuntimeError(f"injected: row {i} cannot be exported")
                time.sleep(3600)
            return f"value-{i}"

        return df.select(key.alias("key"), F.udf(value, "string")(F.col("id")).alias("value"))
    return df.select(key.alias("key"), F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"))


class E2EExportOperator(Kafka2PCExportOperator):
    """The export. A run whose scenario needs the Spark job slow or failing while its transactions
    are open (``sleep_s``, prepare_fails, prepare_hangs: kills and clears land mid-write) writes
    without materializing first, or the slow rows would run before any transaction opens."""

    def execute(self, context: Any) -> dict[str, Any]:
        conf = context["dag_run"].conf or {}
        if fault_of(context) in ("prepare_fails", "prepare_hangs") or float(conf.get("sleep_s", 0)) > 0:
            self.window = dataclasses.replace(self.window, materialize=False)
        return super().execute(context)


class E2ECommitOperator(Kafka2PCCommitOperator):
    """The commit task, dying on its first try at the point the scenario names."""

    def execute(self, context: Any) -> dict[str, Any]:
        fault = fault_of(context)
        if fault == "commit_waits" and context["ti"].try_number == 1:
            gate = Path(str(context["dag_run"].conf["gate"]))
            deadline = time.monotonic() + 300
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        if fault in ("commit_half", "decided_then_die", "decided_then_hang") and context["ti"].try_number == 1:
            from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
            from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
            from airflow_provider_kafka2pc.txn.two_phase.coordinator import decide_commit
            from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
            from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

            payloads = [p for p in self.payloads(context).values() if p is not None]
            committables = [c for p in payloads for c in p.committables]
            refs = [ref_of(c) for c in committables]
            hook = Kafka2PCHook(self.kafka2pc_conn_id)
            decision_log, wire = hook.decision_log(), hook.wire_client()
            decide_commit(
                committables, wire, decision_log, decision_run(context), prefixes=[p.prefix for p in payloads]
            )
            if fault == "decided_then_hang":
                time.sleep(600)  # killed long before; a try that outlives the test dies below
            done = refs[: len(refs) // 2] if fault == "commit_half" else []
            TransactionResolver(wire).resolve(done, Intent.COMMIT)
            decision_log.close()
            wire.close()
            raise RuntimeError(f"injected: commit died after deciding and committing {len(done)} of {len(refs)}")
        return super().execute(context)

    def resolve(self, committables: Any, prefixes: Any, hook: Any, run: str, *args: Any, **kwargs: Any) -> Any:
        """decided_then_pause: the commit's own path, stopped by SIGSTOP right after its COMMIT decision
        is read back (a frozen VM); what it ends with once resumed goes to the conf's ``zombie_out``."""
        context = get_current_context()
        if fault_of(context) != "decided_then_pause" or context["ti"].try_number != 1:
            return super().resolve(committables, prefixes, hook, run, *args, **kwargs)
        from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
        from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict

        decide = DecisionLog.decide

        def decide_then_pause(log: DecisionLog, *a: Any, **kw: Any) -> Any:
            state = decide(log, *a, **kw)
            os.kill(os.getpid(), signal.SIGSTOP)
            return state

        DecisionLog.decide = decide_then_pause  # type: ignore[method-assign,assignment]
        out = Path(str((context["dag_run"].conf or {})["zombie_out"]))
        try:
            report = super().resolve(committables, prefixes, hook, run, *args, **kwargs)
        except BaseException as e:
            out.write_text(json.dumps({"raised": f"{type(e).__name__}: {e}"}))
            raise
        finally:
            DecisionLog.decide = decide  # type: ignore[method-assign]
        verdicts = {v.name: report.count(v) for v in Verdict if report.count(v)}
        out.write_text(json.dumps({"verdicts": verdicts, "committed": report.committed, "note": report.note}))
        return report


def build(dag_id: str, prefix: str, transaction_timeout_ms: int | None = None, **dag_kwargs: Any) -> DAG:
    with DAG(
        dag_id=dag_id,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        **dag_kwargs,
    ) as dag:
        recover = Kafka2PCRecoverySensor(
            task_id="recover",
            transactional_id_prefix=prefix,
            kafka2pc_conn_id=CONN_ID,
            deferrable=os.environ.get("E2E_DEFERRABLE", "") == "1",
            poke_interval=1.0,
            timeout=300,
        )
        prepare = E2EExportOperator(
            task_id="prepare",
            transactional_id_prefix=prefix,
            kafka2pc_conn_id=CONN_ID,
            topic=TOPIC,
            source=source,
            spark_conf={
                "spark.master": "local[2]",
                "spark.ui.enabled": "false",
                **json.loads(os.environ.get("E2E_SPARK_CONF", "{}")),
            },
            materialize=os.environ.get("E2E_MATERIALIZE", "1") == "1",
            transaction_timeout_ms=transaction_timeout_ms,
        )
        commit = E2ECommitOperator(
            task_id="commit",
            export_task_ids="prepare",
            kafka2pc_conn_id=CONN_ID,
            retries=int(os.environ.get("E2E_COMMIT_RETRIES", "1")),
            retry_delay=timedelta(seconds=1),
        )
        abort = Kafka2PCAbortOperator(
            task_id="abort", export_task_ids="prepare", transactional_id_prefixes=prefix, kafka2pc_conn_id=CONN_ID
        )
        recover >> prepare >> [commit, abort]
    return dag


dag = build("e2e_kafka2pc", PREFIX, schedule=None)
# Transactions of 30 s (the broker allows 15 min): a commit that died half-way loses the rest within
# a test's patience, and a clear of the prepare repairs the run.
repair = build("e2e_kafka2pc_repair", f"{PREFIX}_rep", transaction_timeout_ms=30_000, schedule=None)
scheduled = build(
    "e2e_kafka2pc_scheduled",
    f"{PREFIX}_sched",
    schedule="@daily",
    end_date=pendulum.datetime(2026, 1, 10, tz="UTC"),
)
