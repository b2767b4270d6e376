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

from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionLog
from airflow_provider_kafka2pc.txn.outcome import TxnRef
from airflow_provider_kafka2pc.txn.recovery import recover
from airflow_provider_kafka2pc.txn.resume import ref_of
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


def test_list_resolve_describe_end_to_end(kafka: KafkaEnv) -> None:
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
    stale = prepared[f"{prefix}-3"]  # a COMMIT for another epoch of the same id must not commit it
    log = DecisionLog(kafka.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")
    log.record(
        [ref_of(c) for c in decided],
        Decision.COMMIT,
        run="crashed-run",
        counts={c.transactional_id: 25 for c in decided},
    )
    log.record(
        [TxnRef(stale.transactional_id, stale.producer_id, stale.producer_epoch + 1)], Decision.COMMIT, run="other"
    )
    log.record([ref_of(prepared[f"{neighbour}-0"])], Decision.COMMIT, run="neighbour")
    log.claim_prefix(prefix, "dag_orders.export")
    common = ["--prefix", prefix, "--bootstrap-servers", kafka.bootstrap, "--decision-topic", log.topic]
    want_commit = sorted(c.transactional_id for c in decided)
    want_abort = [f"{prefix}-1", f"{prefix}-3"]

    # list: every open transaction of the prefix, its decision and what recovery would do
    started = time.monotonic()
    listed = kafka2pc("list", *common, "--json", how="no-airflow")
    list_s = time.monotonic() - started
    assert listed.returncode == 0, listed.stderr
    rows = {r["transactional_id"]: r for r in as_json(listed)["transactions"]}
    assert sorted(rows) == sorted(tids[:5])
    for tid, r in rows.items():
        c = prepared[tid]
        assert (r["state"], r["producer_id"], r["producer_epoch"]) == ("Ongoing", c.producer_id, c.producer_epoch)
        assert sorted((p["topic"], p["partition"]) for p in r["partitions"]) == sorted(c.topic_partitions)
        assert 0 <= r["age_ms"] < 600_000
        assert (r["decision"], r["action"]) == (("COMMIT", "commit") if tid in want_commit else (None, "abort"))
    assert rows[stale.transactional_id]["latest_record"]["producer_epoch"] == stale.producer_epoch + 1

    table = kafka2pc("list", *common, how="script")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"prefix {prefix}: 5 open transaction(s)"
    assert {ln.split()[0]: ln.split()[-1] for ln in lines[2:]} == {t: "commit" for t in want_commit} | {
        t: "abort" for t in want_abort
    }

    # resolve --dry-run: the plan, nothing changed
    before = log.read().latest
    dry = kafka2pc("resolve", *common, "--dry-run", "--json")
    assert dry.returncode == 1, dry.stderr  # there is something to do
    assert as_json(dry)["plan"] == {"commit": want_commit, "abort": want_abort, "wait": []}
    assert sorted(kafka.open_transactions(prefix)) == sorted(tids[:5])
    assert kafka.read_committed(topic) == []
    assert log.read().latest == before

    # resolve: commits the decided ones, aborts the rest, nothing of the prefix left open
    resolved = kafka2pc("resolve", *common, "--json")
    assert resolved.returncode == 0, resolved.stderr
    report = as_json(resolved)
    assert {r["transactional_id"]: r["outcome"] for r in report["resolutions"]} == {
        t: "committed" for t in want_commit
    } | {t: "aborted" for t in want_abort}
    assert report["still_open"] == [] and report["lost"] == []
    assert kafka.open_transactions(prefix) == []
    keys = [r.key or b"" for r in kafka.read_committed(topic)]
    assert sorted(keys) == sorted(f"{t}/{i}".encode() for t in want_commit for i in range(25))  # each once
    assert kafka.open_transactions(neighbour) == [f"{neighbour}-0"]

    again = kafka2pc("resolve", *common)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"prefix {prefix}: 0 committed, 0 aborted, 0 lost; 0 still open\n"

    # describe: the decision log's view afterwards, and who owns the prefix
    described = kafka2pc("describe", *common, "--json")
    assert described.returncode == 0, described.stderr
    doc = as_json(described)
    assert doc["claim_owner"] == "dag_orders.export"
    assert {r["transactional_id"]: (r["decision"], r["run"]) for r in doc["records"]} == {
        t: ("COMMITTED", "kafka2pc-cli") for t in want_commit
    } | {t: ("ABORTED", "kafka2pc-cli") for t in want_abort}
    text = kafka2pc("describe", *common)
    assert text.stdout.splitlines()[0] == f"prefix {prefix}: claimed by dag_orders.export"
    assert len(text.stdout.splitlines()) == 2 + 1 + 5

    assert list_s < 30
    recover(kafka.wire, neighbour, log)  # leave the broker clean for the next test


def test_a_broker_that_is_down_fails_fast_and_clearly(kafka: KafkaEnv) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    for command in (["list"], ["describe"], ["resolve"], ["resolve", "--dry-run"]):
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
        assert proc.stderr.startswith(f"kafka2pc: error: cannot reach Kafka at {dead}"), proc.stderr
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
