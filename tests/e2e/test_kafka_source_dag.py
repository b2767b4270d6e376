"""Kafka in, Kafka out (KIP-447) end to end: ``dag.test()`` of a DAG whose export reads a Kafka topic
with Spark's Kafka source and commits its consumer group's offsets with the run.

Judged by Kafka: a read_committed consumer of the output (counts, unique keys), the group's offsets
as Kafka's own ``kafka-consumer-groups --describe`` prints them, and the transactions left open.
Crashes are SIGKILLs of the run's process group.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_dag_runs import visible_keys
from tests.helpers.airflow_dagtest import DagTester, kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv, kafka_local

pytestmark = pytest.mark.kafka

SOURCE_DAG = REPO / "tests" / "e2e" / "dags" / "e2e_kafka_source.py"


def kafka_source_jars() -> str:
    """Spark settings (JSON) with Spark's Kafka source jars, fetched once from Maven Central into
    the jar cache, as a user without Maven access at run time would give them."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_spark

    return json.dumps({"spark.jars": ",".join(str(j) for j in bench_spark.sink_jars())})


@pytest.fixture(scope="module")
def spark_conf() -> str:
    return kafka_source_jars()


class Source:
    """A source topic written by another transactional producer, kept alive across a test."""

    def __init__(self, kafka: KafkaEnv) -> None:
        from confluent_kafka import Producer

        self.kafka, self.topic = kafka, kafka.topic(partitions=2)
        self.producer = Producer(
            {
                **kafka.config,
                "transactional.id": f"src-{uuid.uuid4().hex[:6]}",
                "linger.ms": 0,
                # An open transaction stays open across a whole DAG run on a loaded machine (not 60 s).
                "transaction.timeout.ms": 900_000,
            }
        )
        self.producer.init_transactions(30)
        self.committed: list[str] = []

    def write(self, keys: range, end: str = "commit") -> None:
        self.producer.begin_transaction()
        for i in keys:
            self.producer.produce(self.topic, key=f"s{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
        self.producer.flush(30)
        if end == "commit":
            self.producer.commit_transaction(30)
            self.committed += [f"s{i}" for i in keys]
        elif end == "abort":
            self.producer.abort_transaction(30)

    def close(self) -> None:
        from confluent_kafka import KafkaException

        with contextlib.suppress(KafkaException):  # none open
            self.producer.abort_transaction(30)  # the open one, if a test left one


@pytest.fixture
def source(kafka: KafkaEnv) -> Iterator[Source]:
    s = Source(kafka)
    yield s
    s.close()


def scenario(kafka: KafkaEnv, source: Source, spark_conf: str, **extra: str) -> tuple[dict[str, str], str, str, str]:
    prefix, group = f"src_{uuid.uuid4().hex[:8]}", f"group_{uuid.uuid4().hex[:8]}"
    topic = kafka.topic(partitions=3)
    env = {
        **kafka2pc_connection(kafka),
        "E2E_PREFIX": prefix,
        "E2E_TOPIC": topic,
        "E2E_SOURCE_TOPIC": source.topic,
        "E2E_GROUP": group,
        "E2E_SPARK_CONF": spark_conf,
        **extra,
    }
    return env, prefix, topic, group


def group_offsets(kafka: KafkaEnv, group: str) -> dict[int, int | None]:
    """Partition -> CURRENT-OFFSET as kafka-consumer-groups --describe prints it ({} without any)."""
    done = kafka_local().run_tool(kafka.directory, "consumer-groups", ["--describe", "--group", group, "--offsets"])
    rows: dict[int, int | None] = {}
    for line in done.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == group and cols[2].isdigit():
            rows[int(cols[2])] = None if cols[3] == "-" else int(cols[3])
    return rows


def once(keys: Counter[str], expected: list[str]) -> None:
    assert sorted(keys) == sorted(expected), (sorted(set(keys) ^ set(expected))[:10], len(keys), len(expected))
    assert set(keys.values()) <= {1}, [k for k, n in keys.items() if n > 1][:5]


def test_runs_read_committed_records_below_the_last_stable_offset_once_and_move_with_their_commit(
    kafka: KafkaEnv, source: Source, spark_conf: str, dag_tester: DagTester, tmp_path: Path
) -> None:
    """Run 1 over another producer's committed, aborted and still-open transactions, looked at
    between its prepare and its commit; runs 2 and 3 after new records; run 4 with nothing new."""
    source.write(range(0, 40))
    source.write(range(40, 50), "abort")
    source.write(range(50, 60))
    source.write(range(60, 70), "open")  # another producer's transaction, still open during run 1
    env, prefix, topic, group = scenario(kafka, source, spark_conf)
    gate = tmp_path / "gate"
    proc, log = dag_tester.start(SOURCE_DAG, "e2e_kafka_source", {"fault": "commit_waits", "gate": str(gate)}, env)
    try:
        wait_for(lambda: f"{prefix}-offsets" in " ".join(kafka.open_transactions(prefix, settle_s=0)), proc, log)
        # Prepared, not committed: the output invisible, the group where it was (nowhere).
        assert visible_keys(kafka, topic) == Counter()
        assert group_offsets(kafka, group) in ({}, {0: None, 1: None})
    finally:
        gate.touch()
    assert proc.wait(timeout=300) == 0
    text = log.read_text(errors="replace")
    assert f"kafka2pc source: this run reads group '{group}': {source.topic}-0 [0, " in text
    once(visible_keys(kafka, topic), source.committed)  # only committed records, each once
    assert {r.value for r in kafka.read_committed(topic)} >= {b"V0", b"V59"}  # transformed
    offsets = [group_offsets(kafka, group)]
    # 20 + 5 aborted + 5 records and 3 markers per partition are stable; the open transaction is not.
    assert offsets[0] == {0: 33, 1: 33}
    source.close()  # the open transaction aborts: its records are never read
    for n in (1, 2):
        source.write(range(100 * n, 100 * n + 30))
        run = dag_tester.run(SOURCE_DAG, "e2e_kafka_source", {}, env)
        assert run.state == "success", run.log
        once(visible_keys(kafka, topic), source.committed)  # the union so far: no gap, no duplicate
        offsets.append(group_offsets(kafka, group))
    assert offsets[0] != offsets[1] != offsets[2]
    quiet = dag_tester.run(SOURCE_DAG, "e2e_kafka_source", {}, env)
    assert quiet.state == "success", quiet.log
    assert "nothing to commit" in quiet.log.read_text(errors="replace")
    assert group_offsets(kafka, group) == offsets[2]
    once(visible_keys(kafka, topic), source.committed)
    assert kafka.open_transactions(prefix) == []


def wait_for(condition: Any, proc: Any, log: Path, timeout_s: float = 240) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) first; log: {log}"
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s; log: {log}"
        time.sleep(0.5)


def test_a_group_moved_by_another_consumer_before_the_commit_aborts_the_run_whole(
    kafka: KafkaEnv, source: Source, spark_conf: str, dag_tester: DagTester, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    source.write(range(0, 20))
    env, prefix, topic, group = scenario(kafka, source, spark_conf, E2E_COMMIT_RETRIES="0")
    gate = tmp_path / "gate"
    proc, log = dag_tester.start(SOURCE_DAG, "e2e_kafka_source", {"fault": "commit_waits", "gate": str(gate)}, env)
    try:
        wait_for(lambda: f"{prefix}-offsets" in " ".join(kafka.open_transactions(prefix, settle_s=0)), proc, log)
        other = Consumer({**kafka.config, "group.id": group, "enable.auto.commit": False})
        other.commit(offsets=[TopicPartition(source.topic, 0, 3)], asynchronous=False)
        other.close()
    finally:
        gate.touch()
    proc.wait(timeout=300)
    text = log.read_text(errors="replace")
    assert f"consumer group '{group}' moved while the run waited for its commit ({source.topic}-0 is at 3" in text
    assert visible_keys(kafka, topic) == Counter()
    assert group_offsets(kafka, group) == {0: 3, 1: None} or group_offsets(kafka, group) == {0: 3}
    assert kafka.open_transactions(prefix) == []


def test_a_prepare_killed_with_its_offsets_open_is_aborted_and_the_rerun_reads_the_range_once(
    kafka: KafkaEnv, source: Source, spark_conf: str, dag_tester: DagTester
) -> None:
    source.write(range(0, 24))
    env, prefix, topic, group = scenario(kafka, source, spark_conf)
    proc, log = dag_tester.start(SOURCE_DAG, "e2e_kafka_source", {"fault": "offsets_hang"}, env)
    dag_tester.kill_when(proc, log, lambda: "e2e: offsets participant open, hanging" in log.read_text(errors="replace"))
    assert f"{prefix}-offsets" in " ".join(kafka.open_transactions(prefix, settle_s=0))
    assert len(dag_tester.fail_running_runs("e2e_kafka_source")) == 1
    assert group_offsets(kafka, group) in ({}, {0: None, 1: None})
    rerun = dag_tester.run(SOURCE_DAG, "e2e_kafka_source", {}, env)
    assert rerun.state == "success", rerun.log
    once(visible_keys(kafka, topic), source.committed)
    assert group_offsets(kafka, group) == {0: 13, 1: 13}  # 12 records and a commit marker each
    assert kafka.open_transactions(prefix) == []


def test_a_commit_killed_after_its_decision_rolls_the_output_and_the_offsets_forward_together(
    kafka: KafkaEnv, source: Source, spark_conf: str, dag_tester: DagTester
) -> None:
    source.write(range(0, 16))
    env, prefix, topic, group = scenario(kafka, source, spark_conf)
    proc, log = dag_tester.start(SOURCE_DAG, "e2e_kafka_source", {"fault": "decided_then_hang"}, env)
    dag_tester.kill_when(proc, log, lambda: "e2e: decided, hanging" in log.read_text(errors="replace"))
    assert len(dag_tester.fail_running_runs("e2e_kafka_source")) == 1
    assert visible_keys(kafka, topic) == Counter()
    assert group_offsets(kafka, group) in ({}, {0: None, 1: None})
    source.write(range(16, 20))
    second = dag_tester.run(SOURCE_DAG, "e2e_kafka_source", {}, env)
    assert second.state == "success", second.log
    # The first run rolled forward (its 16 records and its offsets), then the second read 4 more.
    once(visible_keys(kafka, topic), source.committed)
    assert group_offsets(kafka, group) == {0: 12, 1: 12}  # 8 + marker, then 2 + marker on each
    assert kafka.open_transactions(prefix) == []


def test_a_group_with_a_live_member_is_refused_before_anything_is_written(
    kafka: KafkaEnv, source: Source, spark_conf: str, dag_tester: DagTester
) -> None:
    from confluent_kafka import Consumer

    source.write(range(0, 10))
    env, prefix, topic, group = scenario(kafka, source, spark_conf)
    member = Consumer({**kafka.config, "group.id": group, "client.id": "someone-else", "session.timeout.ms": 60000})
    member.subscribe([source.topic])
    try:
        for _ in range(100):
            member.poll(0.2)
            if member.assignment():
                break
        run = dag_tester.run(SOURCE_DAG, "e2e_kafka_source", {}, env)
    finally:
        member.close()
    assert run.state == "failed" and run.tasks["prepare"] == "failed"
    text = run.log.read_text(errors="replace")
    assert f"consumer group '{group}' has 1 live member(s) (someone-else on" in text
    assert visible_keys(kafka, topic) == Counter()
    assert kafka.open_transactions(prefix) == []


@pytest.fixture(scope="module")
def example_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """A broker of this module's own: the example's fixed topic names stay off the shared broker,
    where another module's test makes the example's topic on a fresh broker."""
    from tests.conftest import _start

    yield from _start(tmp_path_factory, "kafka1example", 1)


def test_the_example_dag_enriches_the_example_s_orders_exactly_once(
    example_kafka: KafkaEnv, dag_tester: DagTester, spark_conf: str
) -> None:
    """dags/kafka2pc_kafka_source.py over orders as dags/kafka2pc_example.py writes them: the orders
    of 10,000 cents or more, each once, and the example's group at the orders topic's end."""
    from confluent_kafka import Producer

    kafka = example_kafka
    orders = kafka.topic(partitions=2, name="kafka2pc_example_orders")
    p = Producer({**kafka.config, "transactional.id": "seed-orders"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3000):
        order = {"order_id": i, "amount_cents": i * 7 % 100000, "run": "seed"}
        p.produce(orders, key=str(i).encode(), value=json.dumps(order).encode())
    p.commit_transaction(30)
    env = {
        **kafka2pc_connection(kafka),
        "KAFKA2PC_EXAMPLE_SPARK_JARS": json.loads(spark_conf)["spark.jars"],
    }
    big = dag_tester.run(REPO / "dags" / "kafka2pc_kafka_source.py", "kafka2pc_kafka_source", {}, env)
    assert big.state == "success", big.log
    wanted = Counter(str(i) for i in range(3000) if i * 7 % 100000 >= 10000)
    assert visible_keys(kafka, "kafka2pc_example_big_orders") == wanted
    ends = group_offsets(kafka, "kafka2pc-example-big-orders")
    assert set(ends) == {0, 1} and sum(o or 0 for o in ends.values()) == 3000 + 2  # + a commit marker each
    assert kafka.open_transactions("kafka2pc_example.big_orders") == []
