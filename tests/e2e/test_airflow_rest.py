"""The exporter on a real, standalone Airflow 3, driven through REST API v2 only.

One Airflow (api-server, scheduler, dag-processor, triggerer; SQLite, LocalExecutor) runs the
e2e DAG with a deferrable recovery sensor; operators' "what if someone clears it" paths are
exercised the way a user would, by clearing tasks and runs over the API. The judge is Kafka
itself: a read_committed consumer and the open transactions of the exporter's prefix.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_dag_runs import exactly_once, visible_keys
from tests.helpers.airflow_dagtest import kafka2pc_connection
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import KafkaEnv

pytestmark = [pytest.mark.airflow_standalone, pytest.mark.kafka]

DAG_ID = "e2e_kafka2pc"
DAGS = Path(__file__).parent / "dags"
ROWS, PARTITIONS = 3000, 4
RUN_TIMEOUT = 300.0  # generous: the shared machine may be loaded, Spark alone takes 10-20 s to start


@dataclass
class Instance:
    af: StandaloneAirflow
    prefix: str
    topic: str
    timings: dict[str, float] = field(default_factory=dict)
    # Whether a poll caught the recovery sensor "deferred": reported, not asserted, since on a quiet
    # machine it may sit there for less than one poll. Its logs are the proof that asserts.
    saw_deferred: dict[str, bool] = field(default_factory=dict)

    def conf(self, tag: str, **extra: Any) -> dict[str, Any]:
        return {"tag": tag, "rows": ROWS, "partitions": PARTITIONS, **extra}

    def keys(self, kafka: KafkaEnv) -> Counter[str]:
        return visible_keys(kafka, self.topic)

    def log(self, run_id: str, task_id: str, try_number: int) -> str:
        return self.af.task_log(DAG_ID, run_id, task_id, try_number)

    def tries(self, run_id: str, task_id: str) -> list[tuple[int, str]]:
        return [(int(t["try_number"]), t["state"]) for t in self.af.task_tries(DAG_ID, run_id, task_id)]

    def wait(self, run_id: str, seen: dict[str, set[str | None]] | None = None) -> str:
        def record(states: dict[str, str | None]) -> None:
            if seen is not None:
                for task_id, state in states.items():
                    seen.setdefault(task_id, set()).add(state)

        return self.af.wait_run(DAG_ID, run_id, timeout=RUN_TIMEOUT, on_poll=record, poll=0.5)

    def assert_recovered_in_triggerer(self, run_id: str, try_number: int, seen: dict[str, set[str | None]]) -> str:
        """The recover try's log (trigger part merged in by Airflow) shows passes run by the triggerer."""
        self.saw_deferred[f"{run_id}#{try_number}"] = "deferred" in seen.get("recover", set())
        log = self.log(run_id, "recover", try_number)
        assert f"recovery of {self.prefix}, pass 1:" in log, log  # logged by the trigger itself
        assert f"recovery of {self.prefix} done after 1 pass(es) in the triggerer" in log, log
        return log

    def phase(self, name: str, since: float) -> float:
        self.timings[name] = round(time.monotonic() - since, 1)
        return time.monotonic()


@pytest.fixture(scope="module")
def airflow(kafka: KafkaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    prefix = f"rest_{uuid.uuid4().hex[:8]}"
    topic = kafka.topic(partitions=3)
    env = {
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
    af = StandaloneAirflow(home, DAGS, env, dag_ids=[DAG_ID])
    with af:
        af.unpause(DAG_ID)
        instance = Instance(af, prefix, topic)
        yield instance
    timings = {k: round(v, 1) for k, v in af.timings.items()}
    print(f"\nairflow harness timings: {timings}; phases: {instance.timings}; deferred seen: {instance.saw_deferred}")


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
        "commit": "skipped",
        "abort": "skipped",
    }
    assert airflow.tries(run_id, "prepare") == [(1, "success"), (2, "skipped")]
    assert "already reached its COMMIT decision" in airflow.log(run_id, "prepare", 2)
    airflow.assert_recovered_in_triggerer(run_id, 2, seen)
    exactly_once(airflow.keys(kafka), "half", ROWS)
    assert kafka.open_transactions(prefix) == []


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
