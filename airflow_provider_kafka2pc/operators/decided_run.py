"""What a prepare-side task does for a run the decision log already decided: skip, or fail if lost.

The export task and the handoff sensor both stand in for the run's prepare; a clear of a decided
run must never prepare it again, and the commit and abort downstream read why from ``SKIPPED_KEY``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord


def skip_or_fail(context: Context, prefix: str, run: str, status: RunRecord, log: Any) -> None:
    """A run the decision log already decided is never exported again; a lost one is loud."""
    from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
    from airflow_provider_kafka2pc.txn.two_phase.ruling import lost_of_run
    from airflow_provider_kafka2pc.txn.two_phase.visibility import of_run_record

    if status.status is RunStatus.LOST:
        raise TransactionLostError(lost_of_run(status), [of_run_record(status)])
    if status.status is RunStatus.ACKNOWLEDGED:
        log.warning("run %s of %s lost transactions and an operator acknowledged it: %s", run, prefix, status.note)
    # For the abort (not a failure) and the commit (it answers from the run's records).
    context["ti"].xcom_push(key=SKIPPED_KEY, value={"status": status.status.value, "prefix": prefix})
    reason = (
        f"run {run} of exporter {prefix!r} already reached its COMMIT decision ({status.status.value}: "
        f"{status.records} records in {status.transactions} transactions); exporting it again would "
        "duplicate it, so this prepare is skipped and nothing is written. Start a new DAG run to export again."
    )
    log.info("kafka2pc: %s", reason)  # the skip's reason is otherwise only in the collapsed post-execute group
    raise AirflowSkipException(reason)
