"""Stale actors on a real broker (DESIGN §15): a process that pauses (SIGSTOP) and comes back
(SIGCONT) after others moved on changes nothing, judged by a read_committed consumer, the
transactions left open and the decision log's verdicts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.markers import Fate, transaction_fate
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.helpers.actors import sigkill, wait_for_line, wait_until_stopped
from tests.helpers.kafka import REPO, KafkaEnv
from tests.integration.test_decisions_broker import prepare, settle, spawn, write_committables

pytestmark = pytest.mark.kafka


def _new(stem: str) -> str:
    return f"{stem}{uuid.uuid4().hex[:8]}"


def test_markers_tell_committed_from_aborted_after_the_id_moved_on(kafka: KafkaEnv) -> None:
    """DescribeTransactions shows only the newest epoch of a POOLING id; the data partitions still show
    each earlier transaction's marker."""
    prefix, topic = _new("m"), kafka.topic()
    log = DecisionLog(kafka.config, topic=_new("decisions_"))
    committed = prepare(kafka, prefix, 2, topic, records=300, tag="first")
    commit_prepared(committed, kafka.wire, log, "run-1")
    aborted = prepare(kafka, prefix, 2, topic, records=300, tag="second")
    abort_prepared(aborted, kafka.wire, log, "run-2")
    prepare(kafka, prefix, 2, topic, records=300, tag="third")  # the ids move on again, left open
    for cs, fate in ((committed, Fate.COMMITTED), (aborted, Fate.ABORTED)):
        for c in cs:
            state = kafka.describe(c.transactional_id)[c.transactional_id]
            assert state is not None and state.producer_epoch > c.producer_epoch  # superseded: no more to see
            for since in (0, c.first_write_ms or 0):  # from the log's start, and from the transaction's start
                got, where = transaction_fate(kafka.wire, ref_of(c), c.describe_partitions(), since)
                assert got is fate, (since, where)
    never = TxnRef(committed[0].transactional_id, committed[0].producer_id, committed[0].producer_epoch + 50)
    assert transaction_fate(kafka.wire, never, committed[0].describe_partitions(), 0)[0] is Fate.ABSENT
    open_now = ref_of(kafka.describe(committed[0].transactional_id)[committed[0].transactional_id])
    assert transaction_fate(kafka.wire, open_now, committed[0].describe_partitions(), 0)[0] is Fate.OPEN
    settle(kafka, prefix, log)


@pytest.mark.parametrize("resumed", ["before the next run", "after the next run reused the ids"])
def test_a_commit_paused_after_its_decision_changes_nothing_when_it_comes_back(
    kafka: KafkaEnv, tmp_path: Path, resumed: str
) -> None:
    """The zombie of issue 46: a commit frozen between its COMMIT and its first EndTxn, retried
    elsewhere, resumed later (after the next run took the ids under new epochs). It must not call the
    committed run LOST, and every tool must keep saying COMMITTED."""
    prefix, topic, log_topic = _new("z"), kafka.topic(), _new("decisions_")
    log = DecisionLog(kafka.config, topic=log_topic)
    first = prepare(kafka, prefix, 2, topic, records=4000, tag="run1")
    path = write_committables(tmp_path, first)
    args = ("--run", "run-1", "--committables", path, "--decision-topic", log_topic, "--pause-after-decision")

    def meanwhile() -> None:
        # The retry on another worker commits the run; the paused try holds its old reading.
        assert commit_prepared(first, kafka.wire, log, "run-1").committed
        if resumed != "before the next run":
            settle(kafka, prefix, log)  # the next run's recovery sensor: nothing open
            second = prepare(kafka, prefix, 2, topic, records=4000, tag="run2")
            assert commit_prepared(second, kafka.wire, log, "run-2").committed
            assert all(
                s is not None and s.producer_epoch > c.producer_epoch
                for c in first
                for s in [kafka.describe(c.transactional_id)[c.transactional_id]]
            )

    out, said = _comes_back(kafka, tmp_path, args, meanwhile)
    assert "TransactionLost" not in said and "lost" not in out
    expected = 8000 if resumed == "before the next run" else 16000
    keys = [r.key for r in kafka.read_committed(topic)]
    assert len(keys) == expected and len(set(keys)) == expected
    state = DecisionLog(kafka.config, topic=log_topic).read()
    assert state.runs[(prefix, "run-1")].status is RunStatus.COMMITTED
    assert state.overruled == {}
    result = recover(kafka.wire, prefix, log, run="run-3")
    assert result.done and not result.lost
    assert kafka.open_transactions(prefix) == []
    # What the user is told agrees: `kafka2pc list` finds nothing open and nothing lost (exit 0).
    listed = subprocess.run(
        [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "list", "--prefix", prefix, "--json",
         "--bootstrap-servers", kafka.bootstrap, "--decision-topic", log_topic],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout + listed.stderr


def test_a_commit_paused_before_its_decision_answers_from_the_twin_that_committed_meanwhile(
    kafka: KafkaEnv, tmp_path: Path
) -> None:
    """A commit frozen right after it read the log, before it looked at its transactions; its retry
    commits the run meanwhile. Back, it finds them committed, which its old reading calls doomed: it
    must answer from the log read again (committed, by another process), never append an ABORT and
    say that nothing of the run is visible."""
    prefix, topic, log_topic = _new("zr"), kafka.topic(), _new("decisions_")
    log = DecisionLog(kafka.config, topic=log_topic)
    log.ensure_topic()
    first = prepare(kafka, prefix, 2, topic, records=500, tag="run1")
    path = write_committables(tmp_path, first)
    args = ("--run", "run-1", "--committables", path, "--decision-topic", log_topic, "--pause-after-read")
    # The retry, elsewhere, commits the run while the first try is stopped.
    out, said = _comes_back(kafka, tmp_path, args, lambda: commit_prepared(first, kafka.wire, log, "run-1"))
    assert "was decided by another process since this commit read the log" in said, said[-3000:]
    assert "already committed" in out or '"resolutions": 2' in out, out
    assert "nothing of it is visible" not in said and "RunAborted" not in said
    keys = [r.key for r in kafka.read_committed(topic)]
    assert len(keys) == 1000 and len(set(keys)) == 1000
    state = DecisionLog(kafka.config, topic=log_topic).read()
    assert state.runs[(prefix, "run-1")].status is RunStatus.COMMITTED
    assert kafka.open_transactions(prefix) == []


def _comes_back(
    kafka: KafkaEnv, tmp_path: Path, args: Sequence[str], meanwhile: Callable[[], object]
) -> tuple[str, str]:
    """A commit actor that stops itself (SIGSTOP, at the pause ``args`` name), ``meanwhile`` done while
    it is stopped, then SIGCONT: its (stdout, stderr), once it exited 0."""
    zombie, err = spawn(kafka, tmp_path, "commit", *args)
    try:
        wait_for_line(zombie, err, "paused")
        wait_until_stopped(zombie, err)  # the line comes just before its SIGSTOP: the next event is the stop
        meanwhile()
        os.killpg(zombie.pid, signal.SIGCONT)
        out, _ = zombie.communicate(timeout=180)
    finally:
        if zombie.poll() is None:
            sigkill(zombie)
    said = err.read_text()
    assert zombie.returncode == 0, said[-3000:]
    return out, said


def _history_keys(config: dict[str, str], topic: str) -> list[bytes]:
    """Every key partition 1 (the history) holds now, raw, in offset order."""
    return [e.key for e in DecisionLog(config, topic=topic).scan(None, 1)]


def test_the_cleaner_keeps_a_committed_run_committed_after_a_late_lost_that_nobody_settled(kafka: KafkaEnv) -> None:
    """A zombie's LOST lands after the run's COMMITTED and its writer dies before it reads again;
    nobody reads the run; the log cleaner compacts both partitions. One key per run kept LOST alone;
    one history key per rank keeps both, and every reader still finds the run COMMITTED: a reader of
    partition 0 alone meets the LOST copy, reads the run's history, and settles the copy."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord

    topic, prefix, run = _new("decisions_cmp"), _new("cmp"), "run-1"
    log = DecisionLog(kafka.config, topic=topic)
    log.ensure_topic()
    quick = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
    admin = AdminClient(kafka.config)
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in quick.items()]
    resource = ConfigResource("TOPIC", topic, incremental_configs=entries)
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)
    committed = RunRecord(prefix, run, RunStatus.COMMITTED, 2, 200, 1)
    lost = RunRecord(prefix, run, RunStatus.LOST, 2, 200, 2, note="the zombie's")
    log.append([(committed.key, committed.to_json())])
    log.append([(committed.key, committed.to_json())])  # a second writer of the same record: compacted away
    log.append([(lost.key, lost.to_json())])  # the zombie's, never settled: it died here
    first = _history_keys(kafka.config, topic)
    assert len(first) == 3 and first[0] == first[1] != first[2]
    # Segments roll on the next append after segment.ms; the cleaner compacts the closed ones.
    deadline = time.monotonic() + 240
    filler = 0
    while len([k for k in _history_keys(kafka.config, topic) if k == first[0]]) > 1:
        assert time.monotonic() < deadline, "the log cleaner did not compact the history"
        filler += 1
        other = RunRecord(prefix, f"filler-{filler}", RunStatus.COMMITTED, 1, 1, 3)
        log.append([(other.key, other.to_json())])
        time.sleep(0.5)
    assert first[2] in _history_keys(kafka.config, topic)  # the zombie's LOST stays, under its own key
    # Recovery's read (partition 0, the prefix's losses) meets the LOST copy first, confirms it from
    # the history, finds no loss, and settles the copy with a tombstone.
    assert (prefix, run) not in DecisionLog(kafka.config, topic=topic).read_for(prefix).runs
    assert (prefix, run) not in DecisionLog(kafka.config, topic=topic).read(history=frozenset()).runs
    fresh = DecisionLog(kafka.config, topic=topic)
    assert fresh.read_for(prefix, run).runs[(prefix, run)].status is RunStatus.COMMITTED
