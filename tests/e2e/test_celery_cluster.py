"""Airflow on the emulated cluster of issue 38 (tests/helpers/airflow_cluster.py): the api-server,
scheduler and dag-processor on host ``airflow``, the triggerer on ``trigger``, Celery workers on
``worker1`` (the prepare's queue) and ``worker2`` (the commit's), a broker on ``kafka1``; PostgreSQL
and Redis on the bridge. The example DAG, unchanged, runs through the Celery executor with its
prepare on one host and its commit on another; so does the spark-submit DAG, whose application's
driver runs on ``worker1`` (spark-submit's, not the task's) and hands off through Kafka to the
commit on ``worker2``; the e2e DAG's commit (held after its decision)
survives its host dying there, and its host frozen there and coming back after the next run.
Judged by a read_committed consumer and the transactions left open.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.operators.payload import ExportPayload
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.records import Kind, RunStatus
from tests.helpers import netns
from tests.helpers.actors import stopped
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
HOSTS = ("airflow", "trigger", "worker1", "worker2", "worker3", "worker4", "kafka1")
SUBMIT_DAG = "kafka2pc_spark_submit"  # dags/kafka2pc_spark_submit.py: its submit task on worker1
SUBMIT_PREFIX = "kafka2pc_spark_submit.orders"


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
    (dags / "kafka2pc_spark_submit.py").symlink_to(REPO / "dags" / "kafka2pc_spark_submit.py")
    env = {
        "E2E_PREFIX": E2E_PREFIX,
        "E2E_TOPIC": host_kafka.topic(partitions=2),
        "E2E_DEFERRABLE": "1",
        **kafka2pc_connection(host_kafka),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": host_kafka.bootstrap,
        # The spark-submit DAG: spark-submit (beside this Python) runs the application in local mode
        # on the submit task's host; its records go to a topic of their own.
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "KAFKA2PC_SPARK_SUBMIT_APPLICATION": str(REPO / "dags" / "spark_apps" / "export_orders.py"),
        "KAFKA2PC_SPARK_SUBMIT_TOPIC": host_kafka.topic(partitions=2),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    home = tmp_path_factory.mktemp("celery-airflow") / "home"
    routes = {**ROUTES, "submit": "prepare_host"}
    af = CeleryAirflow(home, dags, network, WORKERS, routes, env, dag_ids=[DAG_ID, E2E_DAG, SCHEDULED, SUBMIT_DAG])
    af.start()  # a cluster that cannot start errors every test of the module
    try:
        af.unpause(DAG_ID)
        af.unpause(E2E_DAG)
        af.unpause(SCHEDULED)
        af.unpause(SUBMIT_DAG)
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


def test_a_submitted_application_hands_off_from_one_host_and_is_committed_on_another_exactly_once(
    airflow: CeleryAirflow, host_kafka: KafkaEnv
) -> None:
    """The submit task runs on worker1 and its application's driver with it (spark-submit's own
    process, local mode); the handoff goes through Kafka; the commit runs on worker2, which took no
    part in the prepare. ``kafka2pc describe`` and the exporters page show the run committed."""
    rows = 20_000
    run_id = airflow.trigger(SUBMIT_DAG, {"rows": rows, "partitions": 4})
    assert airflow.wait_run(SUBMIT_DAG, run_id, timeout=600) == "success", airflow.task_states(SUBMIT_DAG, run_id)
    assert _hosts(airflow, run_id, "submit", SUBMIT_DAG) == [("worker1", "success")]
    assert _hosts(airflow, run_id, "commit", SUBMIT_DAG) == [("worker2", "success")]
    topic = airflow.env["KAFKA2PC_SPARK_SUBMIT_TOPIC"]
    assert host_kafka.count_committed(topic, f"{run_id}-".encode()) == (rows, rows)
    assert host_kafka.open_transactions(SUBMIT_PREFIX) == []
    run = f"{SUBMIT_DAG}/{run_id}"
    command = [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "describe", "--prefix", SUBMIT_PREFIX,
               "--bootstrap-servers", host_kafka.bootstrap, "--json"]  # fmt: skip
    described = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert described.returncode == 0, described.stderr[-2000:]
    runs = {r["run"]: r for r in json.loads(described.stdout)["runs"]}
    assert runs[run]["status"] == "COMMITTED" and runs[run]["records"] == rows, runs.get(run)
    page = airflow.request(
        "GET", "/kafka2pc/api/exporters", params={"conn_id": "kafka2pc_default", "prefix": SUBMIT_PREFIX}
    )
    [exporter] = page.json()["exporters"]
    assert [(r["state"], r["records"]) for r in exporter["runs"] if r["run"] == run] == [("COMMITTED", rows)], exporter


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
                # Each look replays the decision log with a new consumer: once a second is enough,
                # since the commit hangs 600 s after its decision (decided_then_hang) and a kill a
                # second later lands in the same place (every transaction still open).
                time.sleep(1.0)
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
        time.sleep(1.0)


def _commit_hosts(af: CeleryAirflow) -> list[str]:
    return sorted(h for h, queues in af.workers.items() if ROUTES["commit"] in queues)


def _paused_commit(af: CeleryAirflow, run_id: str, hosts: list[str]) -> tuple[str, int]:
    """The host and pid of the commit try that stopped itself after its decision (decided_then_pause)."""
    deadline = time.monotonic() + 600
    while True:
        for host in hosts:
            for pid in af.network.pids(host):
                if stopped(pid):
                    return host, pid
        assert time.monotonic() < deadline, af.task_states(E2E_DAG, run_id)
        assert af.run_state(E2E_DAG, run_id) not in ("success", "failed"), af.task_states(E2E_DAG, run_id)
        # A look is an `ip netns pids` per host and a REST read; the try stays stopped until the test
        # resumes it, so a second's delay changes nothing.
        time.sleep(1.0)


def _transactional_ids(af: CeleryAirflow, run_id: str) -> set[str]:
    payload = ExportPayload.from_xcom(af.xcom(E2E_DAG, run_id, "prepare"), "prepare")
    return {c.transactional_id for c in payload.committables}


def _signal_host(af: CeleryAirflow, host: str, sig: signal.Signals, but: int = 0) -> None:
    for pid in af.network.pids(host):
        if pid != but:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def test_a_commit_frozen_after_its_decision_comes_back_after_the_next_run_and_changes_nothing(
    airflow: CeleryAirflow, host_kafka: KafkaEnv, tmp_path: Path
) -> None:
    """Issue 46's scenario. The commit's first try stops right after its COMMIT is read back, and
    its whole host freezes (every process stopped, every packet dropped: a paused VM behind a
    partition). Airflow fails the try by heartbeat and retries it on another host, which commits;
    the next run reuses the transactional ids under new epochs. Then the host's network comes back
    and the old commit alone resumes, holding what it read before the freeze: it finds the run
    committed by another process and changes nothing. Kafka shows each run once, nothing open, the
    run's record stays COMMITTED, ``kafka2pc list`` exits 0, and a clear of the run's export
    exports nothing."""
    rows, later, partitions, topic = 100_000, 8_000, 4, airflow.env["E2E_TOPIC"]
    started = ""  # a second host serving the commit's queue, started here and stopped at the end
    if len(_commit_hosts(airflow)) < 2:
        started = next(h for h in ("worker3", "worker4") if h not in airflow.workers)
        airflow.start_worker(started, WORKERS["worker2"])
    out = tmp_path / "zombie.json"
    conf = {"tag": "zombie", "rows": rows, "partitions": partitions, "fault": "decided_then_pause"}
    run_id = airflow.trigger(E2E_DAG, {**conf, "zombie_out": str(out)})
    frozen, zombie = "", 0
    try:
        frozen, zombie = _paused_commit(airflow, run_id, _commit_hosts(airflow))
        # Every transaction open, the decision in the log: the freeze lands between the two.
        assert len(host_kafka.open_transactions(E2E_PREFIX)) == partitions
        _wait_task(airflow, E2E_DAG, run_id, "abort", "skipped")  # not reserved by the host about to freeze
        airflow.network.black_hole(frozen)
        _signal_host(airflow, frozen, signal.SIGSTOP)
        assert airflow.wait_run(E2E_DAG, run_id, timeout=600) == "success", airflow.task_states(E2E_DAG, run_id)
        tries = _hosts(airflow, run_id, "commit", E2E_DAG)
        assert tries[0][0] == frozen and tries[0][1] != "success", tries
        assert tries[-1][0] != frozen and tries[-1][1] == "success", tries
        # The next run takes the same transactional ids: the frozen commit's epochs are fenced now.
        nxt = airflow.trigger(E2E_DAG, {"tag": "zombienext", "rows": later, "partitions": partitions, "fault": ""})
        assert airflow.wait_run(E2E_DAG, nxt, timeout=600) == "success", airflow.task_states(E2E_DAG, nxt)
        ids = [_transactional_ids(airflow, r) for r in (run_id, nxt)]
        assert ids[0] == ids[1], ids
        # The network comes back; the old commit alone resumes (its host's supervisor stays frozen,
        # so nothing stops it first) and runs to its end.
        airflow.network.end_black_hole(frozen)
        os.kill(zombie, signal.SIGCONT)
        deadline = time.monotonic() + 300
        while not out.exists():
            assert time.monotonic() < deadline and not stopped(zombie), "the resumed commit did not end"
            time.sleep(0.2)
        said = json.loads(out.read_text())
        assert said == {"verdicts": {"COMMITTED": partitions}, "committed": True, "note": said["note"]}, said
    finally:
        if frozen:
            airflow.network.end_black_hole(frozen)
            _signal_host(airflow, frozen, signal.SIGCONT)
    for tag, n in (("zombie-", rows), ("zombienext-", later)):
        keys = [r.key for r in host_kafka.read_committed(topic) if r.key and r.key.startswith(tag.encode())]
        assert (len(keys), len(set(keys))) == (n, n), tag
    assert host_kafka.open_transactions(E2E_PREFIX) == []
    log = DecisionLog(host_kafka.config)
    try:
        state = log.read()  # every run record: the run's own is in the history
    finally:
        log.close()
    records = {r: rec.status for (p, r), rec in state.runs.items() if p == E2E_PREFIX and run_id in r}
    assert list(records.values()) == [RunStatus.COMMITTED], records
    listed = subprocess.run(
        [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "list", "--prefix", E2E_PREFIX, "--json",
         "--bootstrap-servers", host_kafka.bootstrap],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # The user's usual next step after a scare: clear the run's export. It exports nothing.
    airflow.clear_tasks(E2E_DAG, run_id, ["prepare"], include_downstream=True)
    assert airflow.wait_run(E2E_DAG, run_id, timeout=600) == "success", airflow.task_states(E2E_DAG, run_id)
    keys = [r.key for r in host_kafka.read_committed(topic) if r.key and r.key.startswith(b"zombie-")]
    assert (len(keys), len(set(keys))) == (rows, rows)
    assert host_kafka.open_transactions(E2E_PREFIX) == []
    if started:
        airflow.kill_host(started)  # the module's other tests find the workers they expect


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
        time.sleep(1.0)
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
