"""End to end on real Airflow (``dag.test()``, SQLite), real Spark and the real broker.

Every outcome is judged by a read_committed consumer (counts, unique keys) and by the
transactions of the prefix still open on the broker.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter

import pytest

from tests.helpers.airflow_dagtest import EXAMPLE_DAG, EXAMPLE_DAG_COMMITTED, DagTester, kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv

pytestmark = pytest.mark.kafka

E2E_DAG = REPO / "tests" / "e2e" / "dags" / "e2e_kafka2pc.py"
ROWS, PARTITIONS = 3000, 4
EXAMPLE_TOPIC = "kafka2pc_example_orders"  # dags/kafka2pc_example.py's TOPIC, made by its create_topic task
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[(\w+)\s*\] ")


def scenario(kafka: KafkaEnv, fault: str = "", **extra: str) -> tuple[dict[str, str], str, str]:
    prefix = f"e2e_{uuid.uuid4().hex[:8]}"
    topic = kafka.topic(partitions=3)
    env = {**kafka2pc_connection(kafka), "E2E_PREFIX": prefix, "E2E_TOPIC": topic, "E2E_FAULT": fault, **extra}
    return env, prefix, topic


def visible_keys(kafka: KafkaEnv, topic: str) -> Counter[str]:
    return Counter((r.key or b"").decode() for r in kafka.read_committed(topic))


def exactly_once(keys: Counter[str], tag: str, rows: int = ROWS) -> None:
    mine = {k: n for k, n in keys.items() if k.startswith(f"{tag}-")}
    assert len(mine) == rows, f"{len(mine)} distinct keys of run {tag!r} visible, expected {rows}"
    assert set(mine.values()) == {1}, f"duplicates: {[k for k, n in mine.items() if n > 1][:5]}"


def conf(tag: str) -> dict[str, object]:
    return {"tag": tag, "rows": ROWS, "partitions": PARTITIONS}


def test_example_dag_exports_exactly_once(kafka: KafkaEnv, dag_tester: DagTester) -> None:
    """On a fresh broker: the DAG's first task makes the topic (the export itself never would)."""
    assert EXAMPLE_TOPIC not in kafka.wire.topics()
    # The DAG declares its topic's asset (as scripts/demo and docker-compose.yml have it do).
    env = {**kafka2pc_connection(kafka), "KAFKA2PC_EXAMPLE_BOOTSTRAP": kafka.bootstrap}
    result = dag_tester.run(EXAMPLE_DAG, "kafka2pc_example", {"rows": 20_000, "partitions": 4}, env)
    assert result.state == "success", result.log
    assert result.tasks == EXAMPLE_DAG_COMMITTED
    assert "kafka2pc: topic kafka2pc_example_orders created: 8 partition(s)" in result.log.read_text(errors="replace")
    keys = visible_keys(kafka, EXAMPLE_TOPIC)
    assert len(keys) == 20_000 and set(keys.values()) == {1}
    assert kafka.open_transactions("kafka2pc_example.orders") == []
    # One asset event, from the commit, for the topic it made visible.
    assert dag_tester.asset_events("kafka2pc_example", result.run_id) == [
        {
            "uri": f"kafka://{kafka.bootstrap}/{EXAMPLE_TOPIC}",
            "task_id": "orders.commit",
            "extra": {"run": f"kafka2pc_example/{result.run_id}", "records": 20_000, "transactions": 4},
        }
    ]

    # The logs a person reads: every line a log record (an Airflow task supervisor logs any other
    # stderr line, Spark's or librdkafka's, at ERROR), none at ERROR, no kafka-python chatter.
    lines = result.log.read_text(errors="replace").splitlines()
    records = [(m.group(1), line) for line in lines if (m := LOG_RECORD.match(line))]
    raw = [line for line in lines if not LOG_RECORD.match(line) and not line.startswith('{"run_id"')]
    assert raw == [], f"{len(raw)} line(s) outside any log record, first: {raw[:5]}"
    errors = [line for level, line in records if level in ("error", "critical")]
    assert errors == [], errors[:5]
    # No WARNING at all: Spark's start-up lines, PySpark's pandas warning and librdkafka's
    # self-resolving retries are DEBUG, and the commit's asset is declared, so Airflow knows it.
    warnings = [line for level, line in records if level == "warning"]
    assert warnings == [], warnings[:5]
    assert not [line for _, line in records if " [kafka." in line]  # kafka-python logs only from WARNING
    assert any(
        re.search(r"\] decision: COMMIT \w+ for run kafka2pc_example/\S+: 4 transaction\(s\), 20000 records, "
                  rf"topics {EXAMPLE_TOPIC}, at offset \d+", line)
        for _, line in records
    )  # fmt: skip
    assert any(
        re.search(r"\] prepare: 4 of 4 partitions done \(0 running, 0 failed attempts\), 20000 records written, "
                  r"\d+ records/s", line)
        for _, line in records
    )  # fmt: skip


def test_prepare_fails_mid_job_abort_leaves_nothing(kafka: KafkaEnv, dag_tester: DagTester) -> None:
    env, prefix, topic = scenario(kafka, "prepare_fails")
    result = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("a"), env)
    assert result.state == "failed"
    assert result.tasks["prepare"] == "failed"
    assert result.tasks["abort"] == "success"
    assert result.tasks["commit"] == "upstream_failed"
    assert "injected: row" in result.log.read_text(errors="replace")
    assert visible_keys(kafka, topic) == Counter()
    assert kafka.open_transactions(prefix) == []
    assert dag_tester.asset_events("e2e_kafka2pc", result.run_id) == []  # nothing became visible


def test_commit_dies_halfway_and_its_retry_commits_the_rest(kafka: KafkaEnv, dag_tester: DagTester) -> None:
    env, prefix, topic = scenario(kafka, "commit_half")
    result = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("a"), env)
    assert result.state == "success", result.log
    assert result.tries["commit"] == 2  # the first try died after committing half
    assert "injected: commit died after deciding and committing 2 of 4" in result.log.read_text(errors="replace")
    exactly_once(visible_keys(kafka, topic), "a")
    assert kafka.open_transactions(prefix) == []
    # The retry, which committed the other half, reports the whole run's topic once.
    events = dag_tester.asset_events("e2e_kafka2pc", result.run_id)
    assert [(e["uri"], e["extra"]["records"], e["extra"]["transactions"]) for e in events] == [
        (f"kafka://{kafka.bootstrap}/{topic}", ROWS, PARTITIONS)
    ]


def test_run_died_between_decision_and_commit_is_rolled_forward_by_the_next_run(
    kafka: KafkaEnv, dag_tester: DagTester
) -> None:
    env, prefix, topic = scenario(kafka, "decided_then_die", E2E_COMMIT_RETRIES="0")
    first = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("first"), env)
    assert first.state == "failed" and first.tasks["commit"] == "failed"
    assert visible_keys(kafka, topic) == Counter()  # decided, but no EndTxn was sent
    assert len(kafka.open_transactions(prefix)) == PARTITIONS

    second = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("second"), {**env, "E2E_FAULT": ""})
    assert second.state == "success", second.log
    log = second.log.read_text(errors="replace")
    assert f"recovery of {prefix}: committed {PARTITIONS}, aborted 0" in log
    keys = visible_keys(kafka, topic)
    exactly_once(keys, "first")
    exactly_once(keys, "second")
    assert kafka.open_transactions(prefix) == []


def test_run_died_during_prepare_leftovers_are_aborted_by_the_next_run(kafka: KafkaEnv, dag_tester: DagTester) -> None:
    env, prefix, topic = scenario(kafka, "prepare_hangs")
    proc, log = dag_tester.start(E2E_DAG, "e2e_kafka2pc", conf("dead"), env)
    # Kill the whole run (Airflow, Spark's JVM, Python workers) while the last partition hangs:
    # the partitions before it have prepared their transactions, which nobody will decide.
    dag_tester.kill_when(proc, log, lambda: len(kafka.open_transactions(prefix)) >= PARTITIONS - 1)
    leftovers = len(kafka.open_transactions(prefix))
    assert leftovers >= PARTITIONS - 1
    # What the scheduler does to a run whose task died; without it the next run waits its turn for ever.
    assert len(dag_tester.fail_running_runs("e2e_kafka2pc")) == 1

    second = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("alive"), {**env, "E2E_FAULT": ""})
    assert second.state == "success", second.log
    assert f"recovery of {prefix}: committed 0, aborted {leftovers}" in second.log.read_text(errors="replace")
    keys = visible_keys(kafka, topic)
    assert not any(k.startswith("dead-") for k in keys)
    exactly_once(keys, "alive")
    assert kafka.open_transactions(prefix) == []
