"""The line a failed commit task ends with: the run's state and the next click, from how far it got."""

from __future__ import annotations

from airflow_provider_kafka2pc.operators.failure_lines import commit_failure_line
from airflow_provider_kafka2pc.txn.protocol.errors import (
    BrokerUnavailableError,
    LostTransaction,
    RunAbortedError,
    StaleCommittableError,
    TransactionLostError,
    Visibility,
)
from airflow_provider_kafka2pc.txn.two_phase.commit_progress import CommitProgress
from tests.unit.fakes import committable

T0 = 1_790_000_000_000  # 2026-09-21 14:13:20 UTC


def progress() -> CommitProgress:
    cs = [committable(f"orders-{i}", records=250) for i in range(4)]
    cs = [c.__class__(**{**c.__dict__, "first_write_ms": T0, "transaction_timeout_ms": 60_000}) for c in cs]
    return CommitProgress.of("dag/run-1", ["orders"], cs)


def test_kafka_down_before_the_decision_says_nothing_is_decided_how_many_wait_until_when_and_what_to_click() -> None:
    p = progress()
    p.first_try = True  # no earlier try could have decided (or the log was read: p.log_read)
    line = commit_failure_line(p, BrokerUnavailableError("cannot reach Kafka"))
    assert line == (
        "run dag/run-1: no decision was written; 4 transaction(s) with 1000 records are prepared, not visible, until "
        "at least 2026-09-21 14:14:20 UTC. Next: clear this commit task after Kafka is back and before then; past it "
        "the broker aborts them and the whole DAG run must be cleared."
    )


def test_the_broker_deadline_once_seen_is_exact() -> None:
    p = progress()
    p.log_read = True
    p.saw_deadlines([T0 + 90_000, None, T0 + 75_000])
    assert "until 2026-09-21 14:14:35 UTC." in commit_failure_line(p, TimeoutError())


def test_a_retry_that_could_not_read_the_log_does_not_claim_there_is_no_decision() -> None:
    line = commit_failure_line(progress(), BrokerUnavailableError("x"))
    assert "it is not known whether an earlier try of this task decided the run" in line
    assert "no decision was written" not in line


def test_a_decision_sent_and_not_confirmed_may_be_written() -> None:
    p = progress()
    p.log_read, p.decision_sent = True, True
    line = commit_failure_line(p, BrokerUnavailableError("x"))
    assert "may or may not be written" in line and "`kafka2pc describe --prefix orders`" in line
    assert "clear this commit task after Kafka is back" in line


def test_a_decided_run_is_rolled_forward_by_a_clear() -> None:
    p = progress()
    p.decision_id, p.committed = "d" * 32, 1
    line = commit_failure_line(p, BrokerUnavailableError("x"))
    assert line.startswith(f"run dag/run-1: COMMIT {'d' * 32} is decided, so the whole run becomes visible; 1 of 4")
    assert "clear this commit task once Kafka answers (before that time): it commits the rest." in line


def test_outcomes_that_need_the_whole_run_cleared_or_an_acknowledgement() -> None:
    assert "aborted as a whole, nothing of it is visible. Next: clear the whole DAG run" in commit_failure_line(
        progress(), RunAbortedError("dag/run-1", 4, 1000, [], "")
    )
    assert "no decision was written: a committable was refused (StaleCommittableError)" in commit_failure_line(
        progress(), StaleCommittableError("x")
    )
    lost = LostTransaction("orders-3", 7, 0, 250, ("t-0",), "aborted", "orders", "dag/run-1")
    seen = Visibility("orders", "dag/run-1", 4, 1000, 3, 750, 1, 250)
    line = commit_failure_line(progress(), TransactionLostError([lost], [seen]))
    assert "3 of 4 transaction(s) visible (750 of 1000 records), 1 lost (250 records)" in line
    assert line.endswith("`kafka2pc acknowledge --prefix orders --run dag/run-1`.")


def test_the_recovery_sensor_says_nothing_of_this_run_was_decided_and_what_to_click() -> None:
    from airflow.sdk.exceptions import AirflowSensorTimeout

    from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthenticationError

    sensor = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders")
    down = sensor.failure_line(BrokerUnavailableError("cannot reach Kafka"))
    assert down.startswith("recovery of exporter orders failed (BrokerUnavailableError) before this run's prepare")
    assert down.endswith("Next: clear this task once Kafka answers.")
    assert "fix connection 'kafka2pc_default'" in sensor.failure_line(KafkaAuthenticationError("x"))
    assert "waited past its timeout" in sensor.failure_line(AirflowSensorTimeout("x"))
    lost = LostTransaction("orders-3", 7, 0, 250, ("t-0",), "aborted", "orders", "dag/run-0")
    line = sensor.failure_line(
        TransactionLostError([lost], [Visibility("orders", "dag/run-0", 4, 1000, 3, 750, 1, 250)])
    )
    assert "A run of the exporter lost records: run dag/run-0 of exporter orders: 3 of 4 transaction(s) visible" in line
    assert "for run dag/run-0, repair the run: clear its export task" in line
    assert "`kafka2pc repair --prefix orders --run dag/run-0 --source MODULE:NAME`" in line
    assert "`kafka2pc acknowledge --prefix orders --run dag/run-0`; then clear this task." in line


def test_the_deferred_sensor_names_the_cause_the_trigger_met() -> None:
    from airflow_provider_kafka2pc.exceptions import RecoveryError
    from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

    sensor = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders")
    wrapped = RecoveryError("recovery of orders failed: TransactionLostError: 1 transaction(s) …")
    assert "Next: repair that run (clear its export task, or `kafka2pc repair`), or acknowledge its loss" in (
        sensor.failure_line(wrapped, "TransactionLostError")
    )
    assert "fix connection 'kafka2pc_default'" in sensor.failure_line(wrapped, "KafkaTlsError")
    assert sensor.failure_line(wrapped, "BrokerUnavailableError").endswith("clear this task once Kafka answers.")


def test_a_failed_repair_says_the_run_is_not_repaired_how_far_it_got_and_the_next_click() -> None:
    from airflow_provider_kafka2pc.operators.failure_lines import prepare_failure_line
    from airflow_provider_kafka2pc.txn.protocol.errors import RepairRefusedError

    line = prepare_failure_line("dag/r1", "orders", RepairRefusedError("the source changed"), {"repairing": True})
    assert line.startswith(
        "repair of run dag/r1 (exporter orders) failed (RepairRefusedError): the run is not REPAIRED"
    )
    assert "decided: its transactions are committed by the next pass, and part of them may be visible" in line
    assert line.endswith(
        "acknowledge the loss (`kafka2pc acknowledge --prefix orders --run dag/r1`) only if the error says the source "
        "changed."
    )
    plain = prepare_failure_line("dag/r1", "orders", RuntimeError("x"), {})
    assert plain.startswith("prepare of run dag/r1 (exporter orders) failed (RuntimeError) before its write job")
