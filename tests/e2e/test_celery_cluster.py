"""Airflow on the emulated cluster of issue 38 (tests/helpers/airflow_cluster.py): the api-server,
scheduler and dag-processor on host ``airflow``, the triggerer on ``trigger``, Celery workers on
``worker1`` (the prepare's queue) and ``worker2`` (the commit's), a broker on ``kafka1``; PostgreSQL
and Redis on the bridge. The example DAG, unchanged, runs through the Celery executor with its
prepare on one host and its commit on another; the e2e DAG's commit (held after its decision)
survives its host dying there. Judged by a read_committed consumer and the transactions left open.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.records import Kind
from tests.helpers import netns
from tests.helpers.airflow_cluster import ROUTES, WORKERS, CeleryAirflow
from tests.helpers.airflow_dagtest import kafka2pc_connection
from tests.helpers.kafka import REPO, KafkaEnv, kafka_on_hosts

pytestmark = [pytest.mark.kafka, pytest.mark.airflow_standalone]

DAG_ID = "kafka2pc_example"
# tests/e2e/dags/e2e_kafka2pc.py's manual DAG, whose faults hold a commit where a kill must land.
E2E_DAG = "e2e_kafka2pc"
# tests/e2e/dags/e2e_kafka2pc.py's daily DAG: its backfill runs take turns with a live run.
SCHEDULED = "e2e_kafka2pc_scheduled"
E2E_PREFIX = "celery_e2e"
PREFIX = "kafka2pc_example.orders"  # the example's transactional id prefix
TOPIC = "kafka2pc_example_orders"
HOSTS = ("airflow", "trigger", "worker1", "worker2", "worker3", "kafka1")


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netns.Network]:
    with netns.owned_network(f"k2a{secrets.token_hex(2)}", HOSTS, tmp_path_factory.mktemp("celery-net")) as n:
        yield n


@pytest.fixture(scope="module")
def host_kafka(network: netns.Network, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    with kafka_on_hosts(network, ["kafka1"], tmp_path_factory.mktemp("celery-kafka")) as env:
        yield env


@pytest.fixture(scope="module")
def airflow(
    network: netns.Network, host_kafka: KafkaEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryAirflow]:
    dags = tmp_path_factory.mktemp("celery-dags")
    (dags / "kafka2pc_example.py").symlink_to(REPO / "dags" / "kafka2pc_example.py")
    (dags / "e2e_kafka2pc.py").symlink_to(REPO / "tests" / "e2e" / "dags" / "e2e_kafka2pc.py")
    env = {
        "E2E_PREFIX": E2E_PREFIX,
        "E2E_TOPIC": host_kafka.topic(partitions=2),
        "E2E_DEFERRABLE": "1",
        **kafka2pc_connection(host_kafka),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": host_kafka.bootstrap,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    home = tmp_path_factory.mktemp("celery-airflow") / "home"
    af = CeleryAirflow(home, dags, network, WORKERS, ROUTES, env, dag_ids=[DAG_ID, E2E_DAG, SCHEDULED])
    af.start()  # a cluster that cannot start errors every test of the module
    try:
        af.unpause(DAG_ID)
        af.unpause(E2E_DAG)
        af.unpause(SCHEDULED)
        yield af
    finally:
        af.stop()


def _visible(kafka: KafkaEnv, run_id: str) -> tuple[int, int]:
    """The run's records a read_committed consumer sees: (count, unique keys)."""
    run = run_id.replace("'", "")  # as the example DAG tags its values
    keys = [r.key for r in kafka.read_committed(TOPIC) if r.value and json.loads(r.value)["run"] == run]
    return len(keys), len(set(keys))


def _hosts(af: CeleryAirflow, run_id: str, task: str, dag_id: str = DAG_ID) -> list[tuple[str, str]]:
    task_id = f"orders.{task}" if dag_id == DAG_ID else task
    return [(str(t["hostname"]), str(t["state"])) for t in af.task_tries(dag_id, run_id, task_id)]


def test_the_example_dag_prepares_on_one_host_and_commits_on_another_exactly_once(
    airflow: CeleryAirflow, host_kafka: KafkaEnv
) -> None:
    rows = 200_000
    run_id = airflow.trigger(DAG_ID, {"rows": rows, "partitions": 4})
    assert airflow.wait_run(DAG_ID, run_id, timeout=600) == "success", airflow.task_states(DAG_ID, run_id)
    assert _hosts(airflow, run_id, "prepare") == [("worker1", "success")]
    assert _hosts(airflow, run_id, "commit") == [("worker2", "success")]
    assert _visible(host_kafka, run_id) == (rows, rows)
    assert host_kafka.open_transactions(PREFIX) == []


class _KillAfterTheDecision(threading.Thread):
    """As soon as the run's COMMIT is in the decision log: the host's link down (nothing more of it
    reaches a broker or Airflow), then every process of the host killed."""

    def __init__(self, af: CeleryAirflow, kafka: KafkaEnv, run_id: str, host: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.af, self.kafka, self.run_id, self.host, self.prefix = af, kafka, run_id, host, prefix
        self.killed = 0
        self.open_at_kill: list[Any] = []  # the run's transactions still open then: where the kill landed
        self.error: BaseException | None = None
        self.give_up = threading.Event()

    def run(self) -> None:
        log = DecisionLog(self.kafka.config)
        try:
            while not self.give_up.is_set():
                decisions = log.read_for(self.prefix).decisions.values()
                if any(d.kind is Kind.COMMIT and self.run_id in d.run for d in decisions):
                    self.af.network.cut_link(self.host)
                    self.killed = self.af.kill_host(self.host)
                    self.open_at_kill = self.kafka.open_transactions(self.prefix)
                    return
                time.sleep(0.05)
        except BaseException as e:  # reported by the test, not lost in the thread
            self.error = e
        finally:
            log.close()


def test_the_commit_host_killed_after_the_decision_is_retried_on_another_host_exactly_once(
    airflow: CeleryAirflow, host_kafka: KafkaEnv
) -> None:
    """worker2 runs the commit, which decides COMMIT and then hangs before its first EndTxn (the
    e2e DAG's ``decided_then_hang``: without it the kill would race a commit that ends in well
    under a second). The host loses its link and then every process: Airflow fails the lost try
    (its heartbeat stops), and the retry, on worker3 (the replacement host that serves the commit's
    queue), commits what the decision says. Exactly once, nothing open. The abort, which may have
    been on worker2 too, retries and skips itself: the run succeeds."""
    rows, partitions, topic = 100_000, 4, airflow.env["E2E_TOPIC"]
    conf = {"tag": "hostkill", "rows": rows, "partitions": partitions, "fault": "decided_then_hang"}
    run_id = airflow.trigger(E2E_DAG, conf)
    killer = _KillAfterTheDecision(airflow, host_kafka, run_id, "worker2", E2E_PREFIX)
    killer.start()
    try:
        while killer.is_alive() and airflow.run_state(E2E_DAG, run_id) not in ("success", "failed"):
            killer.join(timeout=1)
        killer.give_up.set()
        killer.join(timeout=60)
        assert killer.error is None, killer.error
        assert killer.killed > 0, f"the run ended before its COMMIT was seen: {airflow.task_states(E2E_DAG, run_id)}"
        # The kill landed between the decision and the first EndTxn: every transaction open.
        assert len(killer.open_at_kill) == partitions, killer.open_at_kill
        airflow.start_worker("worker3", WORKERS["worker2"])
        assert airflow.wait_run(E2E_DAG, run_id, timeout=600) == "success", airflow.task_states(E2E_DAG, run_id)
        tries = _hosts(airflow, run_id, "commit", E2E_DAG)
        assert tries[0][0] == "worker2" and tries[0][1] != "success", tries  # the kill landed in the try
        assert tries[-1] == ("worker3", "success"), tries
        keys = [r.key for r in host_kafka.read_committed(topic) if r.key and r.key.startswith(b"hostkill-")]
        assert (len(keys), len(set(keys))) == (rows, rows)
        assert host_kafka.open_transactions(E2E_PREFIX) == []
    finally:
        killer.give_up.set()
        airflow.network.restore_link("worker2")


def _wait_task(af: CeleryAirflow, dag_id: str, run_id: str, task: str, state: str) -> None:
    deadline = time.monotonic() + 300
    while af.task_states(dag_id, run_id).get(task) != state:
        assert time.monotonic() < deadline, af.task_states(dag_id, run_id)
        assert af.run_state(dag_id, run_id) not in ("success", "failed"), af.task_states(dag_id, run_id)
        time.sleep(0.5)


def test_the_triggerer_host_killed_while_recovery_waits_hands_the_wait_to_another_triggerer(
    airflow: CeleryAirflow, host_kafka: KafkaEnv
) -> None:
    """A backfill run's recovery waits (deferred, in the triggerer on host ``trigger``) for the live
    run of the same POOLING exporter; the host dies. A triggerer on another host takes the trigger
    over once the dead one's heartbeat is stale, and both runs end exactly once, in turn."""
    rows, topic = 4_000, airflow.env["E2E_TOPIC"]
    if not airflow.serves(ROUTES["commit"]):  # the commit-host test did not get to its replacement
        airflow.start_worker("worker3", WORKERS["worker2"])
    live = airflow.trigger(SCHEDULED, {"tag": "tlive", "rows": rows, "partitions": 2, "sleep_s": 60, "fault": ""})
    _wait_task(airflow, SCHEDULED, live, "prepare", "running")
    conf = {"tag": "tbf", "rows": rows, "partitions": 2, "tag_by_date": True, "fault": ""}
    airflow.backfill(SCHEDULED, "2026-01-02T00:00:00Z", "2026-01-02T00:00:00Z", conf=conf, max_active_runs=1)
    deadline = time.monotonic() + 120
    while not (runs := airflow.dag_runs(SCHEDULED, run_type="backfill")):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    backfilled = str(runs[0]["dag_run_id"])
    _wait_task(airflow, SCHEDULED, backfilled, "recover", "deferred")
    assert airflow.kill_host("trigger") > 0
    # The live run still holds the exporter: the trigger fires only after it ends, so on the new triggerer.
    assert airflow.run_state(SCHEDULED, live) not in ("success", "failed"), airflow.task_states(SCHEDULED, live)
    airflow.start_triggerer("airflow")
    for run_id in (live, backfilled):
        assert airflow.wait_run(SCHEDULED, run_id, timeout=600) == "success", airflow.task_states(SCHEDULED, run_id)
    # One try: the wait moved to the other triggerer, it did not fail and start again.
    assert [t["state"] for t in airflow.task_tries(SCHEDULED, backfilled, "recover")] == ["success"]
    log = airflow.task_log(SCHEDULED, backfilled, "recover", 1)
    assert f"DAG run {live} of {SCHEDULED} (queued first, still live)" in log, log
    # In turn: the backfill's prepare started after the live run had ended.
    prepare = airflow.task_instance(SCHEDULED, backfilled, "prepare")
    ended = datetime.fromisoformat(airflow.dag_run(SCHEDULED, live)["end_date"])
    assert datetime.fromisoformat(prepare["start_date"]) > ended, (prepare, ended)
    keys = [r.key for r in host_kafka.read_committed(topic) if r.key is not None]
    for tag in ("tlive-", "tbf20260102-"):
        mine = [k for k in keys if k.startswith(tag.encode())]
        assert (len(mine), len(set(mine))) == (rows, rows), tag
    assert host_kafka.open_transactions(f"{E2E_PREFIX}_sched") == []
