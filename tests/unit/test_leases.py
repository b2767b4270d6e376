"""POOLING runs take turns: ``DecisionLog.take_turn`` over the in-memory log, and who is live."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_provider_kafka2pc.hooks import kafka2pc as hook_module
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook, dag_run_is_live
from airflow_provider_kafka2pc.txn.kafka.decision_log import Position
from airflow_provider_kafka2pc.txn.protocol.records import LEASE_KEY, Lease
from tests.unit.fakes import FakeBroker, FakeClients, MemoryDecisionLog

DAG = "export_orders"


def lease(run: str, prefix: str = "orders", dag: str = DAG) -> Lease:
    return Lease(prefix, dag, run, at_ms=1_700_000_000_000)


class Scheduler:
    """Says which DAG runs are live, and remembers whom it was asked about."""

    def __init__(self, *live: str) -> None:
        self.live = set(live)
        self.asked: list[tuple[str, str]] = []

    def __call__(self, lease: Lease) -> bool:
        self.asked.append((lease.prefix, lease.run_id))
        return lease.run_id in self.live


def queue(log: MemoryDecisionLog, prefix: str = "orders") -> list[str]:
    return [q.run_id for q in log.read().queue(prefix)]


def lease_records(log: MemoryDecisionLog) -> list[tuple[str, bool]]:
    """(run, tombstone?) of every lease record appended, in log order."""
    return [
        (e.key.decode().rpartition("/")[2], e.value is None)
        for e in log.entries
        if e.key.startswith(LEASE_KEY.encode())
    ]


def test_the_first_queued_run_goes() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1")
    assert log.take_turn(lease("r1"), scheduler) is None
    assert queue(log) == ["r1"]
    assert scheduler.asked == []  # nobody ahead: nobody to ask about


def test_the_second_run_waits_and_learns_who_holds_the_ids() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1", "r2")
    assert log.take_turn(lease("r1"), scheduler) is None
    assert log.take_turn(lease("r2"), scheduler) == lease("r1")
    assert queue(log) == ["r1", "r2"]
    assert ("orders", "r2") not in scheduler.asked  # a run never asks about itself


def test_the_second_run_goes_once_the_first_is_not_live_and_retires_its_lease() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1", "r2", "r3")
    log.take_turn(lease("r1"), scheduler)
    assert log.take_turn(lease("r2"), scheduler) == lease("r1")
    scheduler.live.discard("r1")  # succeeded, failed or deleted: the scheduler no longer runs it
    assert log.take_turn(lease("r2"), scheduler) is None
    assert lease_records(log) == [("r1", False), ("r2", False), ("r1", True)]  # the stale lease tombstoned
    assert queue(log) == ["r2"]
    # The next run now waits for r2, and never asks about r1 again.
    scheduler.asked.clear()
    assert log.take_turn(lease("r3"), scheduler) == lease("r2")
    assert scheduler.asked == [("orders", "r2")]


def test_every_stale_lease_ahead_is_retired_up_to_the_first_live_one() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1", "r2", "r3", "r4")
    for run in ("r1", "r2", "r3", "r4"):
        log.take_turn(lease(run), scheduler)
    scheduler.live -= {"r1", "r2"}
    assert log.take_turn(lease("r4"), scheduler) == lease("r3")
    assert queue(log) == ["r3", "r4"]
    assert lease_records(log)[-2:] == [("r1", True), ("r2", True)]


def test_queueing_again_neither_appends_nor_moves_the_run_back() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1", "r2", "r3")
    for run in ("r1", "r2", "r3"):
        log.take_turn(lease(run), scheduler)
    appended = len(log.entries)
    for _ in range(3):  # sensor pokes, the trigger's passes, the export, the abort: same run, same place
        assert log.take_turn(lease("r2"), scheduler) == lease("r1")
        assert log.take_turn(Lease("orders", DAG, "r2", at_ms=1), scheduler) == lease("r1")  # a later poke
        assert log.take_turn(lease("r1"), scheduler) is None
    assert len(log.entries) == appended
    assert queue(log) == ["r1", "r2", "r3"]


def test_a_run_is_identified_by_dag_and_run_id() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("manual__1")
    log.take_turn(lease("manual__1", dag="dag_a"), scheduler)
    # Another DAG exporting through the same prefix with the same run id is another run.
    assert log.take_turn(lease("manual__1", dag="dag_b"), scheduler) == lease("manual__1", dag="dag_a")


class RacingLog(MemoryDecisionLog):
    """Lets other runs' lease appends land in the log right around ours, before we read back."""

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[str, list[Lease]] = {}  # run -> leases appended just before its own
        self.after: dict[str, list[Lease]] = {}  # run -> leases appended just after its own

    def append(self, items: Sequence[tuple[bytes, bytes | None]]) -> list[Position]:
        if len(items) == 1 and items[0][1] is not None and items[0][0].startswith(LEASE_KEY.encode()):
            run = items[0][0].decode().rpartition("/")[2]
            for other in self.before.pop(run, []):
                super().append([(other.key, other.to_json())])
            out = super().append(items)
            for other in self.after.pop(run, []):
                super().append([(other.key, other.to_json())])
            return out
        return super().append(items)


@pytest.mark.parametrize(("lands", "goes"), [("after", "r1"), ("before", "r2")])
def test_two_runs_queueing_at_once_are_ordered_by_the_log(lands: str, goes: str) -> None:
    log, scheduler = RacingLog(), Scheduler("r1", "r2")
    # r2 appends its lease while r1 is between its own append and its read back.
    getattr(log, lands)["r1"] = [lease("r2")]
    first = log.take_turn(lease("r1"), scheduler)
    second = log.take_turn(lease("r2"), scheduler)
    assert [first, second].count(None) == 1, "exactly one of two racing runs goes"
    waits = "r2" if goes == "r1" else "r1"
    assert (first if waits == "r1" else second) == lease(goes)
    assert queue(log) == sorted(["r1", "r2"], key=lambda r: r != goes)
    assert lease_records(log).count(("r2", False)) == 1  # r2 found itself queued: no second append


class BarrierLog(MemoryDecisionLog):
    """Every run's lease append waits until all runs have appended theirs: none reads back before."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)

    def append(self, items: Sequence[tuple[bytes, bytes | None]]) -> list[Position]:
        out = super().append(items)
        if any(k.startswith(LEASE_KEY.encode()) and v is not None for k, v in items):
            self.barrier.wait()
        return out


def test_runs_racing_in_threads_let_exactly_one_go() -> None:
    runs = [f"r{i}" for i in range(4)]
    log, scheduler = BarrierLog(len(runs)), Scheduler(*runs)
    results: dict[str, Lease | None] = {}
    errors: list[BaseException] = []

    def queue_up(run: str) -> None:
        try:
            results[run] = log.take_turn(lease(run), scheduler)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=queue_up, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors
    first = queue(log)[0]
    assert [r for r, holder in results.items() if holder is None] == [first]
    assert all(holder == lease(first) for r, holder in results.items() if r != first)
    assert sorted(queue(log)) == runs


def test_leases_of_another_prefix_never_interfere() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("p1", "e1")
    log.take_turn(lease("p1", prefix="payments"), scheduler)
    log.take_turn(lease("e1", prefix="orders_eu"), scheduler)  # shares the start of the name, not the ids
    log.take_turn(lease("stale", prefix="payments"), scheduler)
    scheduler.asked.clear()
    assert log.take_turn(lease("o1"), scheduler) is None
    assert scheduler.asked == []  # nobody of another exporter is even looked at...
    assert queue(log, "payments") == ["p1", "stale"]  # ...nor retired, live or not
    assert queue(log, "orders_eu") == ["e1"]
    assert queue(log) == ["o1"]
    # And the other exporters still take turns among themselves only.
    assert log.take_turn(lease("p2", prefix="payments"), scheduler) == lease("p1", prefix="payments")


def test_queue_order_survives_compaction() -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("r1", "r2", "r3", "r4")
    log.take_turn(lease("r0"), scheduler)
    log.take_turn(lease("r1"), scheduler)  # r0 is not live: retired by r1
    log.claim_prefix("orders", owner=f"{DAG}.prepare")
    for run in ("r2", "r3", "r4"):
        log.take_turn(lease(run), scheduler)
        log.take_turn(lease("r1"), scheduler)  # r1 pokes in between: no append, no move
    before = log.read().queue("orders")
    log.compact()
    assert log.read().queue("orders") == before == [lease(r) for r in ("r1", "r2", "r3", "r4")]
    assert not any(e.value is None for e in log.entries)
    assert log.take_turn(lease("r4"), scheduler) == lease("r1")
    scheduler.live.discard("r1")
    assert log.take_turn(lease("r3"), scheduler) == lease("r2")


# --- the hook: leases through the decision log, liveness from the scheduler ---------------------


def test_hook_take_turn_queues_the_dag_run_and_asks_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    log, scheduler = MemoryDecisionLog(), Scheduler("scheduled__1")
    closed: list[bool] = []

    class Clients(FakeClients):  # the hook's clients of one call: closed when the call ends
        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(Kafka2PCHook, "clients", lambda self: Clients(FakeBroker(), log))
    monkeypatch.setattr(hook_module, "dag_run_is_live", scheduler)
    hook = Kafka2PCHook("kafka2pc_default")
    assert hook.take_turn("orders", DAG, "scheduled__1") is None
    holder = hook.take_turn("orders", DAG, "backfill__2")
    assert holder is not None and (holder.prefix, holder.dag_id, holder.run_id) == ("orders", DAG, "scheduled__1")
    assert queue(log) == ["scheduled__1", "backfill__2"]
    assert closed == [True, True]


class DagRuns:
    """The Task SDK's typed answer about DAG runs: ``get_dr_count`` over a table of (dag, run) -> state."""

    def __init__(self, states: dict[tuple[str, str], str]) -> None:
        self.states = states
        self.asked: list[dict[str, Any]] = []

    def get_dr_count(
        self,
        dag_id: str,
        logical_dates: Any = None,
        run_ids: list[str] | None = None,
        states: list[str] | None = None,
    ) -> int:
        self.asked.append({"dag_id": dag_id, "run_ids": run_ids, "states": states})
        return sum(
            1
            for (dag, run), state in self.states.items()
            if dag == dag_id and (run_ids is None or run in run_ids) and (states is None or state in states)
        )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> DagRuns:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        def no_error_text(dag_id: str, run_id: str) -> str:
            raise AssertionError("liveness must not be read from get_dagrun_state's error text")

        monkeypatch.setattr(RuntimeTaskInstance, "get_dr_count", staticmethod(self.get_dr_count))
        monkeypatch.setattr(RuntimeTaskInstance, "get_dagrun_state", staticmethod(no_error_text))
        return self


def test_a_dag_run_is_live_while_queued_or_running(monkeypatch: pytest.MonkeyPatch) -> None:
    for state, live in [("queued", True), ("running", True), ("success", False), ("failed", False)]:
        runs = DagRuns({(DAG, "r1"): state, (DAG, "r2"): "running", ("other_dag", "r1"): "running"}).install(
            monkeypatch
        )
        assert dag_run_is_live(lease("r1")) is live, state
        assert runs.asked == [{"dag_id": DAG, "run_ids": ["r1"], "states": ["queued", "running"]}]


def test_a_deleted_dag_run_is_not_live_whatever_the_api_would_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under dag.test() a missing run's get_dagrun_state fails with "Server returned error", not "not
    found": the count of live runs with that id is 0 in both, a typed answer."""
    DagRuns({(DAG, "r2"): "running"}).install(monkeypatch)
    assert dag_run_is_live(lease("r1")) is False
    assert dag_run_is_live(lease("r2")) is True


def test_an_unanswered_liveness_question_is_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
    from airflow.sdk.execution_time.comms import ErrorResponse
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    def down(**kwargs: Any) -> int:
        raise AirflowRuntimeError(ErrorResponse(error=ErrorType.API_SERVER_ERROR, detail={"status_code": 503}))

    monkeypatch.setattr(RuntimeTaskInstance, "get_dr_count", staticmethod(down))
    with pytest.raises(AirflowRuntimeError):
        dag_run_is_live(lease("r1"))
