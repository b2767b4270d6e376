"""A paused export try that comes back (DESIGN §15), with real Spark on a real broker: the try is
SIGSTOPped after it took its number and before its writers take their ids, a newer try or run
exports and commits meanwhile, then the old try gets SIGCONT. Its writers stand down without
fencing the newer transactions; judged by a read_committed consumer, the open transactions and the
run's record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from tests.helpers.actors import spawn as spawn_actor
from tests.helpers.actors import wait_for_line, wait_until_stopped
from tests.helpers.export_try_actor import SUPERSEDED_EXIT
from tests.helpers.kafka import KafkaEnv
from tests.integration.test_decisions_broker import spawn, write_committables

pytestmark = pytest.mark.kafka

DECISIONS = "kafka2pc_decisions"
ROWS, PARTITIONS = 400, 4


def _export(kafka: KafkaEnv, prefix: str, topic: str, run: str, run_key: str | None, tag: str, tmp: Path,
            *more: str) -> tuple[subprocess.Popen[str], Path]:  # fmt: skip
    argv = [sys.executable, "-m", "tests.helpers.export_try_actor", "--bootstrap", kafka.bootstrap,
            "--decision-topic", DECISIONS, "--prefix", prefix, "--topic", topic, "--run", run, "--tag", tag,
            "--rows", str(ROWS), "--partitions", str(PARTITIONS), *more]  # fmt: skip
    argv += ["--run-key", run_key] if run_key else []
    return spawn_actor(argv, tmp, tag)


@pytest.mark.parametrize(
    ("newer", "paused"),
    [
        # POOLING: the next run takes the same ids; the old try comes back after its COMMIT, before its EndTxns.
        ("next_run_decided", "before its writers"),
        # INCREMENTING: the task's retry takes the run's ids; the old try comes back before its decision.
        ("retry_prepared", "before its writers"),
        # The same, the old try stopped before its recovery pass, which would abort the retry's transactions.
        ("retry_prepared", "before its recovery pass"),
    ],
)
def test_a_paused_export_try_that_comes_back_fences_nothing_of_the_newer_one(
    kafka: KafkaEnv, tmp_path: Path, newer: str, paused: str
) -> None:
    prefix, topic = f"try{uuid.uuid4().hex[:8]}", kafka.topic(partitions=3)
    pooling = newer == "next_run_decided"
    old_run, new_run = ("run-1", "run-2") if pooling else ("run-1", "run-1")
    run_key = None if pooling else "run_1"
    gate = tmp_path / "gate"
    writers = paused == "before its writers"
    how = ("--gate", str(gate)) if writers else ("--pause-after-seen",)
    old, old_err = _export(kafka, prefix, topic, old_run, run_key, "old", tmp_path, *how)
    commit: subprocess.Popen[str] | None = None
    try:
        if writers:
            wait_for_line(old, old_err, f"holds {prefix}-", timeout_s=300)  # its number taken, its frame computing
            os.killpg(old.pid, signal.SIGSTOP)
        else:
            wait_for_line(old, old_err, "paused", timeout_s=300)  # it read the try id and stops itself
        wait_until_stopped(old, old_err)
        gate.touch()  # once it runs again, nothing holds it back
        new, new_err = _export(kafka, prefix, topic, new_run, run_key, "new", tmp_path)
        out, _ = new.communicate(timeout=600)
        assert new.returncode == 0, new_err.read_text()[-3000:]
        committables = [Committable.from_json(line) for line in out.splitlines() if line.strip()]
        assert len(committables) == PARTITIONS
        path = write_committables(tmp_path, committables)
        if pooling:  # decided, stopped before its first EndTxn: the moment a fencing would make the run LOST
            commit, commit_err = spawn(kafka, tmp_path, "commit", "--run", new_run, "--committables", path,
                                       "--pause-after-decision")  # fmt: skip
            wait_for_line(commit, commit_err, "paused")
            wait_until_stopped(commit, commit_err)  # the line comes just before its SIGSTOP
        os.killpg(old.pid, signal.SIGCONT)
        old.communicate(timeout=600)
        said = old_err.read_text()
        assert old.returncode == SUPERSEDED_EXIT, said[-3000:]
        assert f"SupersededExportError: this export try of exporter {prefix!r} was superseded by another try" in said
        try_id = f"{prefix}-{run_key + '-' if run_key else ''}try"
        named = f"{try_id}' is held by producer" if writers else "another try took a number since this one began"
        assert named in said, said[-3000:]
        if commit is None:
            commit, commit_err = spawn(kafka, tmp_path, "commit", "--run", new_run, "--committables", path)
        else:
            os.killpg(commit.pid, signal.SIGCONT)
        commit.communicate(timeout=300)
        assert commit.returncode == 0, commit_err.read_text()[-3000:]
    finally:
        for proc in (old, commit):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
    assert kafka.count_committed(topic, b"new/") == (ROWS, ROWS)  # the newer export, whole, once
    assert kafka.count_committed(topic, b"old/") == (0, 0)
    assert kafka.open_transactions(prefix) == []
    log = DecisionLog(kafka.config, topic=DECISIONS)
    try:
        record = log.read_for(prefix, new_run).run_status(prefix, new_run)
    finally:
        log.close()
    assert record is not None and record.status is RunStatus.COMMITTED, record
