"""The ``kafka2pc`` command line against the in-memory broker and decision log."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc import cli
from airflow_provider_kafka2pc.cli import commands, render
from airflow_provider_kafka2pc.txn.kafka import reachability
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
from airflow_provider_kafka2pc.txn.kafka.transactions import TRANSACTIONAL_ID_AUTHORIZATION_FAILED, probe_id
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import (
    Covered,
    DecisionRecord,
    Kind,
    LostTxn,
    OutcomeRecord,
    RunRecord,
    RunStatus,
    new_decision,
    run_key,
)
from tests.helpers.no_airflow import REFUSE_AIRFLOW
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, ref, txn_state

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


class FakeConnection(cli.Connection):
    def __init__(self, broker: FakeBroker, log: MemoryDecisionLog, topic_exists: bool = True) -> None:
        super().__init__({"bootstrap.servers": "fake:9092"}, "decisions", 1.0)
        self.broker, self.log, self.topic_exists = broker, log, topic_exists
        self.configs: list[Mapping[str, Any]] = []
        self.topics: list[str] = []
        self.closed = False

    def wire(self) -> WireClient:
        return self.broker

    def decision_log(self) -> DecisionLog:
        return self.log

    def decision_topic_exists(self) -> bool:
        return self.topic_exists

    def close(self) -> None:
        self.closed = True

    def __call__(self, config: Mapping[str, Any], topic: str, timeout_s: float) -> FakeConnection:
        self.configs.append(dict(config))
        self.topics.append(topic)
        return self


@pytest.fixture(autouse=True)
def _no_network_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """check() validates the settings as it does for real; the broker it would reach is the fake."""
    monkeypatch.setattr(reachability, "check_reachable", lambda *a, **k: None)


@pytest.fixture
def cli_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> FakeClock:
    monkeypatch.setattr(commands, "time", clock)
    return clock


def run(conn: FakeConnection, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), connect=conn)
    out, err = capsys.readouterr()
    return code, out, err


def decision(
    kind: Kind,
    refs: Sequence[TxnRef],
    run: str = "run-1",
    actor: str = "commit",
    prefixes: Sequence[str] = ("orders",),
    deadline_ms: int | None = None,
) -> DecisionRecord:
    return new_decision(
        kind,
        (Covered(r.transactional_id, r.producer_id, r.producer_epoch, 10, ("events-0",), deadline_ms) for r in refs),
        run,
        actor,
        prefixes if kind is Kind.COMMIT else (),
        T0,
    )


def item(rec: DecisionRecord | OutcomeRecord | RunRecord) -> tuple[bytes, bytes]:
    return rec.key, rec.to_json()


def lost_run(
    run: str, *tids: str, prefix: str = "orders", status: RunStatus = RunStatus.LOST, note: str = ""
) -> RunRecord:
    lost = tuple(LostTxn(Covered(t, 1000, 0, 10, ("events-0",)), "the transaction was aborted") for t in tids)
    return RunRecord(prefix, run, status, 3, 30, T0, "d" * 32, lost, note)


def everything(log: MemoryDecisionLog) -> LogState:
    return log.read(keep_run=lambda _p, _r, _raw: True)


def arranged(broker: FakeBroker) -> tuple[MemoryDecisionLog, dict[str, DecisionRecord]]:
    broker.add(
        txn_state("orders-0", "Ongoing", producer_epoch=5, partitions=(0, 2)),  # a COMMIT rules it: roll forward
        txn_state("orders-1", "Ongoing", producer_epoch=5),  # its COMMIT came after the deadline (void): abort
        txn_state("orders-3", "Ongoing"),  # an ABORT rules it: abort
        txn_state("orders-10", "Ongoing"),  # undecided: abort
        txn_state("orders-2", "PrepareCommit"),  # the broker is completing it: wait
        txn_state("orders2-0", "Ongoing"),  # another exporter's
    )
    d = {
        "commit": decision(Kind.COMMIT, [ref("orders-0", producer_epoch=5)], run="run-1"),
        "late": decision(Kind.COMMIT, [ref("orders-1", producer_epoch=5)], run="run-0", deadline_ms=1),
        "abort": decision(Kind.ABORT, [ref("orders-3")], run="run-1", actor="abort"),
        "other": decision(Kind.COMMIT, [ref("orders2-0")], run="run-7", prefixes=("orders2",)),
    }
    log = MemoryDecisionLog(initial=[item(x) for x in d.values()])
    log.claim_prefix("orders", "dag.export")
    return log, d


# -- list ---------------------------------------------------------------------------------


def test_list_joins_each_open_transaction_with_the_decision_that_rules_it_and_the_planned_action(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log, d = arranged(broker)
    entries = list(log.entries)
    code, out, _ = run(FakeConnection(broker, log), capsys, "list", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OPEN
    doc = json.loads(out)
    rows = {r["transactional_id"]: r for r in doc["transactions"]}
    assert [r["transactional_id"] for r in doc["transactions"]] == [
        "orders-0",
        "orders-1",
        "orders-2",
        "orders-3",
        "orders-10",
    ]
    assert {t: (r["decision"] and r["decision"]["kind"], r["action"]) for t, r in rows.items()} == {
        "orders-0": ("COMMIT", "roll forward"),
        "orders-1": (None, "abort"),
        "orders-2": (None, "wait"),
        "orders-3": ("ABORT", "abort"),
        "orders-10": (None, "abort"),
    }
    assert rows["orders-0"]["decision"] == {
        "kind": "COMMIT",
        "decision_id": d["commit"].decision_id,
        "run": "run-1",
        "actor": "commit",
    }
    assert rows["orders-3"]["decision"]["actor"] == "abort"
    late = rows["orders-1"]["other_decision"]  # the void COMMIT explains itself
    assert late["decision_id"] == d["late"].decision_id and late["run"] == "run-0"
    assert late["void"] == "appended after the broker deadline of orders-1"
    assert rows["orders-10"]["other_decision"] is None
    assert rows["orders-0"]["partitions"] == [{"topic": "events", "partition": 0}, {"topic": "events", "partition": 2}]
    assert (rows["orders-0"]["producer_id"], rows["orders-0"]["producer_epoch"]) == (1000, 5)
    assert rows["orders-0"]["age_ms"] >= 0
    assert doc["plan"] == {
        "roll_forward": ["orders-0"],
        "abort": ["orders-1", "orders-3", "orders-10"],
        "wait": ["orders-2"],
    }
    assert doc["lost_runs"] == [] and doc["lost_decisions"] == []
    assert broker.end_txn_calls == [] and log.entries == entries


def test_list_table_is_readable(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    log, d = arranged(broker)
    code, out, _ = run(FakeConnection(broker, log), capsys, "list", "--prefix", "orders")
    assert code == cli.EXIT_OPEN
    lines = out.splitlines()
    assert lines[0] == "prefix orders: 5 open transaction(s)"
    assert lines[1].split() == [
        "TRANSACTIONAL",
        "ID",
        "STATE",
        "PRODUCER",
        "ID",
        "EPOCH",
        "PARTITIONS",
        "AGE",
        "DECISION",
        "RUN",
        "ACTOR",
        "ACTION",
    ]
    assert lines[2].split()[:5] == ["orders-0", "Ongoing", "1000", "5", "events[0,2]"]
    assert lines[2].split()[-6:] == ["COMMIT", d["commit"].decision_id[:12], "run-1", "commit", "roll", "forward"]
    short = d["late"].decision_id[:12]
    assert f"none (log: COMMIT {short} void: appended after the broker deadline of orders-1)" in lines[3]
    assert lines[4].endswith("wait (broker completing)")
    assert lines[5].split()[-5:] == ["ABORT", d["abort"].decision_id[:12], "run-1", "abort", "abort"]
    assert lines[6].split()[-4:] == ["none", "-", "-", "abort"]
    assert len(lines) == 7 and "orders2" not in out


def test_list_without_a_decision_topic_plans_to_abort_and_says_why(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"))
    log = MemoryDecisionLog(initial=[item(decision(Kind.COMMIT, [ref("orders-0")]))])
    code, out, _ = run(FakeConnection(broker, log, topic_exists=False), capsys, "list", "--prefix", "orders")
    assert code == cli.EXIT_OPEN
    assert "decision topic kafka2pc_decisions does not exist: no decisions" in out
    assert out.splitlines()[-1].split()[-4:] == ["none", "-", "-", "abort"]


@pytest.mark.parametrize("command", [["list"], ["resolve", "--dry-run"]])
def test_list_of_a_prefix_with_nothing_open_and_nothing_lost(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # Another prefix's open transaction and LOST run do not count: the exit status is this prefix's.
    broker.add(txn_state("orders2-0", "Ongoing"))
    log = MemoryDecisionLog(initial=[item(lost_run("run-1", "orders2-0", prefix="orders2"))])
    code, out, _ = run(FakeConnection(broker, log), capsys, *command, "--prefix", "orders")
    assert code == cli.EXIT_OK
    assert out.endswith("prefix orders: 0 open transaction(s)\n")
    assert broker.end_txn_calls == []


def test_list_shows_lost_runs_and_lost_transactions_of_decisions_in_flight(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    in_flight = decision(Kind.COMMIT, [ref("orders-4"), ref("orders-5")], run="run-3")
    lost_outcome = OutcomeRecord(
        in_flight.decision_id, lost=(LostTxn(in_flight.txns[0], "the transaction was aborted"),)
    )
    log = MemoryDecisionLog(
        initial=[
            item(lost_run("run-2", "orders-1")),
            item(lost_run("run-0", "orders-2", status=RunStatus.ACKNOWLEDGED)),  # acknowledged: not a loss
            item(RunRecord("orders", "run-1", RunStatus.COMMITTED, 3, 30, T0)),
            item(in_flight),
            item(lost_outcome),
        ]
    )
    broker.add(txn_state("orders-5", "CompleteCommit"))  # the broker shows the rest of run-3 committed
    conn = FakeConnection(broker, log)
    code, out, _ = run(conn, capsys, "list", "--prefix", "orders", "--json")
    assert code == cli.EXIT_LOST
    doc = json.loads(out)
    assert doc["transactions"] == []
    assert [(r["run"], r["status"]) for r in doc["lost_runs"]] == [("run-2", "LOST")]
    assert doc["lost_runs"][0]["lost"] == [
        {
            "transactional_id": "orders-1",
            "producer_id": 1000,
            "producer_epoch": 0,
            "records": 10,
            "partitions": ["events-0"],
            "reason": "the transaction was aborted",
        }
    ]
    assert [(x["decision_id"], x["run"]) for x in doc["lost_decisions"]] == [(in_flight.decision_id, "run-3")]
    assert [t["transactional_id"] for t in doc["lost_decisions"][0]["lost"]] == ["orders-4"]
    [run_3] = doc["lost_decisions"]
    assert (run_3["transactions"], run_3["visible_transactions"], run_3["lost_transactions"]) == (2, 1, 1)
    assert run_3["partly_visible"] and not run_3["final"]
    assert [(x["run"], x["final"]) for x in doc["losses"]] == [("run-2", True), ("run-3", False)]

    code, out, _ = run(conn, capsys, "list", "--prefix", "orders")
    assert code == cli.EXIT_LOST
    lines = out.splitlines()
    assert lines[1] == (
        "PARTLY VISIBLE: run run-2 of exporter orders: 2 of 3 transaction(s) visible (20 of 30 records), 1 lost "
        "(10 records) (its run record)"
    )
    assert lines[3].split()[:5] == ["orders-1", "1000", "0", "10", "events-0"]
    assert lines[4].endswith("then: kafka2pc acknowledge --prefix orders --run run-2")
    assert lines[5].startswith("PARTLY VISIBLE: run run-3 of exporter orders: 1 of 2 transaction(s) visible")
    assert lines[5].endswith(f"(COMMIT {in_flight.decision_id}, counted on the broker)")
    assert lines[7].split()[0] == "orders-4"


# -- describe -----------------------------------------------------------------------------


def test_describe_shows_decisions_touching_the_prefix_and_every_run_record_of_it(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log, d = arranged(broker)
    log.append(
        [
            item(OutcomeRecord(d["abort"].decision_id, aborted=frozenset({"orders-3"}))),
            item(RunRecord("orders", "run-9", RunStatus.COMMITTED, 3, 30, T0, "c" * 32)),
            item(lost_run("run-8", "orders-4")),
            item(lost_run("run-7", "orders-5", status=RunStatus.ACKNOWLEDGED, note="re-exported, ticket 42")),
            item(RunRecord("orders2", "run-1", RunStatus.COMMITTED, 1, 1, 0)),
        ]
    )
    conn = FakeConnection(broker, log)
    code, out, _ = run(conn, capsys, "describe", "--prefix", "orders", "--json")
    assert code == cli.EXIT_LOST  # run-8 is LOST and not acknowledged
    doc = json.loads(out)
    assert [(x["run"], x["final"]) for x in doc["losses"]] == [("run-8", True)]
    assert doc["claim_owner"] == "dag.export"
    got = {x["decision_id"]: x for x in doc["decisions"]}
    assert list(got) == [d["commit"].decision_id, d["late"].decision_id, d["abort"].decision_id]
    commit = got[d["commit"].decision_id]
    assert (commit["kind"], commit["run"], commit["actor"], commit["in_force"]) == ("COMMIT", "run-1", "commit", True)
    assert (commit["transactions"], commit["records"], commit["time"]) == (1, 10, "2023-11-14T22:13:20Z")
    assert commit["outcome"] == {"committed": 0, "aborted": 0, "lost": 0, "pending": 1}
    late = got[d["late"].decision_id]
    assert late["in_force"] is False and late["void"] == "appended after the broker deadline of orders-1"
    assert got[d["abort"].decision_id]["outcome"] == {"committed": 0, "aborted": 1, "lost": 0, "pending": 0}
    assert [(r["run"], r["status"], r["transactions"], r["records"]) for r in doc["runs"]] == [
        ("run-7", "ACKNOWLEDGED", 3, 30),
        ("run-8", "LOST", 3, 30),
        ("run-9", "COMMITTED", 3, 30),
    ]
    assert doc["runs"][0]["note"] == "re-exported, ticket 42"
    assert doc["runs"][1]["lost"][0]["transactional_id"] == "orders-4"
    assert doc["runs"][2]["time"] == "2023-11-14T22:13:20Z" and doc["runs"][2]["lost"] == []

    code, out, _ = run(conn, capsys, "describe", "--prefix", "orders")
    lines = out.splitlines()
    assert lines[:2] == [
        "prefix orders: owned by export task dag.export; 5 open transaction(s)",
        "2 decision(s) in force, 0 kept that rule nothing any more and 1 void touching orders in decision log "
        "kafka2pc_decisions",
    ]
    assert lines[2].split() == [
        "KIND",
        "DECISION",
        "ID",
        "RUN",
        "ACTOR",
        "TIME",
        "TXNS",
        "COMMITTED",
        "ABORTED",
        "LOST",
        "PENDING",
        "STATUS",
    ]
    assert lines[3].split() == [
        "COMMIT",
        d["commit"].decision_id,
        "run-1",
        "commit",
        "2023-11-14T22:13:20Z",
        "1",
        "0",
        "0",
        "0",
        "1",
        "in",
        "force",
        "(rules",
        "1)",
    ]
    assert lines[4].endswith("void: appended after the broker deadline of orders-1")
    assert lines[6] == "3 run record(s) of orders:"
    assert lines[8].split() == [
        "run-7",
        "ACKNOWLEDGED",
        "3",
        "30",
        "2023-11-14T22:13:20Z",
        "re-exported,",
        "ticket",
        "42",
    ]
    assert lines[10].split() == ["run-9", "COMMITTED", "3", "30", "2023-11-14T22:13:20Z", "-"]
    assert lines[11] == "run run-7: 1 lost transaction(s) (ACKNOWLEDGED):"
    assert lines[13].split()[0] == "orders-5"
    assert lines[14].startswith("PARTLY VISIBLE: run run-8 of exporter orders: 2 of 3 transaction(s) visible")
    assert lines[16].split()[0] == "orders-4"
    assert lines[17].endswith("then: kafka2pc acknowledge --prefix orders --run run-8")
    assert "orders2" not in out
    assert broker.end_txn_calls == []


def test_describe_of_an_unclaimed_prefix_without_decisions(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        FakeConnection(broker, MemoryDecisionLog(), topic_exists=False), capsys, "describe", "--prefix", "x"
    )
    assert code == cli.EXIT_OK
    assert out.splitlines() == [
        "prefix x: no export task has claimed it yet; nothing in flight (no open transaction)",
        "decision topic kafka2pc_decisions does not exist: no decisions",
    ]


# -- resolve ------------------------------------------------------------------------------


def test_resolve_dry_run_prints_the_plan_and_changes_nothing(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log, _ = arranged(broker)
    entries = list(log.entries)
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--dry-run", "--json")
    assert code == cli.EXIT_OPEN  # there is something to do
    doc = json.loads(out)
    assert doc["dry_run"] is True
    assert doc["plan"] == {
        "roll_forward": ["orders-0"],
        "abort": ["orders-1", "orders-3", "orders-10"],
        "wait": ["orders-2"],
    }
    assert broker.end_txn_calls == [] and log.entries == entries

    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--dry-run")
    assert out.startswith("dry run: nothing is changed\n")
    assert log.entries == entries


def test_resolve_rolls_forward_what_a_commit_rules_aborts_the_rest_and_waits_for_the_broker(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log, d = arranged(broker)

    class Completing(FakeClock):
        def sleep(self, seconds: float) -> None:  # the broker finishes its PrepareCommit meanwhile
            super().sleep(seconds)
            broker.set_state("orders-2", "CompleteCommit")

    monkeypatch.setattr(commands, "time", Completing())
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OK
    doc = json.loads(out)
    assert doc["passes"] == 2 and doc["still_open"] == [] and doc["lost"] == [] and doc["lost_runs"] == []
    assert [(r["transactional_id"], r["action"], r["outcome"]) for r in doc["resolutions"]] == [
        ("orders-0", "roll forward", "committed"),
        ("orders-1", "abort", "aborted"),
        ("orders-3", "abort", "aborted"),
        ("orders-10", "abort", "aborted"),
    ]
    assert broker.commits_sent() == ["orders-0"]
    assert sorted(broker.aborts_sent()) == ["orders-1", "orders-10", "orders-3"]
    assert broker.state_of("orders2-0") == "Ongoing"
    # The undecided ones were decided ABORT first, under the CLI's name; the run's COMMIT collapsed
    # into its run record once final.
    mine = log.decisions_of("orders-10")
    assert [(x.kind, x.run, x.actor) for x in mine] == [(Kind.ABORT, "kafka2pc-cli", "cli")]
    assert {c.transactional_id for c in mine[0].txns} == {"orders-1", "orders-10"}
    state = everything(log)
    assert state.runs[("orders", "run-1")].status is RunStatus.COMMITTED
    assert d["commit"].decision_id not in state.decisions

    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders")
    assert code == cli.EXIT_OK
    assert out == "prefix orders: 0 committed, 0 aborted, 0 lost; 0 still open\n"


def test_resolve_table_and_a_transaction_the_broker_never_completes(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"), txn_state("orders-1", "PrepareAbort"))
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, out, _ = run(conn, capsys, "resolve", "--prefix", "orders", "--wait", "2", "--run", "manual")
    assert code == cli.EXIT_OPEN
    lines = out.splitlines()
    assert lines[0] == "prefix orders: 0 committed, 1 aborted, 0 lost; 1 still open"
    assert lines[2].split()[:5] == ["orders-0", "1000", "0", "abort", "aborted"]
    assert lines[-1] == "still open: orders-1 (PrepareAbort)"
    assert 2 <= sum(cli_clock.sleeps) < 3  # waited --wait, in fake time
    assert [(x.run, x.actor) for x in conn.log.decisions_of("orders-0")] == [("manual", "cli")]


def test_resolve_reports_a_loss_and_acknowledge_lets_recovery_pass_it(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    ongoing = txn_state("orders-0", "Ongoing", partitions=(3,))
    broker.add(ongoing, txn_state("orders-1", "PrepareCommit"))
    # Listed and planned while Ongoing; aborted by the broker before the roll-forward gets there.
    broker.upcoming_states["orders-0"] = [ongoing, txn_state("orders-0", "CompleteAbort")]
    log = MemoryDecisionLog(initial=[item(decision(Kind.COMMIT, [ref("orders-0")], run="dag/run-5"))])
    conn = FakeConnection(broker, log)
    code, out, _ = run(conn, capsys, "resolve", "--prefix", "orders", "--json")
    assert code == cli.EXIT_LOST
    doc = json.loads(out)
    assert doc["passes"] == 1  # a loss is not waited out, even with something still completing
    assert doc["lost"] == [
        {
            "transactional_id": "orders-0",
            "producer_id": 1000,
            "producer_epoch": 0,
            "records": 10,
            "partitions": ["events-0"],
            "reason": "the transaction was aborted",
        }
    ]
    assert [(r["run"], r["status"]) for r in doc["lost_runs"]] == [("dag/run-5", "LOST")]
    assert cli_clock.sleeps == []
    was = everything(log).runs[("orders", "dag/run-5")]
    assert was.status is RunStatus.LOST

    # Every later pass fails on the recorded loss, in words an operator can act on.
    broker.set_state("orders-1", "CompleteCommit")
    code, out, _ = run(conn, capsys, "resolve", "--prefix", "orders")
    assert code == cli.EXIT_LOST
    lines = out.splitlines()
    assert lines[0] == "prefix orders: 0 committed, 0 aborted, 1 lost; 0 still open"
    assert lines[1] == (
        "LOST: run dag/run-5 of exporter orders: 0 of 1 transaction(s) visible (0 of 10 records), 1 lost (10 records) "
        "(its run record)"
    )
    assert lines[3].split()[:5] == ["orders-0", "1000", "0", "10", "events-0"]
    assert lines[-1] == (
        "  repair it: clear the run's export task, or `kafka2pc repair --prefix orders --run dag/run-5 --source "
        "MODULE:NAME`; if its source changed, re-export the missing part another way, then: kafka2pc acknowledge "
        "--prefix orders --run dag/run-5"
    )
    assert run(conn, capsys, "list", "--prefix", "orders")[0] == cli.EXIT_LOST

    code, out, _ = run(conn, capsys, "acknowledge", "--prefix", "orders", "--run", "dag/run-5", "--note", "ticket 42")
    assert code == cli.EXIT_OK
    assert out == (
        "run dag/run-5 of orders: LOST acknowledged (1 lost transaction(s), 10 record(s) that stay lost); "
        "recovery no longer fails on it\n"
    )
    acked = everything(log).runs[("orders", "dag/run-5")]
    assert acked.status is RunStatus.ACKNOWLEDGED and acked.note == "ticket 42"
    # The same counts and lost list, under the new status.
    assert (acked.transactions, acked.records, acked.decision_id) == (1, 10, was.decision_id)
    assert acked.lost == was.lost and [t.covered.transactional_id for t in acked.lost] == ["orders-0"]
    assert log.entries[-1].key == run_key("orders", "dag/run-5")

    assert run(conn, capsys, "resolve", "--prefix", "orders")[0] == cli.EXIT_OK
    assert run(conn, capsys, "list", "--prefix", "orders")[0] == cli.EXIT_OK


def test_resolve_reports_each_epoch_of_an_id_on_its_own(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """The open epoch is aborted; a COMMIT for an epoch the broker never saw is lost: two rows, one id."""
    broker.add(txn_state("orders-0", "Ongoing"))
    log = MemoryDecisionLog(initial=[item(decision(Kind.COMMIT, [ref("orders-0", producer_epoch=1)], run="r"))])
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--json")
    assert code == cli.EXIT_LOST
    doc = json.loads(out)
    assert [(r["producer_epoch"], r["action"], r["outcome"]) for r in doc["resolutions"]] == [
        (0, "abort", "aborted"),
        (1, "roll forward", "lost"),
    ]
    assert [(t["transactional_id"], t["producer_epoch"]) for t in doc["lost"]] == [("orders-0", 1)]
    assert broker.aborts_sent() == ["orders-0"] and broker.commits_sent() == []


def test_acknowledge_json(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    log = MemoryDecisionLog(initial=[item(lost_run("run-2", "orders-1", "orders-2"))])
    code, out, _ = run(
        FakeConnection(broker, log), capsys, "acknowledge", "--prefix", "orders", "--run", "run-2", "--json"
    )
    assert code == cli.EXIT_OK
    doc = json.loads(out)
    assert (doc["previous_status"], doc["status"], doc["note"], doc["offset"]) == ("LOST", "ACKNOWLEDGED", "", 1)
    assert [t["transactional_id"] for t in doc["lost"]] == ["orders-1", "orders-2"]
    assert (doc["transactions"], doc["records"], doc["decision_id"]) == (3, 30, "d" * 32)


@pytest.mark.parametrize(
    ("initial", "message"),
    [
        ([], "run 'run-2' of prefix 'orders' has no run record in decision log kafka2pc_decisions"),
        ([lost_run("run-2", prefix="orders2")], "has no run record"),
        ([RunRecord("orders", "run-2", RunStatus.COMMITTED, 3, 30, T0)], "run 'run-2' of prefix 'orders' is COMMITTED"),
        ([lost_run("run-2", "orders-1", status=RunStatus.ACKNOWLEDGED)], "is ACKNOWLEDGED"),
    ],
)
def test_acknowledge_refuses_a_run_that_is_not_lost(
    initial: list[RunRecord], message: str, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log = MemoryDecisionLog(initial=[item(r) for r in initial])
    entries = list(log.entries)
    code, out, err = run(FakeConnection(broker, log), capsys, "acknowledge", "--prefix", "orders", "--run", "run-2")
    assert code == cli.EXIT_USAGE and out == ""
    assert message in err and "only a LOST run can be acknowledged" in err and "Traceback" not in err
    assert log.entries == entries


def test_acknowledge_without_a_decision_topic_creates_nothing(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = FakeConnection(broker, MemoryDecisionLog(), topic_exists=False)
    code, _, err = run(conn, capsys, "acknowledge", "--prefix", "orders", "--run", "r", "--decision-topic", "typo")
    assert code == cli.EXIT_USAGE
    assert "decision topic 'typo' does not exist" in err
    assert conn.log.entries == []


def test_acknowledge_needs_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["acknowledge", "--prefix", "orders"])
    assert e.value.code == cli.EXIT_USAGE
    assert "--run" in capsys.readouterr().err


def test_resolve_refuses_a_missing_decision_topic_unless_told(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"))
    conn = FakeConnection(broker, MemoryDecisionLog(), topic_exists=False)
    code, out, err = run(conn, capsys, "resolve", "--prefix", "orders", "--decision-topic", "typo")
    assert code == cli.EXIT_USAGE and out == ""
    assert "decision topic 'typo' does not exist" in err and "Traceback" not in err
    assert broker.end_txn_calls == []
    code, _, _ = run(conn, capsys, "resolve", "--prefix", "orders", "--allow-missing-decision-topic")
    assert code == cli.EXIT_OK and broker.aborts_sent() == ["orders-0"]


# -- input, errors, secrets ---------------------------------------------------------------


def test_an_invalid_prefix_is_refused_before_connecting(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, out, err = run(conn, capsys, "list", "--prefix", "orders-eu")
    assert code == cli.EXIT_USAGE and out == ""
    assert err.startswith("kafka2pc: error: invalid transactional id prefix 'orders-eu'")
    assert conn.configs == []


def test_prefix_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["describe"])
    assert e.value.code == cli.EXIT_USAGE
    assert "--prefix" in capsys.readouterr().err


COMMON = [
    "--prefix",
    "orders",
    "--bootstrap-servers",
    "h:1",
    "--config",
    "a=1",
    "--config-file",
    "f.properties",
    "--decision-topic",
    "d",
    "--timeout",
    "3",
    "--json",
    "--debug",
]


@pytest.mark.parametrize("split", [0, len(COMMON), 6, 13], ids=["after", "before", "split", "debug-after"])
def test_the_common_options_mean_the_same_before_and_after_the_command(split: int) -> None:
    """argparse copies a command's defaults over what was parsed before the command: none may reset
    an option given there (``kafka2pc --debug list`` is debug=True)."""
    args = vars(commands.parse_args([*COMMON[:split], "list", *COMMON[split:]]))
    assert args == {
        "command": "list",
        "prefix": "orders",
        "conn_id": None,
        "bootstrap_servers": "h:1",
        "config": ["a=1"],
        "config_file": ["f.properties"],
        "decision_topic": "d",
        "timeout": 3.0,
        "json": True,
        "debug": True,
    }


def test_defaults_and_repeatable_options_on_both_sides_of_the_command() -> None:
    args = commands.parse_args(["--config", "a=1", "resolve", "--config", "b=2", "--prefix", "p", "--dry-run"])
    assert args.config == ["a=1", "b=2"] and args.config_file == []  # before first, then after
    # --timeout unset: the connection's connect timeout, else reachability.DEFAULT_CONNECT_TIMEOUT_S
    assert (args.debug, args.json, args.timeout, args.wait, args.dry_run) == (False, False, None, 10.0, True)
    assert commands.parse_args(["--prefix", "a", "describe", "--prefix", "b"]).prefix == "b"  # after wins


def test_debug_before_the_command_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(config: Mapping[str, Any], topic: str, timeout_s: float) -> cli.Connection:
        raise RuntimeError("boom")

    assert cli.main(["--debug", "list", "--prefix", "o"], connect=broken) == cli.EXIT_FAILED
    assert "Traceback" in capsys.readouterr().err


def test_config_settings_and_files_reach_the_clients(
    tmp_path: Path, broker: FakeBroker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cli.ENV_BOOTSTRAP, "env-host:9093")
    f = tmp_path / "client.properties"
    f.write_text("# secrets stay off the command line\nsasl.password=s3cret=with=equals\n\nsasl.username=u\n")
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, _, _ = run(
        conn, capsys, "describe", "--prefix", "o", "--config-file", str(f), "--config", "security.protocol=SASL_SSL"
    )
    assert code == cli.EXIT_OK
    assert conn.configs == [
        {
            "bootstrap.servers": "env-host:9093",
            "sasl.password": "s3cret=with=equals",
            "sasl.username": "u",
            "security.protocol": "SASL_SSL",
        }
    ]


AIRFLOW_CONN = {
    "conn_type": "kafka2pc",
    "host": "b1:9093,b2:9093",
    "login": "exporter",
    "password": "pw-from-airflow",
    "extra": {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "decision_topic": "team_decisions",
        "config": {"ssl.ca.location": "/etc/kafka/ca.pem"},
    },
}


def test_conn_id_takes_settings_and_decision_topic_from_the_airflow_connection_as_the_tasks_do(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps(AIRFLOW_CONN))
    monkeypatch.setenv(cli.ENV_BOOTSTRAP, "env-host:9093")  # the connection wins over the environment
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, _, _ = run(conn, capsys, "describe", "--prefix", "o", "--conn-id", "kafka2pc_default", "--json")
    assert code == cli.EXIT_OK
    expected = {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "exporter",
        "sasl.password": "pw-from-airflow",
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }
    assert conn.configs == [expected] and conn.topics == ["team_decisions"]
    assert Kafka2PCHook("kafka2pc_default").get_config() == expected  # one mapping for tasks and CLI

    # --config and --decision-topic still apply on top of the connection.
    argv = ["--conn-id", "kafka2pc_default", "--config", "ssl.ca.location=/tmp/ca.pem", "--decision-topic", "d2"]
    code, out, _ = run(conn, capsys, "describe", "--prefix", "o", "--json", *argv)
    assert code == cli.EXIT_OK
    assert conn.configs[-1] == expected | {"ssl.ca.location": "/tmp/ca.pem"} and conn.topics[-1] == "d2"
    assert json.loads(out)["decision_topic"] == "d2"


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        (None, "no Airflow connection 'kafka2pc_default'"),
        (AIRFLOW_CONN | {"extra": {"security.protocol": "SSL"}}, "unknown extra field(s) ['security.protocol']"),
        (AIRFLOW_CONN | {"extra": {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}}, "sasl.mechanism"),
    ],
)
def test_a_missing_or_mistaken_airflow_connection_is_a_usage_error_naming_it(
    conn: dict[str, Any] | None,
    message: str,
    broker: FakeBroker,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", raising=False)
    if conn is not None:
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps(conn))
    fake = FakeConnection(broker, MemoryDecisionLog())
    code, out, err = run(fake, capsys, "list", "--prefix", "o", "--conn-id", "kafka2pc_default")
    assert code == cli.EXIT_USAGE and out == "" and fake.configs == []
    assert message in err and "pw-from-airflow" not in err


def test_conn_id_looks_where_airflow_connections_get_looks_and_says_where_it_looked(
    tmp_path: Path, broker: FakeBroker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Airflow configured, the lookup is ``airflow connections get``'s (environment, secrets
    backend, metadata database): here a stand-in for the database holds the connection."""
    from airflow.models.connection import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    def from_secrets(conn_id: str) -> Connection:
        if conn_id != "made_in_the_ui":
            raise AirflowNotFoundException(conn_id)
        return Connection(conn_id=conn_id, conn_type="kafka2pc", host="db-host:9093", extra='{"decision_topic": "t"}')

    monkeypatch.setattr(Connection, "get_connection_from_secrets", staticmethod(from_secrets))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_CONN_MISSING", raising=False)
    fake = FakeConnection(broker, MemoryDecisionLog())
    assert run(fake, capsys, "describe", "--prefix", "o", "--conn-id", "made_in_the_ui")[0] == cli.EXIT_OK
    assert fake.configs == [{"bootstrap.servers": "db-host:9093"}] and fake.topics == ["t"]

    code, out, err = run(fake, capsys, "list", "--prefix", "o", "--conn-id", "missing")
    assert code == cli.EXIT_USAGE and out == ""
    assert err == (
        "kafka2pc: error: no Airflow connection 'missing': looked where `airflow connections get missing` looks: "
        f"the environment variable AIRFLOW_CONN_MISSING, the metadata database of AIRFLOW_HOME={tmp_path} "
        "(no secrets backend is configured)\n"
    )
    monkeypatch.setenv("AIRFLOW__SECRETS__BACKEND", "vault.VaultBackend")  # named, never its kwargs
    code, _, err = run(fake, capsys, "list", "--prefix", "o", "--conn-id", "missing")
    assert "AIRFLOW_CONN_MISSING, the secrets backend vault.VaultBackend, the metadata database of" in err


def test_without_airflow_configured_conn_id_reads_no_database_and_says_so(
    tmp_path: Path, broker: FakeBroker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No AIRFLOW_HOME, no database setting, no ~/airflow/airflow.cfg: the Task SDK's lookup
    (environment, secrets backend), and nothing made in ~/airflow for it."""
    from airflow.models.connection import Connection

    monkeypatch.setattr(Connection, "get_connection_from_secrets", lambda *a: pytest.fail("database read"))
    monkeypatch.delenv("AIRFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_CONN_MISSING", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_IN_ENV", json.dumps({"conn_type": "kafka2pc", "host": "env-host:9093"}))
    fake = FakeConnection(broker, MemoryDecisionLog())
    assert run(fake, capsys, "describe", "--prefix", "o", "--conn-id", "in_env")[0] == cli.EXIT_OK
    assert fake.configs == [{"bootstrap.servers": "env-host:9093"}]

    code, _, err = run(fake, capsys, "list", "--prefix", "o", "--conn-id", "missing")
    assert code == cli.EXIT_USAGE
    assert err == (
        "kafka2pc: error: no Airflow connection 'missing': looked in the environment variable AIRFLOW_CONN_MISSING "
        "(no secrets backend is configured); not in a metadata database: Airflow is not configured in this shell "
        "(set AIRFLOW_HOME to the home whose database holds it)\n"
    )
    assert not (tmp_path / "airflow" / "airflow.db").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "hunter2"], "--config #1: expected KEY=VALUE"),
        (["--config", "=hunter2"], "--config #1: expected KEY=VALUE"),
        (["--config", "bootstrap.servers=h:1"], "with --bootstrap-servers"),
        (["--conn-id", "kafka2pc_default", "--bootstrap-servers", "h:1"], "either --conn-id or --bootstrap-servers"),
        (["--config-file", "/nonexistent/kafka2pc.properties"], "cannot read --config-file"),
    ],
)
def test_bad_config_is_a_usage_error_that_never_echoes_the_value(
    argv: list[str], message: str, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(FakeConnection(broker, MemoryDecisionLog()), capsys, "list", "--prefix", "o", *argv)
    assert code == cli.EXIT_USAGE and out == ""
    assert message in err and "hunter2" not in err


def test_errors_are_one_line_and_never_show_a_secret(capsys: pytest.CaptureFixture[str]) -> None:
    def down(config: Mapping[str, Any], topic: str, timeout_s: float) -> cli.Connection:
        raise BrokerUnavailableError(f"cannot reach Kafka (tried with {config['sasl.password']})")

    code = cli.main(["list", "--prefix", "o", "--config", "sasl.password=hunter2"], connect=down)
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED
    assert err == "kafka2pc: error: cannot reach Kafka (tried with ***)\n"


def test_an_unexpected_error_has_no_traceback_unless_debug(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(config: Mapping[str, Any], topic: str, timeout_s: float) -> cli.Connection:
        logging.getLogger("airflow_provider_kafka2pc.txn").warning("password is %s", config["sasl.password"])
        raise RuntimeError(f"boom {config['sasl.password']}")

    argv = ["list", "--prefix", "o", "--config", "sasl.password=hunter2"]
    assert cli.main(argv, connect=broken) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hunter2" not in err
    assert "kafka2pc: error: RuntimeError: boom *** (--debug shows the traceback)" in err
    assert "password is ***" in err

    assert cli.main([*argv, "--debug"], connect=broken) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" in err and "hunter2" not in err


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (999, "0s"), (59_000, "59s"), (61_000, "1m01s"), (7_260_000, "2h01m"), (90_000_000, "1d01h")],
)
def test_durations(ms: int | None, text: str) -> None:
    assert render.duration(ms) == text


def test_the_cli_never_imports_airflow() -> None:
    """Import, parse, validate and connect (to nothing) with every airflow import refused."""
    script = REFUSE_AIRFLOW + textwrap.dedent(
        """
        from airflow_provider_kafka2pc import cli
        assert cli.main(["list", "--prefix", "bad-prefix"]) == cli.EXIT_USAGE
        code = cli.main(["resolve", "--prefix", "p", "--bootstrap-servers", "127.0.0.1:9", "--timeout", "1"])
        assert code == cli.EXIT_FAILED, code
        assert "confluent_kafka" in sys.modules  # the Kafka client was really reached
        loaded = [m for m in sys.modules if m == "airflow" or m.startswith("airflow.")]
        assert loaded == [], loaded
        assert cli.main(["list", "--prefix", "p", "--conn-id", "kafka2pc_default"]) == cli.EXIT_USAGE
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "cannot reach Kafka at 127.0.0.1:9" in proc.stderr
    assert "--conn-id needs Apache Airflow installed" in proc.stderr


# -- what this principal may not see is never "nothing there" ------------------------------


class HiddenTopic(FakeConnection):
    def decision_topic_exists(self) -> bool:
        raise KafkaAuthorizationError("User:ops", "Topic", "kafka2pc_decisions", "Describe", bootstrap="b1:9092")


@pytest.mark.parametrize("command", [["list"], ["describe"], ["resolve", "--dry-run"], ["resolve"]])
def test_a_decision_topic_the_principal_may_not_see_is_a_permission_error_and_nothing_is_aborted(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"))  # ruled by a COMMIT the principal cannot read
    code, out, err = run(HiddenTopic(broker, MemoryDecisionLog()), capsys, *command, "--prefix", "orders")
    assert code == cli.EXIT_FAILED
    assert "principal User:ops may not Describe Topic 'kafka2pc_decisions'" in err
    assert "no decisions" not in out
    assert broker.end_txn_calls == [] and broker.state_of("orders-0") == "Ongoing"


@pytest.mark.parametrize("command", [["list"], ["resolve", "--dry-run"], ["resolve"]])
def test_transactions_the_principal_may_not_describe_are_a_permission_error_not_zero_open(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    broker.describe_errors[probe_id("orders")] = [TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
    code, out, err = run(FakeConnection(broker, MemoryDecisionLog()), capsys, *command, "--prefix", "orders")
    assert code == cli.EXIT_FAILED
    assert "may not Describe TransactionalId 'orders' (prefix)" in err
    assert "--transactional-id orders --resource-pattern-type prefixed" in err
    assert "0 open transaction(s)" not in out
    assert broker.end_txn_calls == []


def test_turning_certificate_verification_off_is_a_usage_error_and_kafka_is_not_contacted(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    class Checked(FakeConnection):
        def __call__(self, config: Mapping[str, Any], topic: str, timeout_s: float) -> FakeConnection:
            self.config = dict(config)  # check() looks at the settings given, as the real one does
            return super().__call__(config, topic, timeout_s)

    conn = Checked(broker, MemoryDecisionLog())
    code, _, err = run(
        conn, capsys, "list", "--prefix", "orders",
        "--config", "security.protocol=SSL", "--config", "enable.ssl.certificate.verification=false",
    )  # fmt: skip
    assert code == cli.EXIT_USAGE, err
    assert "enable.ssl.certificate.verification" in err
    assert broker.describe_calls == []


def test_describe_never_calls_an_abort_that_rules_nothing_in_force(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    commit = decision(Kind.COMMIT, [ref("orders-0")])
    late_abort = decision(Kind.ABORT, [ref("orders-0")], actor="abort")  # the abort task after the commit
    log = MemoryDecisionLog(initial=[item(commit), item(late_abort)])
    broker.add(txn_state("orders-0", "CompleteCommit"))
    code, out, _ = run(FakeConnection(broker, log), capsys, "describe", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OK
    rules = {d["kind"]: (d["in_force"], d["rules"]) for d in json.loads(out)["decisions"]}
    assert rules == {"COMMIT": (True, 1), "ABORT": (True, 0)}
    code, out, _ = run(FakeConnection(broker, log), capsys, "describe", "--prefix", "orders")
    lines = out.splitlines()
    assert lines[0] == "prefix orders: no export task has claimed it yet; nothing in flight (no open transaction)"
    assert lines[1].startswith("1 decision(s) in force, 1 kept that rule nothing any more and 0 void")
    assert lines[-1].endswith("kept, rules nothing (an earlier decision rules its transactions)")
