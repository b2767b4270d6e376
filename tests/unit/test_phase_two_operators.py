"""The operators on leases and the run-level protocol, without a scheduler or a broker.

Each test builds the task in a DAG, hands ``execute``/``poke`` a context with a fake task
instance (XCom in a dict) and replaces the hook's Kafka clients with the fakes.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import pendulum
import pytest
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.exceptions import PoolingNeedsOneActiveRunError
from airflow_provider_kafka2pc.hooks import kafka2pc as hook_module
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators import export as export_module
from airflow_provider_kafka2pc.operators.commit import Kafka2PCAbortOperator, Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY, ExportPayload
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor
from airflow_provider_kafka2pc.triggers.recovery import Kafka2PCRecoveryTrigger
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import (
    ForeignCommittableError,
    LostTransaction,
    MalformedCommittableError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.protocol.records import Lease
from airflow_provider_kafka2pc.txn.two_phase import prepare_session
from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession
from tests.unit.fakes import FakeBroker, FakeClients, FakeClock, MemoryDecisionLog, committable

DAG_ID = "export_orders"
RUN_ID = "scheduled__2026-01-02T00:00:00+00:00"
OTHER_RUN = "backfill__2026-01-01T00:00:00+00:00"
HOLDER = Lease("orders", DAG_ID, OTHER_RUN, 1)


class FakeTI:
    def __init__(self, xcoms: dict[tuple[str, str], Any] | None = None) -> None:
        self.xcoms = dict(xcoms or {})
        self.pushed: dict[str, Any] = {}

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def make_dag(max_active_runs: int = 1) -> Any:
    from airflow.sdk import DAG

    return DAG(
        DAG_ID, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), max_active_runs=max_active_runs
    )


def context(dag: Any, ti: FakeTI | None = None) -> Any:
    return {"dag": dag, "run_id": RUN_ID, "ti": ti or FakeTI()}


def payload(prefix: str = "orders", *tids: str, strategy: str = "POOLING", conn: str = "kafka2pc_default") -> Any:
    run_key = naming.sanitize_run_key(RUN_ID) if strategy == "INCREMENTING" else None
    return ExportPayload(conn, prefix, strategy, run_key, "EXACTLY_ONCE", tuple(committable(t) for t in tids)).to_xcom()


def legacy_payload(prefix: str, *tids: str, strategy: str = "POOLING") -> Any:
    """Version 1, a list of whole committables: it can name any id, so the commit must check them."""
    run_key = naming.sanitize_run_key(RUN_ID) if strategy == "INCREMENTING" else None
    return {
        "version": 1,
        "conn_id": "kafka2pc_default",
        "prefix": prefix,
        "naming_strategy": strategy,
        "run_key": run_key,
        "delivery_guarantee": "EXACTLY_ONCE",
        "committables": [committable(t).to_dict() for t in tids],
        "summary": {},
    }


@pytest.fixture
def no_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Kafka client, decision log or turn the hook would hand out fails the test."""

    def refuse(name: str) -> Any:
        def call(self: Kafka2PCHook, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"Kafka2PCHook.{name} must not be reached")

        return call

    for name in ("wire_client", "decision_log", "clients", "take_turn", "recover"):
        monkeypatch.setattr(Kafka2PCHook, name, refuse(name))


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[tuple[FakeBroker, MemoryDecisionLog]]:
    """The hook's clients are one fake broker and one in-memory decision log."""
    events: list[str] = []
    broker, log = FakeBroker(events), MemoryDecisionLog(events)
    broker.topics = lambda: {"events"}  # type: ignore[method-assign]
    monkeypatch.setattr(Kafka2PCHook, "wire_client", lambda self, *a, **k: broker)
    monkeypatch.setattr(Kafka2PCHook, "decision_log", lambda self: log)
    monkeypatch.setattr(Kafka2PCHook, "clients", lambda self: FakeClients(broker, log))
    # The export's ACL check asks a real broker; these tests are about the decision protocol.
    monkeypatch.setattr(prepare_session, "check_topic_access", lambda *a, **k: None)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": "b:9092"}))
    yield broker, log


class Turns:
    """A fake ``Kafka2PCHook.take_turn``: answers from a script, records the questions."""

    def __init__(self, *answers: Lease | None) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str, str]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Turns:
        def take_turn(hook: Kafka2PCHook, prefix: str, dag_id: str, run_id: str) -> Lease | None:
            self.calls.append((prefix, dag_id, run_id))
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

        def session_take_turn(session: PrepareSession, dag_id: str, run_id: str) -> Lease | None:
            return take_turn(Kafka2PCHook(), session.prefix, dag_id, run_id)

        monkeypatch.setattr(Kafka2PCHook, "take_turn", take_turn)
        monkeypatch.setattr(hook_module, "take_turn", session_take_turn)
        return self


class _Result:
    def __init__(self, done: bool) -> None:
        self.done = done

    def describe(self) -> str:
        return f"done={self.done}"


# --- recovery sensor: POOLING runs wait their turn -------------------------------------------------


def sensor(strategy: str = "POOLING") -> tuple[Any, Kafka2PCRecoverySensor]:
    with make_dag() as dag:
        s = Kafka2PCRecoverySensor(
            task_id="recover", transactional_id_prefix="orders", naming_strategy=strategy, deferrable=False
        )
    return dag, s


def test_pooling_sensor_waits_while_another_run_holds_the_ids(
    monkeypatch: pytest.MonkeyPatch, no_kafka: None, capsys: pytest.CaptureFixture[str]
) -> None:
    turns = Turns(HOLDER).install(monkeypatch)
    dag, s = sensor()
    assert s.poke(context(dag)) is False  # recover() would fail the test (no_kafka)
    assert s.poke(context(dag)) is False
    assert turns.calls == [("orders", DAG_ID, RUN_ID)] * 2
    # The task log (structlog, to stdout outside a task runner) says whom it waits for.
    out = capsys.readouterr().out
    assert f"waiting: exporter 'orders' uses POOLING transactional ids, and DAG run {OTHER_RUN} of {DAG_ID}" in out


def test_pooling_sensor_recovers_once_it_is_its_turn(monkeypatch: pytest.MonkeyPatch, no_kafka: None) -> None:
    Turns(None).install(monkeypatch)
    passes: list[tuple[str, str]] = []

    def recover(
        hook: Kafka2PCHook, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> _Result:
        passes.append((prefix, run, spare_own_loss))
        return _Result(True)

    monkeypatch.setattr(Kafka2PCHook, "recover", recover)
    dag, s = sensor()
    assert s.poke(context(dag)) is True
    # The loss of this run itself is left to its export task, which repairs it (repair_lost=True).
    assert passes == [("orders", f"{DAG_ID}/{RUN_ID}", True)]


def test_incrementing_sensor_never_takes_turns(monkeypatch: pytest.MonkeyPatch, no_kafka: None) -> None:
    monkeypatch.setattr(Kafka2PCHook, "recover", lambda self, p, r, k=None, spare=False: _Result(False))
    dag, s = sensor("incrementing")
    assert s.poke(context(dag)) is False  # take_turn would fail the test
    assert s.poke(context(dag)) is False


def test_deferred_sensor_hands_its_turn_to_the_trigger_only_for_pooling() -> None:
    from airflow.sdk.exceptions import TaskDeferred

    for strategy, turn in (("POOLING", [DAG_ID, RUN_ID]), ("INCREMENTING", None)):
        with make_dag() as dag:
            s = Kafka2PCRecoverySensor(
                task_id="recover", transactional_id_prefix="orders", naming_strategy=strategy, deferrable=True
            )
        with pytest.raises(TaskDeferred) as deferred:
            s.execute(context(dag))
        assert deferred.value.trigger.serialize()[1]["turn"] == turn
        assert deferred.value.trigger.serialize()[1]["spare_own_loss"] is True  # repair_lost, the default


# --- recovery trigger ------------------------------------------------------------------------------


@pytest.mark.parametrize("turn", [(DAG_ID, RUN_ID), [DAG_ID, RUN_ID], None])
def test_trigger_turn_survives_a_serialize_round_trip(turn: Any) -> None:
    trigger = Kafka2PCRecoveryTrigger("orders", f"{DAG_ID}/{RUN_ID}", "kafka_prod", poke_interval=2.5, turn=turn)
    classpath, kwargs = trigger.serialize()
    assert kwargs["turn"] == (list(turn) if turn else None)
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.turn == (tuple(turn) if turn else None)
    assert again.serialize() == (classpath, kwargs)


def run_trigger(monkeypatch: pytest.MonkeyPatch, turn: tuple[str, str] | None = (DAG_ID, RUN_ID)) -> list[Any]:
    from airflow.sdk import Connection

    async def aget_connection(conn_id: str) -> Connection:
        return Connection(conn_id=conn_id, conn_type="kafka2pc", host="b:9092")

    monkeypatch.setattr(Kafka2PCHook, "aget_connection", staticmethod(aget_connection))

    async def main() -> list[Any]:
        trigger = Kafka2PCRecoveryTrigger("orders", f"{DAG_ID}/{RUN_ID}", poke_interval=0.001, turn=turn)
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(main(), timeout=10))


def test_trigger_fires_only_after_the_holder_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    turns = Turns(HOLDER, HOLDER, None).install(monkeypatch)
    original = Kafka2PCHook.take_turn

    def take_turn(hook: Kafka2PCHook, *args: str) -> Lease | None:
        holder = original(hook, *args)
        order.append("wait" if holder else "turn")
        return holder

    def recover(
        hook: Kafka2PCHook, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> _Result:
        order.append("recover")
        return _Result(True)

    monkeypatch.setattr(Kafka2PCHook, "take_turn", take_turn)
    monkeypatch.setattr(Kafka2PCHook, "recover", recover)
    events = run_trigger(monkeypatch)
    assert order == ["wait", "wait", "turn", "recover"]
    assert turns.calls == [("orders", DAG_ID, RUN_ID)] * 3
    assert [(e["status"], e["passes"]) for e in events] == [("success", 3)]


def test_trigger_reports_a_loss_in_recovery_as_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    Turns(None).install(monkeypatch)
    lost = LostTransaction("orders-0", 7, 0, 10, ("events-0",), "aborted by the broker after its COMMIT")

    def recover(
        hook: Kafka2PCHook, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> _Result:
        raise TransactionLostError([lost])

    monkeypatch.setattr(Kafka2PCHook, "recover", recover)
    [event] = run_trigger(monkeypatch)
    assert event["status"] == "error" and event["passes"] == 1
    assert event["message"].startswith("TransactionLostError: 1 transaction(s) with 10 record(s) are lost")
    assert "orders-0" in event["message"]


def test_trigger_without_a_turn_never_asks_for_one(monkeypatch: pytest.MonkeyPatch, no_kafka: None) -> None:
    monkeypatch.setattr(Kafka2PCHook, "recover", lambda self, p, r, k=None, spare=False: _Result(True))
    assert [e["status"] for e in run_trigger(monkeypatch, turn=None)] == ["success"]


# --- export: a bare POOLING export refuses while another run holds the ids ------------------------


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Starting Spark fails the test, and so does importing pyspark."""
    started: list[str] = []

    def spark_session(*args: Any, **kwargs: Any) -> Any:
        started.append("spark")
        raise AssertionError("the export started Spark")

    monkeypatch.setattr(export_module, "spark_session", spark_session)
    for module in ("pyspark", "pyspark.sql"):
        monkeypatch.setitem(sys.modules, module, None)  # `import pyspark` now raises ImportError
    return started


def export_task(strategy: str = "POOLING") -> tuple[Any, Kafka2PCExportOperator]:
    with make_dag() as dag:
        op = Kafka2PCExportOperator(
            task_id="prepare", transactional_id_prefix="orders", topic="events", table="src", naming_strategy=strategy
        )
    return dag, op


def test_pooling_export_refuses_before_spark_while_another_run_holds_the_ids(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], no_spark: list[str]
) -> None:
    turns = Turns(HOLDER).install(monkeypatch)
    dag, op = export_task()
    ti = FakeTI()
    with pytest.raises(PoolingNeedsOneActiveRunError, match=re.escape(f"DAG run {OTHER_RUN} is still using them")):
        op.execute(context(dag, ti))
    assert turns.calls == [("orders", DAG_ID, RUN_ID)]
    assert no_spark == [] and ti.pushed == {}


def test_an_export_that_fails_its_checks_ends_with_a_kafka2pc_line_saying_nothing_was_written(
    monkeypatch: pytest.MonkeyPatch,
    kafka: tuple[FakeBroker, MemoryDecisionLog],
    no_spark: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A fresh broker without the topic: the check refuses before Spark, and the task log's last
    line (the one a user reads first) is the prepare's ``kafka2pc:`` line, as the runbook says."""
    from airflow_provider_kafka2pc.txn.protocol.errors import MissingTopicError

    kafka[0].topics = lambda: set()  # type: ignore[method-assign]
    dag, op = export_task()
    with pytest.raises(MissingTopicError, match="topic 'events' does not exist"):
        op.execute(context(dag, FakeTI()))
    assert no_spark == []
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "kafka2pc: prepare of run" in lines[-1], lines[-3:]
    assert "failed (MissingTopicError) before its write job started: nothing was written" in lines[-1]
    assert "Next: fix the cause above, then clear this task." in lines[-1]


def test_pooling_export_goes_on_to_spark_when_it_is_its_turn(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], no_spark: list[str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": "b:9092"}))
    Turns(None).install(monkeypatch)
    dag, op = export_task()
    with pytest.raises(AssertionError, match="started Spark"):
        op.execute(context(dag))
    assert no_spark == ["spark"]
    assert kafka[1].read().claims == {"orders": f"{DAG_ID}.prepare"}


def test_incrementing_export_never_takes_turns(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], no_spark: list[str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": "b:9092"}))
    fail_turn = lambda *a: pytest.fail("INCREMENTING took a turn")  # noqa: E731
    monkeypatch.setattr(Kafka2PCHook, "take_turn", fail_turn)
    monkeypatch.setattr(hook_module, "take_turn", fail_turn)
    dag, op = export_task("INCREMENTING")
    with pytest.raises(AssertionError, match="started Spark"):
        op.execute(context(dag))


def test_an_export_whose_run_was_decided_while_spark_wrote_aborts_what_it_prepared(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog]
) -> None:
    """Cleared while the run's commit went on: the commit finished during the Spark job."""
    from airflow_provider_kafka2pc.spark import job
    from airflow_provider_kafka2pc.spark.job import ExportResult
    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
    from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

    broker, log = kafka
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": "b:9092"}))
    Turns(None).install(monkeypatch)

    class Session:
        def stop(self) -> None: ...

    def spark_job(df: Any, settings: Any, **kw: Any) -> ExportResult:
        cs = tuple(committable(t) for t in ("orders-0", "orders-1"))
        for c in cs:
            broker.prepared(c)
        done = RunRecord("orders", f"{DAG_ID}/{RUN_ID}", RunStatus.COMMITTED, 2, 20, 1, "d-first")
        log.append([(done.key, done.to_json())])  # the first export's commit ended meanwhile
        return ExportResult(committables=cs, records=20, bytes=200, partitions=2)

    monkeypatch.setattr(export_module, "spark_session", lambda *a, **k: Session())
    monkeypatch.setattr(Kafka2PCExportOperator, "_dataframe", lambda self, spark, ctx, config, read: None)
    monkeypatch.setattr(job, "export_dataframe", spark_job)
    dag, op = export_task()
    ti = FakeTI()
    with pytest.raises(AirflowSkipException, match="already reached its COMMIT decision"):
        op.execute(context(dag, ti))
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]
    assert ti.pushed.get(SKIPPED_KEY) == {"status": "COMMITTED", "prefix": "orders"}
    assert all(log.read().ruled_by(ref_of(committable(t))) is not None for t in ("orders-0", "orders-1"))


def test_a_cleared_finished_run_skips_its_prepare_first_and_its_commit_answers_green(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus

    broker, log = kafka
    Turns(None).install(monkeypatch)
    monkeypatch.setattr(export_module, "spark_session", lambda *a, **k: pytest.fail("Spark started for a done run"))
    done = RunRecord("orders", f"{DAG_ID}/{RUN_ID}", RunStatus.COMMITTED, 2, 20, 1_700_000_000_000, "d-first")
    log.append([(done.key, done.to_json())])
    dag, export = export_task()
    ti = FakeTI()
    with pytest.raises(AirflowSkipException, match="already reached its COMMIT decision"):
        export.execute(context(dag, ti))
    assert broker.end_txn_calls == []
    with make_dag() as dag2:
        commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare", asset_alias=None)
    assert commit.trigger_rule == "none_failed"  # runs after an export that skipped itself
    ti2 = FakeTI({("prepare", SKIPPED_KEY): ti.pushed[SKIPPED_KEY]})
    before = log.read().end_offset
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="airflow_provider_kafka2pc"):
        counts = commit.execute(context(dag2, ti2))
    assert counts["already"].startswith("already committed: 20 records in 2 transactions of exporter orders")
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("airflow_provider_kafka2pc")]
    assert ours and ours[0].startswith(f"run {DAG_ID}/{RUN_ID}: already committed: 20 records"), ours
    assert log.read().end_offset == before and broker.end_txn_calls == []  # nothing written, nothing ended


def test_a_skipped_gate_or_a_branch_not_taken_still_stops_the_commit(
    kafka: tuple[FakeBroker, MemoryDecisionLog],
) -> None:
    """none_failed lets the commit run after a skipped export only when that export skipped itself
    because the run is already decided; any other skip vetoes the commit, as all_success did."""
    from airflow.sdk import BaseOperator

    from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator

    broker, _ = kafka
    with make_dag() as dag:
        gate = BaseOperator(task_id="quality_gate")
        commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare", asset_alias=None)
        gate >> commit

    class GateTI(FakeTI):
        def get_task_states(self, dag_id: str, task_ids: list[str], run_ids: list[str]) -> Any:
            return {run_ids[0]: {t: "skipped" for t in task_ids}}

    prepared_payload = payload("orders", "orders-0")
    ti = GateTI({("prepare", "return_value"): prepared_payload})
    with pytest.raises(AirflowSkipException, match=r"\['quality_gate'\] were skipped"):
        commit.execute(context(dag, ti))
    # An export skipped by a branch (no kafka2pc marker) vetoes it too.
    with make_dag() as dag2:
        lone = Kafka2PCCommitOperator(task_id="commit", export_task_ids=["prepare", "prepare_b"], asset_alias=None)
    with pytest.raises(AirflowSkipException, match=r"\['prepare_b'\] were skipped"):
        lone.execute(context(dag2, FakeTI({("prepare", "return_value"): prepared_payload})))
    assert broker.end_txn_calls == []


# --- abort: all_done, skips unless an export failed, leaves another run's transactions alone ------


def abort_task(exports: tuple[str, ...] = ("prepare_a", "prepare_b"), strategy: str = "POOLING") -> Any:
    with make_dag() as dag:
        op = Kafka2PCAbortOperator(
            task_id="abort",
            export_task_ids=list(exports),
            transactional_id_prefixes=["orders"],
            naming_strategy=strategy,
        )
    return dag, op


def test_abort_waits_for_every_export_by_default() -> None:
    _, op = abort_task()
    assert op.trigger_rule == "all_done"


@pytest.mark.parametrize(
    "xcoms",
    [
        {("prepare_a", "return_value"): payload("orders", "orders-0"), ("prepare_b", "return_value"): payload()},
        {("prepare_a", "return_value"): payload("orders", "orders-0"), ("prepare_b", SKIPPED_KEY): "COMMITTED"},
        {("prepare_a", SKIPPED_KEY): "DECIDED", ("prepare_b", SKIPPED_KEY): "ACKNOWLEDGED"},
    ],
    ids=["all-prepared", "one-skipped", "all-skipped"],
)
def test_abort_skips_without_touching_kafka_when_no_export_failed(xcoms: dict[Any, Any], no_kafka: None) -> None:
    dag, op = abort_task()
    with pytest.raises(AirflowSkipException, match="nothing to abort"):
        op.execute(context(dag, FakeTI(xcoms)))


def test_abort_rolls_back_when_one_export_failed(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog]
) -> None:
    broker, log = kafka
    turns = Turns(None).install(monkeypatch)
    ours, open_under_prefix = committable("orders-0"), committable("orders-1", producer_id=2000)
    broker.prepared(ours)
    broker.prepared(open_under_prefix)  # what the failed export left open before it could push
    dag, op = abort_task()
    ti = FakeTI({("prepare_a", "return_value"): payload("orders", "orders-0")})  # prepare_b failed
    counts = op.execute(context(dag, ti))
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-1"]
    assert broker.commits_sent() == []
    assert counts["aborted"] == 2
    assert turns.calls == [("orders", DAG_ID, RUN_ID)]
    assert log.decisions("orders-0") == log.decisions("orders-1") != []


def test_pooling_abort_leaves_the_open_transactions_of_the_run_holding_the_ids_alone(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog]
) -> None:
    broker, log = kafka
    Turns(HOLDER).install(monkeypatch)
    broker.prepared(committable("orders-0"))  # the holder's transaction, in the middle of its prepare
    dag, op = abort_task(exports=("prepare",))
    counts = op.execute(context(dag, FakeTI()))  # our export refused (another run holds the ids)
    assert counts == {"committed": 0, "aborted": 0, "lost": 0}
    assert broker.list_calls == [] and broker.end_txn_calls == []
    assert broker.state_of("orders-0") == "Ongoing"
    assert log.decisions("orders-0") == []


def test_incrementing_abort_never_takes_turns_and_aborts_only_its_run(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog]
) -> None:
    broker, _ = kafka
    fail_turn = lambda *a: pytest.fail("INCREMENTING took a turn")  # noqa: E731
    monkeypatch.setattr(Kafka2PCHook, "take_turn", fail_turn)
    monkeypatch.setattr(hook_module, "take_turn", fail_turn)
    mine = naming.transactional_id("orders", 0, naming.NamingStrategy.INCREMENTING, RUN_ID)
    theirs = naming.transactional_id("orders", 0, naming.NamingStrategy.INCREMENTING, OTHER_RUN)
    broker.prepared(committable(mine))
    broker.prepared(committable(theirs, producer_id=2000))
    dag, op = abort_task(exports=("prepare",), strategy="INCREMENTING")
    op.execute(context(dag, FakeTI()))
    assert broker.aborts_sent() == [mine]
    assert broker.state_of(theirs) == "Ongoing"


# --- commit: only the exporter's own ids for this run, each once -----------------------------------


def commit_task() -> tuple[Any, Kafka2PCCommitOperator]:
    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids=["prepare_a", "prepare_b"])
    return dag, op


INCREMENTING_ID = naming.transactional_id("orders", 3, naming.NamingStrategy.INCREMENTING, RUN_ID)
OTHER_RUNS_ID = naming.transactional_id("orders", 3, naming.NamingStrategy.INCREMENTING, OTHER_RUN)


@pytest.mark.parametrize(
    ("bad", "foreign_id"),
    [
        (legacy_payload("orders", "orders-0", "payments-1"), "payments-1"),  # another exporter
        (legacy_payload("orders", "orders2-1"), "orders2-1"),  # a prefix that only starts alike
        (legacy_payload("orders", INCREMENTING_ID, strategy="INCREMENTING"), None),
        (payload("orders", INCREMENTING_ID, strategy="INCREMENTING"), None),  # version 2  # control: this run's own id
        (legacy_payload("orders", INCREMENTING_ID, OTHER_RUNS_ID, strategy="INCREMENTING"), OTHER_RUNS_ID),
        (
            legacy_payload("orders", "orders-1", strategy="INCREMENTING"),
            "orders-1",
        ),  # a POOLING id in an INCREMENTING run
        (legacy_payload("orders", INCREMENTING_ID), INCREMENTING_ID),  # an INCREMENTING id in a POOLING payload
        (legacy_payload("orders", "orders-0", "orders-1", "orders-0"), "orders-0"),  # the same id twice
    ],
    ids=[
        "other-prefix",
        "alike-prefix",
        "valid",
        "valid-v2",
        "other-run",
        "pooling-id",
        "incrementing-id",
        "duplicate",
    ],
)
def test_commit_refuses_a_foreign_committable_before_anything_else(
    bad: dict[str, Any], foreign_id: str | None, no_kafka: None
) -> None:
    dag, op = commit_task()
    ti = FakeTI(
        {("prepare_a", "return_value"): payload("orders_eu", "orders_eu-0"), ("prepare_b", "return_value"): bad}
    )
    if foreign_id is None:
        assert op.payloads(context(dag, ti))["prepare_b"] is not None
        return
    for call in (op.payloads, op.execute):  # execute: the no_kafka hook fails anything past the check
        with pytest.raises(ForeignCommittableError) as refused:
            call(context(dag, ti))
        assert repr(foreign_id) in str(refused.value)


def test_version_2_payload_cannot_carry_a_foreign_committable() -> None:
    with pytest.raises(MalformedCommittableError, match="payments-1"):
        payload("orders", "orders-0", "payments-1")


# --- commit: asset events for the topics it made visible ------------------------------------------


def committed_report(committed: bool) -> Any:
    from airflow_provider_kafka2pc.txn.two_phase.ruling import CommitReport

    return CommitReport((), note="", committed=committed)


def run_commit(monkeypatch: pytest.MonkeyPatch, op: Kafka2PCCommitOperator, dag: Any, committed: bool) -> Any:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_kafka2pc.txn.protocol.committable import Committable

    two_topics = Committable("orders-1", 7, 0, 30, counts_by_topic={"events": 10, "audit": 20})
    one_topic = Committable("orders-2", 8, 0, 5, counts_by_topic={"events": 5})
    xcom = ExportPayload("kafka2pc_default", "orders", "POOLING", None, "EXACTLY_ONCE", (two_topics, one_topic))
    monkeypatch.setattr(Kafka2PCHook, "get_config", lambda self: {"bootstrap.servers": "b1:9092,b2:9092"})
    monkeypatch.setattr(Kafka2PCCommitOperator, "resolve", lambda *a: committed_report(committed))
    events = OutletEventAccessors()
    ti = FakeTI({("prepare", "return_value"): xcom.to_xcom()})
    op.execute({**context(dag, ti), "outlet_events": events})
    return events


def test_commit_emits_one_asset_event_per_visible_topic_through_its_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import AssetAlias

    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    assert op.outlets == [AssetAlias("kafka2pc")]
    events = run_commit(monkeypatch, op, dag, committed=True)
    emitted = [
        (e.dest_asset_key.uri, e.extra) for e in events[AssetAlias("kafka2pc")].asset_alias_events
    ]  # fmt: skip
    run = f"{DAG_ID}/{RUN_ID}"
    assert emitted == [
        ("kafka://b1:9092/audit", {"run": run, "records": 20, "transactions": 1}),
        ("kafka://b1:9092/events", {"run": run, "records": 15, "transactions": 2}),
    ]


@pytest.mark.parametrize(("now", "announced"), [(True, set()), (False, set()), (True, {"d-9"}), (True, None)])
def test_the_commit_after_a_repair_emits_the_restored_topics_saying_so_and_only_then(
    monkeypatch: pytest.MonkeyPatch, now: bool, announced: set[str] | None
) -> None:
    """The export repaired the run in this clear (repaired_now): the commit answers from the run's
    REPAIRED record and emits the restored records' events with the repair; a later clear of the run
    emits none, and neither does a clear of the commit alone once Airflow holds an event of that
    repair (``announced``; None: Airflow cannot be asked, and the commit announces)."""
    from airflow.sdk import AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_kafka2pc.operators import asset_history
    from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY
    from airflow_provider_kafka2pc.txn.protocol.records import Covered, LostTxn, Repair, RunRecord, RunStatus

    run = f"{DAG_ID}/{RUN_ID}"
    restored = tuple(
        LostTxn(Covered(f"orders-{i}", 7, 0, 10, (f"events-{i}",), 1_000, "xxh64:10:00"), "timeout") for i in (1, 3)
    )
    rec = RunRecord("orders", run, RunStatus.REPAIRED, 4, 40, 9_000, "d-1", restored,
                    repair=Repair("d-9", "dag.prepare (try 2)", 9_000, 2, 20, 20))  # fmt: skip
    monkeypatch.setattr(
        Kafka2PCHook, "decision_log", lambda self: MemoryDecisionLog(initial=[(rec.key, rec.to_json())])
    )
    monkeypatch.setattr(Kafka2PCHook, "get_config", lambda self: {"bootstrap.servers": "b1:9092"})
    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    ti = FakeTI({("prepare", SKIPPED_KEY): {"status": "REPAIRED", "prefix": "orders", "repaired_now": now}})
    asked: list[str] = []

    def history(asset: Any, repaired_at_ms: int) -> set[str]:
        assert repaired_at_ms == 9_000  # the repair's time: events before it cannot be its own
        asked.append(asset.uri)
        if announced is None:
            raise RuntimeError("no supervisor")
        return announced

    monkeypatch.setattr(asset_history, "announced_repairs", history)
    events = OutletEventAccessors()
    answer = op.execute({**context(dag, ti), "outlet_events": events})
    assert answer["already"].startswith("repaired: all 40 records in 4 transactions of exporter orders")
    emitted = [(e.dest_asset_key.uri, e.extra) for e in events[AssetAlias("kafka2pc")].asset_alias_events]
    repaired = {"decision": "d-9", "actor": "dag.prepare (try 2)", "restored": 20, "atomic": False}
    expected = [("kafka://b1:9092/events", {"run": run, "records": 20, "transactions": 2, "repaired": repaired})]
    assert asked == (["kafka://b1:9092/events"] if now else [])
    announces = now and announced != {"d-9"}
    assert emitted == (expected if announces else [])
    # Its OpenLineage run says the same: the kafka2pc_repair facet, beside the restored topics.
    lineage = op.get_openlineage_facets_on_complete(None)
    if not announces:
        assert lineage.outputs == [] and lineage.run_facets == {}
        return
    assert [o.name for o in lineage.outputs] == ["events"]
    facet = lineage.run_facets["kafka2pc_repair"]
    assert facet.atomic is False and facet.repairs == [
        {"prefix": "orders", "run": run, "decision": "d-9", "actor": "dag.prepare (try 2)",
         "restoredRecords": 20, "restoredTransactions": 2}
    ]  # fmt: skip


def test_commit_emits_nothing_unless_the_run_ended_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import AssetAlias

    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    events = run_commit(monkeypatch, op, dag, committed=False)
    assert events[AssetAlias("kafka2pc")].asset_alias_events == []


def test_a_declared_topic_asset_gets_the_extra_instead_of_a_second_event(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import Asset, AssetAlias

    declared = Asset("kafka://b1:9092/events")
    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare", outlets=[declared], asset_alias=None)
    assert op.outlets == [declared]
    events = run_commit(monkeypatch, op, dag, committed=True)
    assert events[declared].extra == {"run": f"{DAG_ID}/{RUN_ID}", "records": 15, "transactions": 2}
    assert events[AssetAlias("kafka2pc")].asset_alias_events == []  # no alias, no other topic


def test_a_200_partition_commit_task_log_has_a_handful_of_info_lines(
    kafka: tuple[FakeBroker, MemoryDecisionLog], caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole task's log, the operator's own lines (structlog, to stdout outside a task runner)
    and the core's (logging): it does not grow with the run, and no line is a Python repr."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    broker, _ = kafka
    tids = [f"orders-{i}" for i in range(200)]
    for tid in tids:
        broker.prepared(committable(tid))
    with make_dag() as dag:
        op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    ti = FakeTI({("prepare", "return_value"): payload("orders", *tids)})
    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="airflow_provider_kafka2pc"):
        counts = op.execute({**context(dag, ti), "outlet_events": OutletEventAccessors()})
    assert counts == {"committed": 200, "aborted": 0, "lost": 0, "records": 2000}
    core = [r.getMessage() for r in caplog.records if r.name.startswith("airflow_provider_kafka2pc")]
    out = capsys.readouterr().out.splitlines()
    operator = [line for line in out if "[info" in line and "airflow_provider_kafka2pc.txn." not in line]
    assert len(core) + len(operator) <= 6, core + operator
    assert any(
        "200 transaction(s): 200 committed and 0 aborted by this call, 0 already ended, 0 lost" in m for m in core
    )
    assert not [m for m in core + operator if re.search(r"[{\[]'|'[}\]]", m)], core + operator


def test_a_kafka_sourced_export_needs_one_active_run_and_refuses_before_anything_else(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], no_spark: list[str]
) -> None:
    from airflow_provider_kafka2pc.exceptions import KafkaSourceNeedsOneActiveRunError
    from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource

    with make_dag(max_active_runs=2) as dag:
        op = Kafka2PCExportOperator(
            task_id="prepare",
            transactional_id_prefix="orders",
            topic="events",
            source=KafkaSource("raw", group_id="g"),
            naming_strategy="INCREMENTING",
        )
    with pytest.raises(KafkaSourceNeedsOneActiveRunError, match="set max_active_runs=1 on DAG"):
        op.execute(context(dag, FakeTI()))
    assert no_spark == [] and kafka[1].read().group_owners == {}
    with pytest.raises(ValueError, match="use EXACTLY_ONCE"):
        Kafka2PCExportOperator(
            task_id="p2",
            transactional_id_prefix="o",
            topic="e",
            source=KafkaSource("raw", group_id="g"),
            delivery_guarantee="AT_LEAST_ONCE",
        )


def test_an_export_with_an_avro_format_asks_for_spark_avro_and_never_shows_the_registry_password(
    monkeypatch: pytest.MonkeyPatch, kafka: tuple[FakeBroker, MemoryDecisionLog], capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_provider_kafka2pc.registry.formats import AvroFormat, JsonSchemaFormat

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA2PC_DEFAULT", json.dumps({"conn_type": "kafka2pc", "host": "b:9092"}))
    registry = {"conn_type": "kafka2pc_schema_registry", "host": "https://r.example.com", "login": "exporter"}
    monkeypatch.setenv("AIRFLOW_CONN_REGISTRY", json.dumps({**registry, "password": "pw-never-shown"}))
    Turns(None).install(monkeypatch)
    asked: list[dict[str, Any]] = []

    def spark_session(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        raise AssertionError("the export started Spark")

    monkeypatch.setattr(export_module, "spark_session", spark_session)
    with make_dag() as dag:
        kw: dict[str, Any] = {"topic": "events", "table": "src", "schema_registry_conn_id": "registry"}
        avro = Kafka2PCExportOperator(task_id="avro", transactional_id_prefix="a", value_format=AvroFormat(), **kw)
        json_only = Kafka2PCExportOperator(
            task_id="json", transactional_id_prefix="j", value_format=JsonSchemaFormat(), **kw
        )
        with pytest.raises(ValueError, match="need a schema_registry_conn_id"):
            Kafka2PCExportOperator(task_id="none", transactional_id_prefix="n", value_format=AvroFormat(), table="src")
    for op in (avro, json_only):
        with pytest.raises(AssertionError, match="started Spark"):
            op.execute(context(dag))
    assert [a["avro"] for a in asked] == [True, False]  # spark-avro only where an Avro format needs it
    assert "pw-never-shown" not in capsys.readouterr().out


def test_the_abort_operator_still_imports_from_the_commit_module() -> None:
    """It lived there in 0.1.0; DAGs written then import it from there."""
    from airflow_provider_kafka2pc.operators import abort, commit

    assert commit.Kafka2PCAbortOperator is abort.Kafka2PCAbortOperator
