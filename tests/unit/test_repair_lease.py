"""A repair's lease (``txn.protocol.repair_lease``, ``txn.two_phase.repair_lease``): which repair
holds a run, what recovery leaves alone, and how a second repair waits. The real broker:
``tests/integration/test_repair_broker.py``."""

from __future__ import annotations

import dataclasses
import threading

from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.repair_lease import RepairLease
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.repair_lease import hold_run
from airflow_provider_kafka2pc.txn.two_phase.ruling import now_ms
from tests.unit.fakes import FakeBroker, MemoryDecisionLog, txn_state

RUN = "etl/manual__2026-12-06"


def _lease(holder: str, at_ms: int, attempt: str = "repair.abc.1") -> RepairLease:
    return RepairLease("orders", RUN, holder, attempt, at_ms)


def _put(log: MemoryDecisionLog, lease: RepairLease) -> RepairLease:
    """Appended as ``hold_run`` does: the first record, then one that carries its offset."""
    first = log.append([(lease.key, lease.to_json())])[0]
    lease = dataclasses.replace(lease, acquired_offset=first.offset)
    log.append([(lease.key, lease.to_json())])
    return lease


def _holder(log: MemoryDecisionLog) -> str | None:
    held = log.read().repair_holder("orders", RUN, now_ms())
    return None if held is None else held.holder


def test_the_first_live_lease_holds_the_run_and_a_renewal_keeps_its_place() -> None:
    log, now = MemoryDecisionLog(), now_ms()
    a = _put(log, _lease("a", now))
    b = _put(log, _lease("b", now, "repair.abc.2"))
    log.append([(a.key, dataclasses.replace(a, at_ms=now + 1).to_json())])  # renewed after b's first record
    assert _holder(log) == "a"
    log.append([(a.key, dataclasses.replace(a, at_ms=now - a.ttl_ms - 1).to_json())])  # a stopped: lapsed
    assert _holder(log) == "b"
    log.append([(b.key, None)])  # released
    assert _holder(log) is None
    assert a.protects("orders-repair.abc.1-3") and not a.protects("orders-repair.abc.2-3")
    assert not a.protects("orders2-repair.abc.1-3") and not a.protects("orders-3")


def test_recovery_leaves_a_live_repairs_transactions_alone_and_aborts_a_lapsed_ones(broker: FakeBroker) -> None:
    broker.add(
        txn_state("orders-repair.abc.1-0", "Ongoing"),  # the live repair's, half written
        txn_state("orders-repair.abc.2-0", "Ongoing"),  # a repair that stopped renewing: died
        txn_state("orders-0", "Ongoing"),  # an export that died: aborted as ever
    )
    log = MemoryDecisionLog()
    _put(log, _lease("live", now_ms()))
    _put(log, _lease("dead", now_ms() - 60_000, "repair.abc.2"))
    result = recover(broker, "orders", log)
    assert sorted(broker.aborts_sent()) == ["orders-0", "orders-repair.abc.2-0"]
    assert broker.state_of("orders-repair.abc.1-0") == "Ongoing"
    assert result.left_to_repair == (("orders-repair.abc.1-0", RUN),)
    # The holder itself, ending what its failed re-export opened, does not spare its own.
    mine = recover(broker, "orders", log, owns=lambda tid: "repair.abc.1" in tid, honour_leases=False)
    assert "orders-repair.abc.1-0" in broker.aborts_sent() and mine.left_to_repair == ()


def _second(log: MemoryDecisionLog, got: list[RunRecord | None]) -> None:
    with hold_run(log, "orders", RUN, "repair.abc.2", poll_s=0.01) as found:
        got.append(found)


def test_a_second_repair_waits_for_the_holder_and_takes_the_run_or_its_result() -> None:
    for outcome in ("released", "repaired"):
        log = MemoryDecisionLog()
        got: list[RunRecord | None] = []
        with hold_run(log, "orders", RUN, "repair.abc.1") as first:
            assert first is None
            waiter = threading.Thread(target=_second, args=(log, got))
            waiter.start()
            waiter.join(0.3)
            assert waiter.is_alive() and got == []  # waiting while the first holds the run
            if outcome == "repaired":
                rec = RunRecord("orders", RUN, RunStatus.REPAIRED, 2, 20, 1)
                log.append([(rec.key, rec.to_json())])
        waiter.join(10)
        if outcome == "released":
            assert got == [None]  # its turn: it repairs
        else:
            assert got and got[0] is not None and got[0].status is RunStatus.REPAIRED  # it reports the result
        assert _holder(log) is None  # both released
