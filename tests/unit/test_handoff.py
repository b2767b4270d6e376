"""A Spark application's handoff (``txn.protocol.handoff``, ``txn.two_phase.handoff``): the record,
the refusals by name, and which driver attempt is accepted. The real broker and real Spark:
``tests/integration/test_handoff_spark.py``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.errors import ForeignHandoffError, MalformedHandoffError
from airflow_provider_kafka2pc.txn.protocol.handoff import Handoff, check_attempt, parse_handoff_key
from airflow_provider_kafka2pc.txn.protocol.naming import (
    NamingStrategy,
    attempt_tag,
    parse_transactional_id,
    sanitize_run_key,
    transactional_id,
)
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.two_phase.handoff import Acceptance, accept, hand_off, retire_handoffs
from tests.unit.fakes import FakeBroker, MemoryDecisionLog, committable

PREFIX, RUN_ID = "orders", "manual__2026-12-06T08:00:00+00:00"
RUN, KEY = f"etl/{RUN_ID}", sanitize_run_key(RUN_ID)
INC = NamingStrategy.INCREMENTING


def _handoff(attempt: str = "app-1.1", epoch: int = 0, slots: int = 2) -> Handoff:
    tids = [transactional_id(PREFIX, s, INC, KEY, attempt_tag(attempt)) for s in range(slots)]
    return Handoff(PREFIX, RUN, attempt, INC, KEY, tuple(committable(t, 1000 + i, epoch) for i, t in enumerate(tids)))


def _accept(log: MemoryDecisionLog, broker: FakeBroker) -> Acceptance:
    return accept(log, TransactionInspector(broker), PREFIX, RUN, INC, KEY)


def test_the_record_round_trips_under_a_key_whose_run_holds_colons() -> None:
    h = dataclasses.replace(_handoff(), summary={"records": 20}, at_ms=5)
    assert parse_handoff_key(h.key) == (PREFIX, "app-1.1", RUN)
    assert Handoff.from_json(h.to_json(), h.key) == h
    assert b"password" not in h.to_json() and b"bootstrap" not in h.to_json()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{not json", r"handoff of attempt 'app-1.1' for run etl/manual__.* cannot be read \(JSONDecodeError"),
        (b'{"v": 9}', r"not a kafka2pc handoff of format 2 \(found 9\): the application and the Airflow side"),
        (b'{"v": 1, "prefix": "orders"}', r"not a kafka2pc handoff of format 2 \(found 1\)"),
        (b'{"v": 2, "prefix": "orders"}', r"cannot be read \(KeyError: 'run'\)"),
    ],
)
def test_a_malformed_handoff_is_refused_by_name(raw: bytes, match: str) -> None:
    with pytest.raises(MalformedHandoffError, match=match):
        Handoff.from_json(raw, _handoff().key)


def test_a_handoff_of_another_run_or_of_other_ids_is_refused_by_name() -> None:
    h = _handoff()
    other = dataclasses.replace(h, run="etl/scheduled__2026-12-05")
    with pytest.raises(ForeignHandoffError, match=r"names exporter 'orders', attempt 'app-1.1', run etl/scheduled"):
        Handoff.from_json(other.to_json(), h.key)  # copied under this run's key
    with pytest.raises(ForeignHandoffError, match=r"is for run etl/scheduled__2026-12-05 of exporter 'orders'"):
        other.check(PREFIX, RUN, INC, KEY)
    foreign = dataclasses.replace(h, committables=(committable(transactional_id(PREFIX, 0, INC, "other_run")),))
    with pytest.raises(ForeignHandoffError, match=r"carries transactional ids of another run.*orders-other_run-0"):
        foreign.check(PREFIX, RUN, INC, KEY)
    # This run's ids, but another attempt's (or none): an attempt hands off only what it wrote.
    for tag in (attempt_tag("app-9.1"), None):
        theirs = dataclasses.replace(h, committables=(committable(transactional_id(PREFIX, 0, INC, KEY, tag)),))
        with pytest.raises(ForeignHandoffError, match=rf"attempt or naming .*with the attempt's tag '{h.attempt_tag}'"):
            theirs.check(PREFIX, RUN, INC, KEY)
    with pytest.raises(MalformedHandoffError, match=r"driver attempt 'a:b'"):
        check_attempt("a:b")


def test_each_attempt_writes_ids_of_its_own_and_they_stay_the_runs() -> None:
    """A live earlier attempt must never fence the attempt being committed (DESIGN §16): their ids
    differ by the attempt's tag, and everything that owns the run's ids owns both."""
    from airflow_provider_kafka2pc.txn.protocol.naming import Members

    a, b = (transactional_id(PREFIX, 3, INC, KEY, attempt_tag(x)) for x in ("application_1_0001.1", "app-2.1"))
    assert a != b and a.startswith(f"{PREFIX}-{KEY}-a") and a.endswith("-3")
    parsed = parse_transactional_id(a)
    assert parsed is not None and (parsed.prefix, parsed.run_key, parsed.slot) == (PREFIX, KEY, 3)
    assert parsed.attempt == attempt_tag("application_1_0001.1")
    assert Members(PREFIX, INC, KEY).owns(a) and Members(PREFIX, INC, KEY).owns(b)
    mine = Members(PREFIX, INC, KEY, attempt_tag("app-2.1"))  # one attempt's ids alone
    assert mine.owns(b) and not mine.owns(a) and not mine.owns(transactional_id(PREFIX, 3, INC, KEY))
    assert not Members(PREFIX, INC, "other_run").owns(a) and not Members(PREFIX, NamingStrategy.POOLING).owns(a)
    with pytest.raises(ValueError, match="attempt tag"):
        transactional_id(PREFIX, 0, NamingStrategy.POOLING, None, attempt_tag("x"))


def test_the_first_attempt_the_broker_holds_open_is_accepted_and_an_aborted_one_is_not() -> None:
    log, broker = MemoryDecisionLog(), FakeBroker()
    assert "no application has handed off run etl/manual__" in _accept(log, broker).waiting
    first, second = _handoff("app-1.1"), _handoff("app-1.2")
    for c in first.committables:
        broker.prepared(c)
    hand_off(log, first)
    assert _accept(log, broker).handoff == first
    # A second driver attempt completes too, on ids of its own: the first to hand off stays the run's.
    for c in second.committables:
        broker.prepared(c)
    hand_off(log, second)
    found = _accept(log, broker)
    assert found.handoff == first and found.stale == ()
    # The first one's transactions aborted (the next attempt's recovery ended them): the second is accepted.
    tid = first.committables[0].transactional_id
    broker.states[tid] = dataclasses.replace(broker.states[tid], producer_epoch=1, state="CompleteAbort")
    found = _accept(log, broker)
    assert found.handoff == second and found.stale == ("app-1.1",)
    # The first attempt's handoff alone, its transactions aborted: nothing to accept yet.
    log2 = MemoryDecisionLog()
    hand_off(log2, first)
    waiting = _accept(log2, broker)
    assert waiting.handoff is None and "'app-1.1' of run etl/manual__" in waiting.waiting


def test_a_decided_run_accepts_nothing() -> None:
    log, broker = MemoryDecisionLog(), FakeBroker()
    a = _handoff("app-1.1")
    for c in a.committables:
        broker.prepared(c)
    hand_off(log, a)
    decided = RunRecord(PREFIX, RUN, RunStatus.COMMITTED, 2, 20, 1)
    log.append([(decided.key, decided.to_json())])
    found = _accept(log, broker)
    assert found.handoff is None and found.decided == decided


def test_a_run_s_handoffs_are_retired_once_it_has_its_record_and_not_before() -> None:
    log, broker = MemoryDecisionLog(), FakeBroker()
    for attempt in ("app-1.1", "app-1.2"):
        h = _handoff(attempt)
        for c in h.committables:
            broker.prepared(c)
        hand_off(log, h)
    assert retire_handoffs(log, PREFIX, RUN) == 0  # undecided: the sensor still needs them
    assert len(log.read_for(PREFIX, RUN).handoffs[(PREFIX, RUN)]) == 2
    decided = RunRecord(PREFIX, RUN, RunStatus.COMMITTED, 2, 20, 1)
    log.append([(decided.key, decided.to_json())])
    assert retire_handoffs(log, PREFIX, RUN) == 2
    assert log.read_for(PREFIX, RUN).handoffs.get((PREFIX, RUN), {}) == {}
    assert _accept(log, broker).decided == decided  # the sensor answers from the run's record
    assert retire_handoffs(log, PREFIX, RUN) == 0


def test_a_handoff_retired_by_a_decision_between_its_append_and_its_read_back_says_so() -> None:
    class DecidedMeanwhile(MemoryDecisionLog):
        def append(self, records: Any) -> Any:
            done = super().append(records)
            if any(value is not None for _, value in records):  # the commit decides and retires now
                decided = RunRecord(PREFIX, RUN, RunStatus.COMMITTED, 2, 20, 1)
                super().append([(decided.key, decided.to_json())])
                retire_handoffs(self, PREFIX, RUN)
            return done

    log = DecidedMeanwhile()
    assert hand_off(log, _handoff("app-1.1")) is False
    assert hand_off(MemoryDecisionLog(), _handoff("app-1.1")) is True


def test_an_aborted_run_retires_only_the_handoffs_its_abort_rules() -> None:
    """An ABORT leaves no run record, and a cleared run may hand off again: a handoff whose every
    transaction the ABORT rules goes, one written after it stays for the sensor."""
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared

    log, broker = MemoryDecisionLog(), FakeBroker()
    first, empty = _handoff("app-1.1"), dataclasses.replace(_handoff("app-1.2"), committables=())
    for c in first.committables:
        broker.prepared(c)
    hand_off(log, first)
    hand_off(log, empty)  # prepared nothing: nothing of it can be ruled
    abort_prepared(list(first.committables), broker, log, RUN)
    again = _handoff("app-2.1", epoch=1)
    for c in again.committables:
        broker.prepared(c)
    hand_off(log, again)  # the run cleared and submitted again
    assert retire_handoffs(log, PREFIX, RUN) == 1
    assert set(log.read_for(PREFIX, RUN).handoffs[(PREFIX, RUN)]) == {"app-1.2", "app-2.1"}
    assert _accept(log, broker).handoff == again


def _trigger_events(monkeypatch: pytest.MonkeyPatch, answers: list[Acceptance | Exception]) -> list[dict[str, object]]:
    """The handoff trigger's events, its looks answered in turn by ``answers``."""
    import asyncio

    from airflow.sdk import Connection

    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
    from airflow_provider_kafka2pc.triggers.handoff import Kafka2PCHandoffTrigger

    async def aget_connection(conn_id: str) -> Connection:
        return Connection(conn_id=conn_id, conn_type="kafka2pc", host="b:9092")

    def accept_handoff(self: Kafka2PCHook, *args: object) -> Acceptance:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(Kafka2PCHook, "aget_connection", staticmethod(aget_connection))
    monkeypatch.setattr(Kafka2PCHook, "accept_handoff", accept_handoff)
    trigger = Kafka2PCHandoffTrigger(PREFIX, RUN, INC.value, KEY, poke_interval=0.01)
    assert trigger.serialize()[1]["run"] == RUN and "b:9092" not in str(trigger.serialize())

    async def main() -> list[dict[str, object]]:
        return [e.payload async for e in trigger.run()]

    return asyncio.run(main())


def test_the_trigger_fires_once_an_attempt_is_live_and_reports_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    waiting = Acceptance(None, "no application has handed off run … yet")
    assert _trigger_events(monkeypatch, [waiting, waiting, Acceptance(_handoff())]) == [{"status": "ready", "looks": 3}]
    refused = ForeignHandoffError("the handoff of attempt 'x' is for run other")
    events = _trigger_events(monkeypatch, [refused])
    assert events == [
        {"status": "error", "looks": 1, "message": "ForeignHandoffError: the handoff of attempt 'x' is for run other"}
    ]


def test_the_sensor_skips_a_decided_run_and_pushes_an_accepted_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import PokeReturnValue
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_provider_kafka2pc.exceptions import HandoffWaitError
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
    from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY, ExportPayload
    from airflow_provider_kafka2pc.sensors.handoff import Kafka2PCHandoffSensor

    class Ti:
        def __init__(self) -> None:
            self.pushed: dict[str, object] = {}

        def xcom_push(self, key: str, value: object) -> None:
            self.pushed[key] = value

    class Dag:
        dag_id = "etl"

    answers = [
        Acceptance(_handoff(), stale=("app-0.1",)),
        Acceptance(None, decided=RunRecord(PREFIX, RUN, RunStatus.COMMITTED, 2, 20, 1)),
    ]
    monkeypatch.setattr(Kafka2PCHook, "accept_handoff", lambda self, *a: answers.pop(0))
    sensor = Kafka2PCHandoffSensor(task_id="handoff", transactional_id_prefix=PREFIX)
    ti = Ti()
    context = {"dag": Dag(), "run_id": RUN_ID, "ti": ti}
    got = sensor.poke(context)  # type: ignore[arg-type]
    assert isinstance(got, PokeReturnValue) and got.is_done
    payload = ExportPayload.from_xcom(got.xcom_value, "handoff")
    pushed = [(c.transactional_id, c.producer_id, c.producer_epoch, c.records) for c in payload.committables]
    assert pushed == [(c.transactional_id, c.producer_id, c.producer_epoch, c.records) for c in _handoff().committables]
    assert (
        payload.conn_id == "kafka2pc_default" and payload.naming_strategy == "INCREMENTING" and payload.run_key == KEY
    )
    assert payload.attempt_tag == attempt_tag("app-1.1") and got.xcom_value["version"] == 3  # type: ignore[index]
    with pytest.raises(AirflowSkipException, match=r"run etl/manual__.* already reached its COMMIT decision"):
        sensor.poke(context)  # type: ignore[arg-type]
    assert ti.pushed[SKIPPED_KEY] == {"status": "COMMITTED", "prefix": PREFIX}
    with pytest.raises(HandoffWaitError, match="ForeignHandoffError: no"):
        sensor.execute_complete(context, {"status": "error", "message": "ForeignHandoffError: no"})  # type: ignore[arg-type]


def test_pooling_is_refused_by_the_application_and_the_sensor() -> None:
    """POOLING ids are shared by every run, which must take turns: only the export task can arrange it."""
    from airflow_provider_kafka2pc.sensors.handoff import Kafka2PCHandoffSensor
    from airflow_provider_kafka2pc.spark.application import export_from_application
    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

    with pytest.raises(Kafka2PCError, match=r"naming_strategy 'POOLING': an application's export writes INCREMENTING"):
        export_from_application(
            None,
            topic="t",
            transactional_id_prefix=PREFIX,
            dag_id="etl",
            run_id=RUN_ID,
            task_id="submit",
            naming_strategy="POOLING",
        )
    with pytest.raises(ValueError, match=r"handoff: naming_strategy must be INCREMENTING"):
        Kafka2PCHandoffSensor(task_id="handoff", transactional_id_prefix=PREFIX, naming_strategy="POOLING")


def test_an_attempt_that_prepared_nothing_is_accepted_and_loses_to_one_that_did() -> None:
    """An empty frame makes no committable: nothing to fence, so every such attempt is live; a
    driver restarted after handing off an empty export must not fail the run as a conflict."""
    log, broker = MemoryDecisionLog(), FakeBroker()
    empty_1, empty_2 = (dataclasses.replace(_handoff(a), committables=()) for a in ("app-1.1", "app-1.2"))
    hand_off(log, empty_1)
    hand_off(log, empty_2)
    assert _accept(log, broker).handoff == empty_2  # the latest
    full = _handoff("app-1.3", epoch=2)
    for c in full.committables:
        broker.prepared(c)
    hand_off(log, full)
    assert _accept(log, broker).handoff == full
    # A transaction the broker is ending (an abort under way) is not held; the empty attempts before
    # it do not stand in for the records it wrote: nothing is accepted.
    tid = full.committables[0].transactional_id
    broker.states[tid] = dataclasses.replace(broker.states[tid], state="PrepareAbort")
    found = _accept(log, broker)
    assert found.handoff is None and found.stale == ("app-1.3",)
