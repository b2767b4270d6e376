"""An application submitted with spark-submit, its driver not the Airflow task (DESIGN §16): it
prepares with ``export_from_application`` and hands off through the decision topic; the Airflow
side's acceptance and the usual commit make it visible once. Real Spark, a real broker, judged by a
read_committed consumer and the transactions left open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, decision_run_name, sanitize_run_key
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.handoff import Acceptance, accept
from tests.helpers.actors import wait_for_line, wait_until_stopped
from tests.helpers.kafka import REPO, KafkaEnv
from tests.integration.test_decisions_broker import spawn, write_committables

pytestmark = pytest.mark.kafka

APP = REPO / "dags" / "spark_apps" / "export_orders.py"
INC = NamingStrategy.INCREMENTING
DAG = "orders_submit"


def spark_submit(
    kafka: KafkaEnv,
    app: Path,
    run_id: str,
    args: list[str],
    log: Path,
    master: str = "local[2]",
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """``spark-submit`` of ``app`` for run ``run_id``, in its own process group (driver and workers);
    ``options`` go before the application (a deploy mode, settings)."""
    env = {**os.environ, "KAFKA2PC_BOOTSTRAP_SERVERS": kafka.bootstrap, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
            "--conf", "spark.ui.enabled=false", *options,
            str(app), "--dag-id", DAG, "--run-id", run_id, "--task-id", "submit", *args]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=REPO,
                            start_new_session=True)  # fmt: skip


def submit_gated(
    kafka: KafkaEnv,
    prefix: str,
    topic: str,
    run_id: str,
    gate: Path,
    log: Path,
    master: str = "local[2]",
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The test application (``tests/spark_apps/gated_export.py``): order 0 waits for ``gate`` mid-write."""
    args = ["--prefix", prefix, "--topic", topic, "--tag", "gated", "--gate", str(gate)]
    app = REPO / "tests" / "spark_apps" / "gated_export.py"
    return spark_submit(kafka, app, run_id, args, log, master, options, env)


def _three_open(kafka: KafkaEnv, prefix: str, proc: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 300
    while len(kafka.open_transactions(prefix, settle_s=0)) < 3:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the first attempt never had three transactions open"
        time.sleep(0.2)


def submit(
    kafka: KafkaEnv, prefix: str, topic: str, run_id: str, tag: str, rows: int, log: Path
) -> subprocess.Popen[str]:
    """The example application, ``rows`` orders in 4 partitions."""
    args = ["--prefix", prefix, "--topic", topic, "--rows", str(rows), "--partitions", "4", "--tag", tag]
    return spark_submit(kafka, APP, run_id, args, log)


def _accept(kafka: KafkaEnv, prefix: str, run_id: str) -> Acceptance:
    log = DecisionLog(kafka.config)
    try:
        run = decision_run_name(DAG, run_id)
        return accept(log, TransactionInspector(kafka.wire), prefix, run, INC, sanitize_run_key(run_id))
    finally:
        log.close()


def _visible(kafka: KafkaEnv, topic: str, tag: str) -> tuple[int, int]:
    keys = [r.key for r in kafka.read_committed(topic) if r.key is not None and r.key.startswith(f"{tag}-".encode())]
    return len(keys), len(set(keys))


def test_a_submitted_application_hands_off_and_one_commit_makes_it_visible_once(
    kafka: KafkaEnv, tmp_path: Path
) -> None:
    prefix, topic, run_id, rows = (
        f"ho{uuid.uuid4().hex[:8]}",
        kafka.topic(partitions=2),
        "manual__2026-12-06T09:00",
        20_000,
    )
    proc = submit(kafka, prefix, topic, run_id, "sub", rows, tmp_path / "app.log")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]  # spark-submit sends Python's stderr to its stdout
    said = json.loads(out.strip().splitlines()[-1])
    assert said["handed_off"] and said["transactions"] == 4 and said["records"] == rows, said
    found = _accept(kafka, prefix, run_id)
    assert found.handoff is not None and found.handoff.attempt == said["attempt"], found
    assert _visible(kafka, topic, "sub") == (0, 0)  # prepared, not committed
    assert len(kafka.open_transactions(prefix)) == 4
    log = DecisionLog(kafka.config)
    try:
        members = Members(prefix, INC, sanitize_run_key(run_id))
        report = commit_prepared(
            found.handoff.committables, kafka.wire, log, decision_run_name(DAG, run_id), prefixes=[members]
        )
    finally:
        log.close()
    assert report.count(Verdict.COMMITTED) == 4
    assert _visible(kafka, topic, "sub") == (rows, rows)
    assert kafka.open_transactions(prefix) == []
    # Submitted again after the commit (a retried submit task): nothing is exported a second time.
    again = submit(kafka, prefix, topic, run_id, "sub", rows, tmp_path / "again.log")
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"handed_off": False}
    assert _visible(kafka, topic, "sub") == (rows, rows)
    assert _accept(kafka, prefix, run_id).decided is not None


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_driver_killed_or_paused_mid_write_and_submitted_again_is_committed_once(
    kafka: KafkaEnv, tmp_path: Path, fault: str
) -> None:
    """The first driver attempt is struck while three of its four transactions are open; the submit
    task's retry runs a second attempt, on ids of its own, whose recovery pass aborts the first's;
    its handoff is the one accepted, and the commit makes the run visible once. A paused first
    attempt is resumed after the commit: it hands nothing off, and nothing of it becomes visible or
    stays open."""
    prefix, topic, run_id = f"hz{uuid.uuid4().hex[:8]}", kafka.topic(partitions=2), "manual__2026-12-06T10:00"
    first = submit_gated(kafka, prefix, topic, run_id, tmp_path / "gate-1", tmp_path / "first.log")
    try:
        _three_open(kafka, prefix, first, tmp_path / "first.log")
        os.killpg(first.pid, getattr(signal, fault))
        (tmp_path / "gate-2").touch()  # the second attempt does not wait
        second = submit_gated(kafka, prefix, topic, run_id, tmp_path / "gate-2", tmp_path / "second.log")
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, out[-3000:]  # spark-submit sends Python's stderr to its stdout
        assert json.loads(out.strip().splitlines()[-1]) == {"handed_off": True}
        found = _accept(kafka, prefix, run_id)
        assert found.handoff is not None and found.stale == (), found
        log = DecisionLog(kafka.config)
        try:
            members = Members(prefix, INC, sanitize_run_key(run_id))
            run = decision_run_name(DAG, run_id)
            report = commit_prepared(found.handoff.committables, kafka.wire, log, run, prefixes=[members])
        finally:
            log.close()
        assert report.count(Verdict.COMMITTED) == 4
        if fault == "SIGSTOP":  # the zombie comes back after the commit
            (tmp_path / "gate-1").touch()
            os.killpg(first.pid, signal.SIGCONT)
            out, _ = first.communicate(timeout=600)
            # Its transactions aborted under it, it fails, or, its job done, it finds the run decided,
            # aborts what it wrote and hands nothing off: never a handoff of a decided run.
            stood_down = first.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"handed_off": False}
            assert first.returncode != 0 or stood_down, out[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(60)
    assert _visible(kafka, topic, "gated") == (8_000, 8_000)
    assert kafka.open_transactions(prefix) == []
    assert _accept(kafka, prefix, run_id).decided is not None


def test_a_live_earlier_attempt_resumed_between_the_decision_and_the_end_changes_nothing(
    kafka: KafkaEnv, tmp_path: Path
) -> None:
    """What shared ids left open (DESIGN §16): a first attempt paused mid-write; a second accepted,
    and its commit paused between its COMMIT and its first EndTxn; the first resumes and its Spark
    task, failed, starts again (``local[2,4]``: task retries, as on a cluster) while the run's
    transactions are decided but still open. Had it the same ids, the retry's InitProducerId would
    abort one of them and the run would be LOST. On ids of its own it touches none: the commit ends
    them, the run is visible once, the resumed attempt hands nothing off, nothing stays open."""
    prefix, topic, run_id = f"hl{uuid.uuid4().hex[:8]}", kafka.topic(partitions=2), "manual__2026-12-06T11:00"
    run = decision_run_name(DAG, run_id)
    first = submit_gated(kafka, prefix, topic, run_id, tmp_path / "gate-1", tmp_path / "first.log", "local[2,4]")
    commit: subprocess.Popen[str] | None = None
    try:
        _three_open(kafka, prefix, first, tmp_path / "first.log")
        os.killpg(first.pid, signal.SIGSTOP)
        (tmp_path / "gate-2").touch()
        second = submit_gated(kafka, prefix, topic, run_id, tmp_path / "gate-2", tmp_path / "second.log")
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"handed_off": True}, out[-3000:]
        found = _accept(kafka, prefix, run_id)
        assert found.handoff is not None, found
        accepted = found.handoff.committables
        path = write_committables(tmp_path, accepted)
        commit, err = spawn(kafka, tmp_path, "commit", "--run", run, "--committables", path, "--pause-after-decision")
        wait_for_line(commit, err, "paused")
        wait_until_stopped(commit, err)  # the line comes just before its SIGSTOP
        (tmp_path / "gate-1").touch()
        os.killpg(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=600)
        stood_down = first.returncode == 0 and json.loads(out.strip().splitlines()[-1]) == {"handed_off": False}
        assert first.returncode != 0 or stood_down, out[-3000:]
        os.killpg(commit.pid, signal.SIGCONT)
        said, _ = commit.communicate(timeout=180)
        assert commit.returncode == 0, err.read_text()[-3000:]
    finally:
        for proc in (first, commit):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(60)
    assert "lost" not in said.lower() and "TransactionLost" not in err.read_text()
    assert _visible(kafka, topic, "gated") == (8_000, 8_000)
    assert kafka.open_transactions(prefix) == []
    log = DecisionLog(kafka.config)
    try:
        assert log.read_for(prefix, run).run_status(prefix, run).status is RunStatus.COMMITTED  # type: ignore[union-attr]
    finally:
        log.close()
