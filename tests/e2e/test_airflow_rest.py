"""The exporter on a real, standalone Airflow 3, driven through REST API v2 only.

One Airflow (api-server, scheduler, dag-processor, triggerer; PostgreSQL, LocalExecutor) runs the
e2e DAG with a deferrable recovery sensor; operators' "what if someone clears it" paths are
exercised the way a user would, by clearing tasks and runs over the API. The judge is Kafka
itself: a read_committed consumer and the open transactions of the exporter's prefix.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_dag_runs import exactly_once, visible_keys
from tests.e2e.test_kafka_source_dag import Source, group_offsets, kafka_source_jars, once
from tests.helpers.airflow_dagtest import kafka2pc_connection
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import REPO, KafkaEnv

pytestmark = [pytest.mark.airflow_standalone, pytest.mark.kafka]

DAG_ID = "e2e_kafka2pc"
SCHEDULED_DAG_ID = "e2e_kafka2pc_scheduled"  # same tasks, daily (for backfills), prefix {prefix}_sched
TWO_EXPORTS_DAG_ID = "e2e_two_exports"  # export a fails fast, export b is slow; prefixes {prefix}_two_a|b
CONSUMER_DAG_ID = "e2e_asset_consumer"  # scheduled on the topic's asset
REPAIR_DAG_ID = "e2e_kafka2pc_repair"  # same tasks, 30 s transactions; prefix {prefix}_rep
SOURCE_DAG_ID = "e2e_kafka_source"  # Kafka in, Spark, Kafka out; prefix {prefix}_src, group {prefix}_group
DAGS = Path(__file__).parent / "dags"
ROWS, PARTITIONS = 3000, 4
RUN_TIMEOUT = 300.0  # generous: the shared machine may be loaded, Spark alone takes 10-20 s to start
# A poll is one read (the task instances; the run's state only once they are all finished): about
# 12 ms of the api-server's and PostgreSQL's CPU (two reads measured 25 ms on an idle instance). At
# 0.5 s that was 6 CPU-s a minute of waiting, as much again as the idle instance itself; the waits
# are minutes, a poll's delay seconds. The shortest state a test must catch at a poll is the two
# exports' overlap (prepare_b sleeps 30 s after prepare_a failed): many polls at 2 s.
POLL_S = 2.0


@dataclass
class Instance:
    af: StandaloneAirflow
    prefix: str
    topic: str
    source: Source
    source_output: str
    timings: dict[str, float] = field(default_factory=dict)
    # Whether a poll caught the recovery sensor "deferred": reported, not asserted, since on a quiet
    # machine it may sit there for less than one poll. Its logs are the proof that asserts.
    saw_deferred: dict[str, bool] = field(default_factory=dict)
    # The recover tries of a run that needed the sensor's retry (issue 37): reported, not hidden.
    recover_retried: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

    def conf(self, tag: str, **extra: Any) -> dict[str, Any]:
        return {"tag": tag, "rows": ROWS, "partitions": PARTITIONS, **extra}

    def keys(self, kafka: KafkaEnv) -> Counter[str]:
        return visible_keys(kafka, self.topic)

    def log(self, run_id: str, task_id: str, try_number: int, dag_id: str = DAG_ID) -> str:
        return self.af.task_log(dag_id, run_id, task_id, try_number)

    def tries(self, run_id: str, task_id: str, dag_id: str = DAG_ID) -> list[tuple[int, str]]:
        return [(int(t["try_number"]), t["state"]) for t in self.af.task_tries(dag_id, run_id, task_id)]

    def wait(
        self,
        run_id: str,
        seen: dict[str, set[str | None]] | None = None,
        dag_id: str = DAG_ID,
        on_poll: Callable[[dict[str, str | None]], None] | None = None,
    ) -> str:
        def record(states: dict[str, str | None]) -> None:
            if seen is not None:
                for task_id, state in states.items():
                    seen.setdefault(task_id, set()).add(state)
            if on_poll is not None:
                on_poll(states)

        return self.af.wait_run(dag_id, run_id, timeout=RUN_TIMEOUT, on_poll=record, poll=POLL_S)

    def times(self, dag_id: str, run_id: str, task_id: str) -> tuple[datetime, datetime]:
        """A task instance's start and end, as the API reports them."""
        ti = self.af.task_instance(dag_id, run_id, task_id)
        assert ti["start_date"] and ti["end_date"], ti
        return datetime.fromisoformat(ti["start_date"]), datetime.fromisoformat(ti["end_date"])

    def assert_recovered_in_triggerer(self, run_id: str, try_number: int, seen: dict[str, set[str | None]]) -> str:
        """The recover try's log (trigger part merged in by Airflow) shows passes run by the triggerer.

        ``try_number`` is the run's first try here; the last one is checked. A later one means the
        sensor retried: Airflow 3.3 can fail a try with nothing wrong (issue 37, docs/runbook.md;
        in CI its first try's trigger committed the leftovers, then "Task Instance not found" when
        it reported success). The logs of every try Airflow lists from ``try_number`` on are
        returned, in order: what the recovery did is in the try that did it. A try can be missing
        from that list: under load the scheduler once failed a queued try before it started
        ("Cannot start Task Instance in invalid state"), and Airflow kept no record of it (its log
        answered 404 "TaskInstance not found"); the next try ran the recovery.
        """
        self.saw_deferred[f"{run_id}#{try_number}"] = "deferred" in seen.get("recover", set())
        last = int(self.af.task_instance(DAG_ID, run_id, "recover")["try_number"])
        assert last >= try_number, (last, try_number)
        tries = [t for t in self.tries(run_id, "recover") if t[0] >= try_number]
        if last > try_number:
            self.recover_retried[f"{run_id}#{try_number}"] = tries
        log = self.log(run_id, "recover", last)
        assert f"recovery of {self.prefix}, pass 1:" in log, log  # logged by the trigger itself
        assert f"recovery of {self.prefix} done after 1 pass(es) in the triggerer" in log, log
        return "\n".join(self.log(run_id, "recover", n) for n, _ in tries)

    def phase(self, name: str, since: float) -> float:
        self.timings[name] = round(time.monotonic() - since, 1)
        return time.monotonic()


@pytest.fixture(scope="module")
def airflow(kafka: KafkaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    prefix = f"rest_{uuid.uuid4().hex[:8]}"
    topic = kafka.topic(partitions=3)
    source, source_output = Source(kafka), kafka.topic(partitions=3)
    env = {
        "E2E_SOURCE_PREFIX": f"{prefix}_src",
        "E2E_SOURCE_OUTPUT": source_output,
        "E2E_SOURCE_TOPIC": source.topic,
        "E2E_GROUP": f"{prefix}_group",
        "E2E_SOURCE_SPARK_CONF": kafka_source_jars(),  # the Kafka-sourced DAG's only
        **kafka2pc_connection(kafka),
        "E2E_PREFIX": prefix,
        "E2E_TOPIC": topic,
        # The default fault; the decided_then_die scenario overrides it per run through its conf.
        "E2E_FAULT": "commit_half",
        # No automatic retry: the second try of commit must come from a clear over the API.
        "E2E_COMMIT_RETRIES": "0",
        "E2E_DEFERRABLE": "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    home = tmp_path_factory.mktemp("airflow_rest") / "home"
    # A harness that cannot start raises here, which errors (never skips) every test of the module.
    dag_ids = [DAG_ID, SCHEDULED_DAG_ID, REPAIR_DAG_ID, TWO_EXPORTS_DAG_ID, CONSUMER_DAG_ID, SOURCE_DAG_ID]
    af = StandaloneAirflow(home, DAGS, env, dag_ids=dag_ids)
    with af:
        # The metadata DB is the harness's own PostgreSQL: the parsed DAGs are rows there.
        rows = af.metadata_query("SELECT dag_id FROM dag WHERE dag_id = ANY(%s) ORDER BY dag_id", (dag_ids,))
        assert [r[0] for r in rows] == sorted(dag_ids), rows
        for dag_id in dag_ids:
            af.unpause(dag_id)
        instance = Instance(af, prefix, topic, source, source_output)
        yield instance
    source.close()
    timings = {k: round(v, 1) for k, v in af.timings.items()}
    print(
        f"\nairflow harness timings: {timings}; phases: {instance.timings}; deferred seen: {instance.saw_deferred}; "
        f"recover retried: {instance.recover_retried}"
    )


def test_clear_after_commit_died_halfway_then_clear_the_finished_run(airflow: Instance, kafka: KafkaEnv) -> None:
    af, prefix = airflow.af, airflow.prefix
    t = time.monotonic()

    # 1. The commit task decides, commits 2 of the 4 transactions and dies; no retry is configured.
    seen: dict[str, set[str | None]] = {}
    run_id = af.trigger(DAG_ID, conf=airflow.conf("half"))
    assert airflow.wait(run_id, seen) == "failed", af.task_states(DAG_ID, run_id)
    t = airflow.phase("commit_half_run", t)
    assert af.task_states(DAG_ID, run_id) == {
        "recover": "success",
        "prepare": "success",
        "commit": "failed",
        "abort": "skipped",  # prepare succeeded: nothing to abort, the decision was COMMIT anyway
    }
    assert "injected: commit died after deciding and committing 2 of 4" in airflow.log(run_id, "commit", 1)
    # Every pass of the deferrable sensor runs in the triggerer; the worker only resumes it at the end.
    airflow.assert_recovered_in_triggerer(run_id, 1, seen)
    half = {k: n for k, n in airflow.keys(kafka).items() if k.startswith("half-")}
    assert 0 < len(half) < ROWS and set(half.values()) == {1}, f"{len(half)} keys of 'half' visible"
    assert len(kafka.open_transactions(prefix)) == PARTITIONS // 2

    # The user clears the failed commit: its second try commits the rest, by the recorded decision.
    assert af.clear_tasks(DAG_ID, run_id, ["commit"]) == ["commit"]
    assert airflow.wait(run_id) == "success", af.task_states(DAG_ID, run_id)
    t = airflow.phase("clear_commit", t)
    assert airflow.tries(run_id, "commit") == [(1, "failed"), (2, "success")]
    exactly_once(airflow.keys(kafka), "half", ROWS)
    assert kafka.open_transactions(prefix) == []

    # 2. The user clears the whole, finished run: the prepare must not export the data a second time.
    af.clear_run(DAG_ID, run_id)
    seen = {}
    assert airflow.wait(run_id, seen) == "success", af.task_states(DAG_ID, run_id)
    t = airflow.phase("clear_run", t)
    assert af.task_states(DAG_ID, run_id) == {
        "recover": "success",
        "prepare": "skipped",
        "commit": "success",  # green: it answers from the run's record, writing nothing
        "abort": "skipped",
    }
    assert airflow.tries(run_id, "prepare") == [(1, "success"), (2, "skipped")]
    assert "already reached its COMMIT decision" in airflow.log(run_id, "prepare", 2)
    assert airflow.tries(run_id, "commit") == [(1, "failed"), (2, "success"), (3, "success")]
    answer = airflow.log(run_id, "commit", 3)
    assert f"already committed: {ROWS} records in {PARTITIONS} transactions" in answer, answer[-3000:]
    assert "decision: COMMIT" not in answer and "appending the COMMIT decision" not in answer  # nothing decided
    airflow.assert_recovered_in_triggerer(run_id, 2, seen)
    exactly_once(airflow.keys(kafka), "half", ROWS)
    assert kafka.open_transactions(prefix) == []


def test_a_run_that_lost_transactions_after_its_commit_is_repaired_by_a_clear_of_the_run(
    airflow: Instance, kafka: KafkaEnv, tmp_path: Path
) -> None:
    """The UI's way (DESIGN §6): the commit decides, commits 2 of 4 transactions and dies; the broker
    aborts the other 2 at their 30 s timeout; a clear of the commit finds them lost (the run is LOST,
    and its failure line says to clear the export task); a clear of the whole run lets the run's own
    loss through the recovery sensor, and its export task exports the 2 lost Spark partitions again,
    proves them the same records and commits them."""
    af, prefix = airflow.af, f"{airflow.prefix}_rep"
    run_id = af.trigger(REPAIR_DAG_ID, conf=airflow.conf("rep"))
    assert airflow.wait(run_id, dag_id=REPAIR_DAG_ID) == "failed", af.task_states(REPAIR_DAG_ID, run_id)
    assert "injected: commit died after deciding and committing 2 of 4" in airflow.log(
        run_id, "commit", 1, REPAIR_DAG_ID
    )
    deadline = time.monotonic() + 120  # the broker aborts them at 30 s, checking every few seconds
    while kafka.open_transactions(prefix, settle_s=0) and time.monotonic() < deadline:
        time.sleep(2)
    assert kafka.open_transactions(prefix) == []
    half = {k for k in airflow.keys(kafka) if k.startswith("rep-")}
    assert 0 < len(half) < ROWS

    assert af.clear_tasks(REPAIR_DAG_ID, run_id, ["commit"]) == ["commit"]
    assert airflow.wait(run_id, dag_id=REPAIR_DAG_ID) == "failed"
    lost = airflow.log(run_id, "commit", 2, REPAIR_DAG_ID)
    assert "TransactionLostError" in lost and "repair the run: clear its export task" in lost, lost[-3000:]

    af.clear_run(REPAIR_DAG_ID, run_id)  # the whole run, as the UI's "Clear" of the run does
    state = airflow.wait(run_id, dag_id=REPAIR_DAG_ID)
    assert state == "success", (af.task_states(REPAIR_DAG_ID, run_id), airflow.log(run_id, "prepare", 2, REPAIR_DAG_ID))
    assert airflow.tries(run_id, "prepare", REPAIR_DAG_ID) == [(1, "success"), (2, "success")]
    repaired = airflow.log(run_id, "prepare", 2, REPAIR_DAG_ID)
    assert "is LOST: repairing it" in repaired, repaired[-3000:]
    assert re.search(r"exported \d+ record\(s\) again in 2 transaction\(s\)", repaired), repaired[-3000:]
    assert "is REPAIRED: all 3000 records are visible once" in repaired, repaired[-3000:]
    # The recovery sensor let the run's own loss through to its export task, and said so.
    last = int(af.task_instance(REPAIR_DAG_ID, run_id, "recover")["try_number"])
    sensed = airflow.log(run_id, "recover", last, REPAIR_DAG_ID)
    assert "left to this run's export task, which repairs it" in sensed, sensed[-3000:]
    answer = airflow.log(run_id, "commit", 3, REPAIR_DAG_ID)
    assert (
        f"repaired: all {ROWS} records in {PARTITIONS} transactions of exporter {prefix} are visible once" in answer
    ), answer[-3000:]
    exactly_once(airflow.keys(kafka), "rep", ROWS)
    assert kafka.open_transactions(prefix) == []
    # The topic's asset event says the run was repaired (a consumer DAG is scheduled on the topic).
    deadline, producer = time.monotonic() + RUN_TIMEOUT, f"{REPAIR_DAG_ID}/{run_id}"
    while not (events := _events_of(af, producer)):
        assert time.monotonic() < deadline, f"no consumer run for {producer}: {af.dag_runs(CONSUMER_DAG_ID)}"
        time.sleep(1)
    [extra] = events
    assert extra["transactions"] == 2 and extra["records"] == extra["repaired"]["restored"] > 0, extra
    assert extra["repaired"]["atomic"] is False and extra["repaired"]["actor"].startswith(REPAIR_DAG_ID), extra

    # A clear of the commit alone answers again from the run's record and announces the repair no
    # second time: the export's XCom still says it repaired, Airflow's events say it was announced.
    def repair_events() -> list[dict[str, Any]]:
        events = af.asset_events(source_dag_id=REPAIR_DAG_ID, source_run_id=run_id)
        return [e for e in events if "repaired" in (e["extra"] or {})]

    announced = repair_events()
    assert [e["extra"]["repaired"] for e in announced] == [extra["repaired"]], announced
    assert af.clear_tasks(REPAIR_DAG_ID, run_id, ["commit"]) == ["commit"]
    assert airflow.wait(run_id, dag_id=REPAIR_DAG_ID) == "success"
    again = airflow.log(run_id, "commit", 4, REPAIR_DAG_ID)
    assert f"repaired: all {ROWS} records" in again and "was announced before for topic(s)" in again, again[-3000:]
    assert repair_events() == announced
    # kafka2pc repair asked to announce the same repair to this Airflow finds its event and posts none
    # (counted per asset: an event made through the API has no source run).
    per_asset = {e["asset_id"]: len(af.asset_events(asset_id=e["asset_id"])) for e in announced}
    token = tmp_path / "airflow.jwt"
    token.write_text(af.token)
    argv = [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "repair", "--prefix", prefix, "--run",
            f"{REPAIR_DAG_ID}/{run_id}", "--bootstrap-servers", kafka.bootstrap, "--json",
            "--source", "tests.helpers.repair_sources:parquet_frame", "--airflow-api-url", af.base_url,
            "--airflow-api-token-file", str(token)]  # fmt: skip
    cli = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert cli.returncode == 0, cli.stderr[-3000:]
    said = json.loads(cli.stdout)
    decision = extra["repaired"]["decision"]
    assert said["repaired_now"] is False, said
    assert said["announced"] == [f"announced before: the asset event of {e['uri']} for repair {decision}"
                                 for e in announced], said  # fmt: skip
    assert repair_events() == announced
    assert {a: len(af.asset_events(asset_id=a)) for a in per_asset} == per_asset


def _events_of(af: StandaloneAirflow, producer: str) -> list[Any]:
    """The extras of the asset events run ``producer`` emitted, as the finished consumer runs saw them."""
    return [
        extra
        for r in af.dag_runs(CONSUMER_DAG_ID)
        if r["state"] == "success"
        for extra in af.xcom(CONSUMER_DAG_ID, r["dag_run_id"], "triggered_by")
        if extra["run"] == producer
    ]


def test_run_died_between_decision_and_commit_is_rolled_forward_by_the_next_run(
    airflow: Instance, kafka: KafkaEnv
) -> None:
    af, prefix = airflow.af, airflow.prefix
    t = time.monotonic()

    first = af.trigger(DAG_ID, conf=airflow.conf("first", fault="decided_then_die"))
    assert airflow.wait(first) == "failed", af.task_states(DAG_ID, first)
    t = airflow.phase("decided_then_die_run", t)
    assert af.task_states(DAG_ID, first)["commit"] == "failed"
    assert "injected: commit died after deciding and committing 0 of 4" in airflow.log(first, "commit", 1)
    assert not any(k.startswith("first-") for k in airflow.keys(kafka))  # decided, but no EndTxn was sent
    assert len(kafka.open_transactions(prefix)) == PARTITIONS

    # A new run, without fault: its recovery sensor commits the decided leftovers before it prepares.
    seen: dict[str, set[str | None]] = {}
    second = af.trigger(DAG_ID, conf=airflow.conf("second", fault=""))
    assert airflow.wait(second, seen) == "success", af.task_states(DAG_ID, second)
    t = airflow.phase("next_run", t)
    assert af.task_states(DAG_ID, second) == {
        "recover": "success",
        "prepare": "success",
        "commit": "success",
        "abort": "skipped",
    }
    recover_log = airflow.assert_recovered_in_triggerer(second, 1, seen)
    assert f"pass 1: committed {PARTITIONS}, aborted 0" in recover_log, recover_log
    keys = airflow.keys(kafka)
    exactly_once(keys, "first", ROWS)
    exactly_once(keys, "second", ROWS)
    assert kafka.open_transactions(prefix) == []


def test_backfill_of_a_pooling_exporter_waits_for_the_live_run(airflow: Instance, kafka: KafkaEnv) -> None:
    """Backfill runs share the POOLING ids with a live run (Airflow counts max_active_runs per backfill).

    They must take turns: each backfill run's recovery sensor (deferred: its passes run in the
    triggerer, which asks the scheduler which runs are live) waits until the run ahead has ended.
    """
    af, prefix = airflow.af, f"{airflow.prefix}_sched"
    t = time.monotonic()

    # A manual run whose prepare sleeps 20 s inside the Spark job, its other partitions prepared and open.
    live = af.trigger(SCHEDULED_DAG_ID, conf=airflow.conf("live", sleep_s=20, fault=""))
    deadline = time.monotonic() + RUN_TIMEOUT
    while af.task_states(SCHEDULED_DAG_ID, live).get("prepare") != "running":
        assert time.monotonic() < deadline, af.task_states(SCHEDULED_DAG_ID, live)
        assert af.run_state(SCHEDULED_DAG_ID, live) not in ("success", "failed")
        time.sleep(1.0)
    t = airflow.phase("backfill_live_prepare_started", t)

    # Two backfill runs, allowed to run at once (and next to the live run: a backfill has its own limit).
    af.backfill(
        SCHEDULED_DAG_ID,
        "2026-01-02T00:00:00Z",
        "2026-01-03T00:00:00Z",
        conf=airflow.conf("bf", tag_by_date=True, fault=""),
        max_active_runs=2,
    )
    runs: list[dict[str, Any]] = []
    while len(runs) < 2:
        assert time.monotonic() < deadline, runs
        runs = af.dag_runs(SCHEDULED_DAG_ID, run_type="backfill")  # the module's only backfill
        time.sleep(1.0)
    assert len(runs) == 2, runs
    backfilled = sorted(str(r["dag_run_id"]) for r in runs)
    tags = sorted(f"bf{datetime.fromisoformat(r['logical_date']):%Y%m%d}" for r in runs)
    assert tags == ["bf20260102", "bf20260103"], tags

    assert airflow.wait(live, dag_id=SCHEDULED_DAG_ID) == "success", af.task_states(SCHEDULED_DAG_ID, live)
    t = airflow.phase("backfill_live_run", t)
    for run_id in backfilled:
        assert airflow.wait(run_id, dag_id=SCHEDULED_DAG_ID) == "success", af.task_states(SCHEDULED_DAG_ID, run_id)
    t = airflow.phase("backfill_runs", t)

    # Turns: every backfill run waited for the live run; no two prepares of the exporter overlapped.
    for run_id in backfilled:
        log = airflow.log(run_id, "recover", 1, dag_id=SCHEDULED_DAG_ID)
        assert f"waiting: exporter '{prefix}' uses POOLING transactional ids, and DAG run {live} " in log, log

    def run_end(run_id: str) -> datetime:
        return datetime.fromisoformat(af.dag_run(SCHEDULED_DAG_ID, run_id)["end_date"])

    # A run holds the exporter until the scheduler has ended it: each prepare starts after the run ahead ended.
    order = sorted(backfilled, key=lambda r: airflow.times(SCHEDULED_DAG_ID, r, "prepare")[0])
    ahead = live
    for run_id in order:
        started = airflow.times(SCHEDULED_DAG_ID, run_id, "prepare")[0]
        assert started > run_end(ahead), (run_id, started, ahead, run_end(ahead))
        ahead = run_id

    keys = airflow.keys(kafka)
    for tag in ("live", *tags):
        exactly_once(keys, tag, ROWS)
    assert kafka.open_transactions(prefix) == []


def test_one_export_fails_while_the_other_is_still_writing(airflow: Instance, kafka: KafkaEnv) -> None:
    """The abort (all_done) waits for the slow export, then aborts what it prepared: nothing visible."""
    af = airflow.af
    prefixes = [f"{airflow.prefix}_two_a", f"{airflow.prefix}_two_b"]
    t = time.monotonic()

    # Seen at a poll: export a already failed while export b was still running, and the abort had not run.
    overlap: list[dict[str, str | None]] = []

    def watch(states: dict[str, str | None]) -> None:
        if states.get("prepare_a") == "failed" and states.get("prepare_b") == "running":
            overlap.append(states)

    run_id = af.trigger(TWO_EXPORTS_DAG_ID, conf=airflow.conf("two", sleep_s=30))
    assert airflow.wait(run_id, dag_id=TWO_EXPORTS_DAG_ID, on_poll=watch) == "failed"
    t = airflow.phase("two_exports_run", t)
    assert af.task_states(TWO_EXPORTS_DAG_ID, run_id) == {
        "recover_a": "success",
        "recover_b": "success",
        "prepare_a": "failed",
        "prepare_b": "success",
        "commit": "upstream_failed",
        "abort": "success",
    }
    assert overlap, "never saw prepare_a failed while prepare_b was running"
    assert all(s.get("abort") in (None, "none", "scheduled", "queued") for s in overlap), overlap
    a_end = airflow.times(TWO_EXPORTS_DAG_ID, run_id, "prepare_a")[1]
    b_end = airflow.times(TWO_EXPORTS_DAG_ID, run_id, "prepare_b")[1]
    abort_start = airflow.times(TWO_EXPORTS_DAG_ID, run_id, "abort")[0]
    assert a_end < b_end <= abort_start, (a_end, b_end, abort_start)
    abort_log = airflow.log(run_id, "abort", 1, dag_id=TWO_EXPORTS_DAG_ID)
    assert "export task(s) ['prepare_a'] failed: aborting the run" in abort_log, abort_log
    payload = af.xcom(TWO_EXPORTS_DAG_ID, run_id, "prepare_b")
    assert len(payload["transactions"]["slots"]) == PARTITIONS, payload

    assert not any(k.startswith("two-") for k in airflow.keys(kafka))
    for prefix in prefixes:
        assert kafka.open_transactions(prefix) == [], prefix


def test_a_dag_scheduled_on_the_topic_asset_runs_after_the_commit_and_only_then(
    airflow: Instance, kafka: KafkaEnv
) -> None:
    """The commit emits the topic's asset event; a failed run emits none. Other tests' commits
    trigger the consumer too, so each consumer run is told apart by the run its events name."""
    af = airflow.af
    t = time.monotonic()
    failed = af.trigger(DAG_ID, conf=airflow.conf("noasset", fault="prepare_fails"))
    assert airflow.wait(failed) == "failed", af.task_states(DAG_ID, failed)
    ok = af.trigger(DAG_ID, conf=airflow.conf("asset", fault=""))
    assert airflow.wait(ok) == "success", af.task_states(DAG_ID, ok)
    commit_end = airflow.times(DAG_ID, ok, "commit")[1]
    t = airflow.phase("asset_producer_runs", t)

    def consumed() -> dict[str, list[tuple[str, Any]]]:
        """Producer run -> [(consumer run, the extra of its triggering event)], over finished consumer runs."""
        out: dict[str, list[tuple[str, Any]]] = {}
        for r in af.dag_runs(CONSUMER_DAG_ID):
            if r["state"] == "success":
                for extra in af.xcom(CONSUMER_DAG_ID, r["dag_run_id"], "triggered_by"):
                    out.setdefault(str(extra["run"]).split("/", 1)[1], []).append((r["dag_run_id"], extra))
        return out

    deadline = time.monotonic() + RUN_TIMEOUT
    while ok not in (seen := consumed()):
        assert time.monotonic() < deadline, f"no consumer run for {ok}: {af.dag_runs(CONSUMER_DAG_ID)}"
        time.sleep(1)
    airflow.phase("asset_consumer_run", t)
    [(consumer_run, extra)] = seen[ok]
    assert extra == {"run": f"{DAG_ID}/{ok}", "records": ROWS, "transactions": PARTITIONS}
    assert failed not in seen
    consumer_start = datetime.fromisoformat(af.dag_run(CONSUMER_DAG_ID, consumer_run)["start_date"])
    assert consumer_start > commit_end, (consumer_start, commit_end)
    exactly_once(airflow.keys(kafka), "asset", ROWS)
    assert not any(k.startswith("noasset-") for k in airflow.keys(kafka))

    # The successful run's logs, as the task supervisor recorded them (stderr would be ERROR there).
    logs = {task: airflow.log(ok, task, 1) for task in ("recover", "prepare", "commit")}
    for task, log in logs.items():
        errors = [line for line in log.splitlines() if line.split(" ", 2)[1:2] in (["error"], ["critical"])]
        assert errors == [], (task, errors[:5])
    assert re.search(
        rf"decision: COMMIT \w+ for run {DAG_ID}/\S+: {PARTITIONS} transaction\(s\), {ROWS} records", logs["commit"]
    )
    assert f"prepare: {PARTITIONS} of {PARTITIONS} partitions done" in logs["prepare"], logs["prepare"]


def test_a_kafka_sourced_export_moves_its_group_with_each_run_and_a_clear_of_a_finished_run_moves_nothing(
    airflow: Instance, kafka: KafkaEnv
) -> None:
    """Issue 30 on the real scheduler (max_active_runs=1, the deferrable sensor, LocalExecutor):
    each run's output and its group's offsets move together; a clear of the finished run writes
    nothing and leaves the group where it is."""
    af, source, prefix, group = airflow.af, airflow.source, f"{airflow.prefix}_src", f"{airflow.prefix}_group"
    source.write(range(0, 20))  # 10 records and a commit marker per partition: ends at 11
    first = af.trigger(SOURCE_DAG_ID)
    assert airflow.wait(first, dag_id=SOURCE_DAG_ID) == "success", af.task_states(SOURCE_DAG_ID, first)
    once(visible_keys(kafka, airflow.source_output), source.committed)
    assert group_offsets(kafka, group) == {0: 11, 1: 11}

    af.clear_run(SOURCE_DAG_ID, first)
    assert airflow.wait(first, dag_id=SOURCE_DAG_ID) == "success", af.task_states(SOURCE_DAG_ID, first)
    assert af.task_states(SOURCE_DAG_ID, first)["prepare"] == "skipped"
    assert "already reached its COMMIT decision" in airflow.log(first, "prepare", 2, dag_id=SOURCE_DAG_ID)
    once(visible_keys(kafka, airflow.source_output), source.committed)
    assert group_offsets(kafka, group) == {0: 11, 1: 11}

    source.write(range(20, 30))  # 5 more and a marker per partition: ends at 17
    second = af.trigger(SOURCE_DAG_ID)
    assert airflow.wait(second, dag_id=SOURCE_DAG_ID) == "success", af.task_states(SOURCE_DAG_ID, second)
    assert "[11, 17)" in airflow.log(second, "prepare", 1, dag_id=SOURCE_DAG_ID)
    once(visible_keys(kafka, airflow.source_output), source.committed)
    assert group_offsets(kafka, group) == {0: 17, 1: 17}
    assert kafka.open_transactions(prefix) == []
