"""The transaction window end to end: ``dag.test()`` of the e2e DAG against a broker whose
transaction.max.timeout.ms is 30 s, a source that computes for over a minute on ``local[2]``.

Judged by a read_committed consumer (counts, unique keys) and the exporter's open transactions.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tests.e2e.test_dag_runs import E2E_DAG, exactly_once, scenario, visible_keys
from tests.helpers.airflow_dagtest import DagTester
from tests.helpers.kafka import KafkaEnv

pytestmark = pytest.mark.kafka

ROWS, PARTITIONS = 16_000, 8
SLOW = {"rows": ROWS, "partitions": PARTITIONS, "compute_ms": 15_000}  # 4 waves of 15 s on 2 cores


def test_a_source_computing_longer_than_the_cap_commits_exactly_once(
    kafka_cap30: KafkaEnv, dag_tester: DagTester
) -> None:
    env, prefix, topic = scenario(kafka_cap30)
    result = dag_tester.run(E2E_DAG, "e2e_kafka2pc", {**SLOW, "tag": "slow"}, env)
    assert result.state == "success", result.log
    exactly_once(visible_keys(kafka_cap30, topic), "slow", ROWS)
    assert kafka_cap30.open_transactions(prefix) == []
    log = result.log.read_text(errors="replace")
    materialized = re.search(r"kafka2pc materialized the frame in ([\d.]+) s, before any transaction opened", log)
    assert materialized is not None and float(materialized.group(1)) >= 60, log[-3000:]
    assert "kafka2pc window budget: transaction.timeout.ms=30000: commit headroom 7750 ms" in log
    window = re.search(r"window of run \S+: first record \S+, last EndTxn \S+: ([\d.]+) s", log)
    assert window is not None and float(window.group(1)) < 25, log[-3000:]


def test_without_materializing_it_fails_before_the_commit_and_nothing_is_left(
    kafka_cap30: KafkaEnv, dag_tester: DagTester
) -> None:
    env, prefix, topic = scenario(kafka_cap30, E2E_MATERIALIZE="0")
    result = dag_tester.run(E2E_DAG, "e2e_kafka2pc", {**SLOW, "tag": "unmat"}, env)
    assert result.state == "failed"
    assert (result.tasks["prepare"], result.tasks["commit"], result.tasks["abort"]) == (
        "failed",
        "upstream_failed",
        "success",
    )
    log = result.log.read_text(errors="replace")
    assert "WindowExceededError: the write phase ran past its budget: 12250 ms of transaction.timeout.ms=30000" in log
    assert "nothing of the run is visible" in log and "materialize=False" in log
    assert visible_keys(kafka_cap30, topic) == Counter()
    assert kafka_cap30.open_transactions(prefix) == []
