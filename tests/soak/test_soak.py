"""The fault soak's short mode: fixed plans that strike every fault kind and variant, on a real
3-broker Kafka with real Spark, then four runs of a DAG on a standalone Airflow, all judged by the
independent checker; after every run, what ``kafka2pc list`` and ``describe`` tell is checked against
it, and so are the Kafka-sourced runs' group offsets against their output. The long mode is in
docs/design.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak import harness

pytestmark = [pytest.mark.kafka, pytest.mark.airflow_standalone]


def test_short_soak_has_no_violations(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    runs, airflow_runs = str(len(harness.SHORT_PLANS)), str(len(harness.AIRFLOW_SHORT_PLANS))
    args = ["--short", "--runs", runs, "--airflow", airflow_runs, "--seed", "7"]
    code = harness.main([*args, "--dir", str(tmp_path / "soak"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["violations"] == [], harness.render(result)
    assert code == 0
    assert set(result["faults"]) == set(harness.KINDS)  # every kind struck a live process
    assert set(result["variants"]) >= {"kill_prepare:abort", "kill_prepare:retry", "kill_commit:before-retry",
                                       "kill_commit:after-decision", "broker_restart:prepare", "broker_restart:commit",
                                       "concurrent_resolve:prepare", "concurrent_resolve:commit", "clear:commit",
                                       "clear:run", "timeout:before-commit", "timeout:after-decision",
                                       # the decision topic's leader SIGKILLed as a commit, a recovery, a prepare starts
                                       "leader_kill_commit:start", "leader_kill_recover:start",
                                       "leader_kill_prepare:start", "pause_commit:after-decision",
                                       "pause_abort:after-decision", "pause_prepare:in-transactions",
                                       "pause_recover:after-decision", "pause_repair:after-decision",
                                       "pause_resolve:prepare",
                                       # the Airflow runs: task kills, REST clears, Spark and broker faults
                                       "kill_recover:airflow", "kill_prepare:airflow", "kill_commit:airflow",
                                       "clear:airflow-run", "clear:airflow-prepare-running",
                                       "clear:airflow-commit-running", "broker_restart:airflow",
                                       "spark_task_failure:airflow"}  # fmt: skip
    assert result["outcomes"].get("committed", 0) >= 1 and result["outcomes"].get("aborted", 0) >= 1
    # The truth check ran after every run and saw the timed-out run's loss before any recovery.
    assert result["truth_checks"]["checks"] >= len(harness.SHORT_PLANS) + len(harness.AIRFLOW_SHORT_PLANS)
    assert result["truth_checks"].get("list exit 4 (a loss reported)", 0) >= 1
    # A lost run was repaired (the unsourced timeout after the decision), judged whole, exactly once.
    assert result["repairs"].get("repaired", 0) >= 1 and result["outcomes"].get("repaired", 0) >= 1, result["repairs"]
    # Kafka-sourced runs took ranges, one at least moved the group, and its offsets were judged
    # against the output whenever nothing was open (after most runs, and at the end).
    sourced = result["sourced"]
    assert sum(sourced.values()) >= 3 and sourced.get("success", 0) + sourced.get("died-after-decision", 0) >= 1
    assert result["truth_checks"].get("offsets judged", 0) >= len(harness.SHORT_PLANS)
