"""A Spark application's handoff (``txn.protocol.handoff``, ``txn.two_phase.handoff``): the record,
the refusals by name, and which driver attempt is accepted. The real broker and real Spark:
``tests/integration/test_handoff_spark.py``."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    ForeignHandoffError,
    MalformedHandoffError,
)
from airflow_provider_kafka2pc.txn.protocol.handoff import Handoff, check_attempt, parse_handoff_key
from airflow_provider_kafka2pc.txn.protocol.naming import NamingStrategy, sanitize_run_key, transactional_id
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.two_phase.handoff import Acceptance, accept, hand_off
from tests.unit.fakes import FakeBroker, MemoryDecisionLog, committable

PREFIX, RUN_ID = "orders", "manual__2026-12-06T08:00:00+00:00"
RUN, KEY = f"etl/{RUN_ID}", sanitize_run_key(RUN_ID)
INC = NamingStrategy.INCREMENTING


def _handoff(attempt: str = "app-1.1", epoch: int = 0, slots: int = 2) -> Handoff:
    tids = [transactional_id(PREFIX, s, INC, KEY) for s in range(slots)]
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
        (b'{"v": 9}', r"not a kafka2pc handoff of format 1 \(found 9\): the application and the Airflow side"),
        (b'{"v": 1, "prefix": "orders"}', r"cannot be read \(KeyError: 'run'\)"),
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
    with pytest.raises(ForeignHandoffError, match=r"carries transactional ids of another run .*orders-other_run-0"):
        foreign.check(PREFIX, RUN, INC, KEY)
    with pytest.raises(MalformedHandoffError, match=r"driver attempt 'a:b'"):
        check_attempt("a:b")


def test_the_attempt_the_broker_holds_open_is_accepted_and_a_fenced_one_is_not() -> None:
    log, broker = MemoryDecisionLog(), FakeBroker()
    assert "no application has handed off run etl/manual__" in _accept(log, broker).waiting
    first, second = _handoff("app-1.1", epoch=0), _handoff("app-1.2", epoch=1)
    for c in first.committables:
        broker.prepared(c)
    hand_off(log, first)
    found = _accept(log, broker)
    assert found.handoff == first
    # A second driver attempt took the same ids: the first is fenced; its late record changes nothing.
    for c in second.committables:
        broker.prepared(c)
    hand_off(log, second)
    found = _accept(log, broker)
    assert found.handoff == second and found.stale == ("app-1.1",)
    # The first attempt's handoff alone, its transactions fenced: nothing to accept yet.
    log2 = MemoryDecisionLog()
    hand_off(log2, first)
    waiting = _accept(log2, broker)
    assert waiting.handoff is None and "'app-1.1' of run etl/manual__" in waiting.waiting


def test_two_live_attempts_are_refused_and_a_decided_run_accepts_nothing() -> None:
    log, broker = MemoryDecisionLog(), FakeBroker()
    a, b = _handoff("app-1.1"), _handoff("app-2.1", slots=4)
    b = dataclasses.replace(b, committables=b.committables[2:])  # other slots: both open at once
    for c in (*a.committables, *b.committables):
        broker.prepared(c)
    hand_off(log, a)
    hand_off(log, b)
    with pytest.raises(DecisionConflictError, match=r"attempts 'app-1.1', 'app-2.1' of run .* all hold open"):
        _accept(log, broker)
    decided = RunRecord(PREFIX, RUN, RunStatus.COMMITTED, 2, 20, 1)
    log.append([(decided.key, decided.to_json())])
    found = _accept(log, broker)
    assert found.handoff is None and found.decided == decided
