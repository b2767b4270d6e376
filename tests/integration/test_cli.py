"""The ``kafka2pc`` command line as a separate process against a real broker."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.reachability import REFUSED
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.records import Covered, Kind, new_decision
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.ruling import now_ms
from tests.helpers.kafka import REPO, KafkaEnv, generate, prepare_in_subprocess
from tests.helpers.no_airflow import REFUSE_AIRFLOW

pytestmark = pytest.mark.kafka

SCRIPT = Path(sys.executable).parent / "kafka2pc"
# Runs the module with every airflow import refused, then checks none slipped in.
NO_AIRFLOW = REFUSE_AIRFLOW + textwrap.dedent(
    """
    import runpy
    sys.argv = ["kafka2pc", *sys.argv[1:]]
    try:
        runpy.run_module("airflow_provider_kafka2pc.cli", run_name="__main__")
    finally:
        assert not [m for m in sys.modules if m == "airflow" or m.startswith("airflow.")]
    """
)


def kafka2pc(*args: str, how: str = "module", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = {
        "module": [sys.executable, "-m", "airflow_provider_kafka2pc.cli"],
        "script": [str(SCRIPT)],
        "no-airflow": [sys.executable, "-c", NO_AIRFLOW],
    }[how]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def covering(c: Committable, epoch: int | None = None) -> Covered:
    return Covered(
        c.transactional_id,
        c.producer_id,
        c.producer_epoch if epoch is None else epoch,
        c.records,
        c.describe_partitions(),
    )


def test_list_resolve_acknowledge_describe_end_to_end(kafka: KafkaEnv) -> None:
    topic = kafka.topic(3)
    prefix = f"cli{uuid.uuid4().hex[:8]}"
    neighbour = prefix + "2"  # starts with the prefix: must never be listed or touched
    tids = [f"{prefix}-{i}" for i in range(5)] + [f"{neighbour}-0"]
    with cf.ThreadPoolExecutor(3) as ex:
        prepared: dict[str, Committable] = dict(
            zip(
                tids, ex.map(lambda t: prepare_in_subprocess(kafka, t, generate(topic, 25, f"{t}/")), tids), strict=True
            )
        )
    decided = [prepared[f"{prefix}-0"], prepared[f"{prefix}-2"], prepared[f"{prefix}-4"]]
    # A COMMIT for an epoch of the id the broker never saw: a decided transaction that can never
    # become visible. It must not commit the open epoch; recovery finds it LOST.
    stale = prepared[f"{prefix}-3"]
    log = DecisionLog(kafka.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")
    crashed = new_decision(Kind.COMMIT, [covering(c) for c in decided], "crashed-run", "commit", [prefix], now_ms())
    lost_commit = new_decision(
        Kind.COMMIT, [covering(stale, stale.producer_epoch + 1)], "other-run", "commit", [prefix], now_ms()
    )
    theirs = new_decision(
        Kind.COMMIT, [covering(prepared[f"{neighbour}-0"])], "neighbour", "commit", [neighbour], now_ms()
    )
    log.append([(d.key, d.to_json()) for d in (crashed, lost_commit, theirs)])
    log.claim_prefix(prefix, "dag_orders.export")
    common = ["--prefix", prefix, "--bootstrap-servers", kafka.bootstrap, "--decision-topic", log.topic]
    want_commit = sorted(c.transactional_id for c in decided)
    want_abort = [f"{prefix}-1", f"{prefix}-3"]

    # list: every open transaction of the prefix, the decision that rules it, what recovery would do
    started = time.monotonic()
    listed = kafka2pc("list", *common, "--json", how="no-airflow")
    list_s = time.monotonic() - started
    # Transactions are open, and the COMMIT of other-run can never become visible: the broker never
    # saw its epoch. A loss, counted from the broker before any recovery: exit 4 (over 1).
    assert listed.returncode == 4, listed.stderr
    doc = as_json(listed)
    rows = {r["transactional_id"]: r for r in doc["transactions"]}
    assert sorted(rows) == sorted(tids[:5])
    for tid, r in rows.items():
        c = prepared[tid]
        assert (r["state"], r["producer_id"], r["producer_epoch"]) == ("Ongoing", c.producer_id, c.producer_epoch)
        assert sorted((p["topic"], p["partition"]) for p in r["partitions"]) == sorted(c.topic_partitions)
        assert 0 <= r["age_ms"] < 600_000
        if tid in want_commit:
            assert r["action"] == "roll forward"
            assert r["decision"] == {
                "kind": "COMMIT",
                "decision_id": crashed.decision_id,
                "run": "crashed-run",
                "actor": "commit",
            }
        else:
            assert (r["decision"], r["action"]) == (None, "abort")
    other = rows[stale.transactional_id]["other_decision"]
    assert (other["decision_id"], other["producer_epoch"]) == (lost_commit.decision_id, stale.producer_epoch + 1)
    assert doc["lost_runs"] == []
    [loss] = doc["lost_decisions"]
    assert (loss["decision_id"], loss["run"], loss["final"]) == (lost_commit.decision_id, "other-run", False)
    assert (loss["transactions"], loss["visible_transactions"], loss["lost_records"]) == (1, 0, 25)
    assert [t["transactional_id"] for t in loss["lost"]] == [stale.transactional_id]

    table = kafka2pc("list", *common, how="script")
    assert table.returncode == 4, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"prefix {prefix}: 5 open transaction(s)"
    assert {ln.split()[0]: ln.split()[-1] for ln in lines[2:7]} == {t: "forward" for t in want_commit} | {
        t: "abort" for t in want_abort
    }
    assert lines[7].startswith(f"LOST: run other-run of exporter {prefix}: 0 of 1 transaction(s) visible")

    # resolve --dry-run: the plan, nothing changed
    before = log.read().end_offset
    dry = kafka2pc("resolve", *common, "--dry-run", "--json")
    assert dry.returncode == 4, dry.stderr  # something to do, and the loss
    assert as_json(dry)["plan"] == {"roll_forward": want_commit, "abort": want_abort, "wait": []}
    assert sorted(kafka.open_transactions(prefix)) == sorted(tids[:5])
    assert kafka.read_committed(topic) == []
    assert log.read().end_offset == before

    # resolve: rolls the decided ones forward, aborts the rest, and reports the loss
    resolved = kafka2pc("resolve", *common, "--json")
    assert resolved.returncode == 4, resolved.stderr
    report = as_json(resolved)
    assert {(r["transactional_id"], r["producer_epoch"]): r["outcome"] for r in report["resolutions"]} == {
        (t, prepared[t].producer_epoch): "committed" for t in want_commit
    } | {(t, prepared[t].producer_epoch): "aborted" for t in want_abort} | {
        (stale.transactional_id, stale.producer_epoch + 1): "lost"
    }
    assert [(t["transactional_id"], t["producer_epoch"], t["records"]) for t in report["lost"]] == [
        (stale.transactional_id, stale.producer_epoch + 1, 25)
    ]
    assert [(r["run"], r["status"]) for r in report["lost_runs"]] == [("other-run", "LOST")]
    assert report["still_open"] == []
    assert kafka.open_transactions(prefix) == []
    assert kafka.open_transactions(neighbour) == [f"{neighbour}-0"]
    # The neighbour's open transaction holds back read_committed consumers of the partitions it
    # wrote (the last stable offset): end it before reading, as its own exporter would (its first
    # decision is a COMMIT, so it is rolled forward), and count only this prefix's records.
    abort_prepared([prepared[f"{neighbour}-0"]], kafka.wire, DecisionLog(kafka.config, topic=log.topic), "neighbour")
    keys = [k for r in kafka.read_committed(topic) if not (k := r.key or b"").startswith(f"{neighbour}-".encode())]
    assert sorted(keys) == sorted(f"{t}/{i}".encode() for t in want_commit for i in range(25))  # each once

    # the loss stays loud until an operator acknowledges it
    again = kafka2pc("resolve", *common)
    assert again.returncode == 4, again.stderr
    assert again.stdout.splitlines()[0] == f"prefix {prefix}: 0 committed, 0 aborted, 1 lost; 0 still open"
    assert f"kafka2pc acknowledge --prefix {prefix} --run other-run" in again.stdout
    wrong = kafka2pc("acknowledge", *common, "--run", "crashed-run")
    assert wrong.returncode == 2 and "is COMMITTED" in wrong.stderr, wrong.stderr
    acked = kafka2pc("acknowledge", *common, "--run", "other-run", "--note", "re-exported by hand", how="no-airflow")
    assert acked.returncode == 0, acked.stderr
    assert acked.stdout.startswith(f"run other-run of {prefix}: LOST acknowledged (1 lost transaction(s), 25 record(s)")
    settled = kafka2pc("resolve", *common)
    assert settled.returncode == 0, settled.stderr
    assert settled.stdout == f"prefix {prefix}: 0 committed, 0 aborted, 0 lost; 0 still open\n"
    # Clean: list and the dry run both say so by their exit status, as the README documents.
    assert kafka2pc("list", *common).returncode == 0
    assert kafka2pc("resolve", *common, "--dry-run").returncode == 0

    # describe: the decisions touching the prefix and its run records, and who owns the prefix
    described = kafka2pc("describe", *common, "--json")
    assert described.returncode == 0, described.stderr
    doc = as_json(described)
    assert doc["claim_owner"] == "dag_orders.export"
    # Both COMMITs are final: collapsed into run records. The CLI's ABORT stays until its deadlines pass.
    assert [(d["kind"], d["run"], d["actor"], d["in_force"], d["transactions"]) for d in doc["decisions"]] == [
        ("ABORT", "kafka2pc-cli", "cli", True, 2)
    ]
    assert doc["decisions"][0]["outcome"] == {"committed": 0, "aborted": 2, "lost": 0, "pending": 0}
    runs = {r["run"]: r for r in doc["runs"]}
    assert {k: (r["status"], r["transactions"], r["records"]) for k, r in runs.items()} == {
        "crashed-run": ("COMMITTED", 3, 75),
        "other-run": ("ACKNOWLEDGED", 1, 25),
    }
    assert runs["other-run"]["note"] == "re-exported by hand"
    assert [(t["transactional_id"], t["partitions"]) for t in runs["other-run"]["lost"]] == [
        (stale.transactional_id, list(stale.describe_partitions()))
    ]
    text = kafka2pc("describe", *common)
    lines = text.stdout.splitlines()
    assert lines[:2] == [
        f"prefix {prefix}: owned by export task dag_orders.export; nothing in flight (no open transaction)",
        f"1 decision(s) in force, 0 kept that rule nothing any more and 0 void touching {prefix} in decision log "
        f"{log.topic}",
    ]
    assert lines[3].split()[0] == "ABORT" and lines[3].endswith("in force (rules 2)")
    assert lines[4] == f"2 run record(s) of {prefix}:"
    assert lines[-3] == "run other-run: 1 lost transaction(s) (ACKNOWLEDGED):"

    assert list_s < 30
    recover(kafka.wire, neighbour, log)  # leave the broker clean for the next test


def test_a_broker_that_is_down_fails_fast_and_clearly(kafka: KafkaEnv) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    for command in (["list"], ["describe"], ["resolve"], ["resolve", "--dry-run"], ["acknowledge", "--run", "r"]):
        started = time.monotonic()
        proc = kafka2pc(
            *command,
            "--prefix",
            "orders",
            "--bootstrap-servers",
            dead,
            "--timeout",
            "2",
            "--config",
            "sasl.password=hunter2-secret",
            "--json",
        )
        elapsed = time.monotonic() - started
        assert proc.returncode == 3, (command, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert "Traceback" not in proc.stderr and "hunter2-secret" not in proc.stderr
        assert proc.stderr == f"kafka2pc: error: cannot reach Kafka at {dead}: {REFUSED}\n", proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr  # no client library noise
        assert elapsed < 15, (command, elapsed)


def test_the_environment_gives_the_default_bootstrap_servers(kafka: KafkaEnv) -> None:
    import os

    env = {**os.environ, "KAFKA2PC_BOOTSTRAP_SERVERS": kafka.bootstrap}
    prefix = f"cli{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [str(SCRIPT), "list", "--prefix", prefix, "--decision-topic", f"none_{prefix}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"prefix {prefix}: 0 open transaction(s)",
        f"decision topic none_{prefix} does not exist: no decisions",
    ]
    # list is read-only: it did not create the decision topic
    from confluent_kafka.admin import AdminClient

    assert f"none_{prefix}" not in AdminClient(kafka.config).list_topics(timeout=10).topics
