"""The last line a failed kafka2pc task logs, the one a user reads first: the run's state, from what
the task saw (it may not reach Kafka now), and the next click. Built here only, for the prepare,
the commit and the recovery sensor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    MalformedCommittableError,
    OffsetsNotMovedError,
    RunAbortedError,
    SecondExportError,
    TransactionLostError,
    acknowledge_command,
    loss_next_step,
)
from airflow_provider_kafka2pc.txn.two_phase.commit_progress import CommitProgress

_FIX_THE_CONNECTION = frozenset(
    {
        "KafkaAuthenticationError",
        "KafkaTlsError",
        "KafkaAuthorizationError",
        "ClientConfigError",
        "UnmappableConfigError",
        "Kafka2PCConfigError",
    }
)


def loss_next_steps(error: TransactionLostError) -> str:
    """How to repair (or else acknowledge) every run with lost transactions."""
    runs = sorted({(t.prefix, t.run) for t in error.lost if t.prefix and t.run})
    if not runs:
        return "re-export the lost partitions, then acknowledge the loss with `kafka2pc acknowledge`"
    return "; and ".join(f"for run {r}, {loss_next_step(p, r)}" for p, r in runs)


def prepare_failure_line(run: str, prefix: str, error: BaseException, seen: Mapping[str, Any]) -> str:
    """The state a failed prepare leaves, from what it saw (it cannot ask Spark or Kafka now)."""
    if seen.get("repairing"):
        return (
            f"repair of run {run} (exporter {prefix}) failed ({type(error).__name__}): the run is not REPAIRED; "
            "the error above says how far it got (refused or failed before its decision: nothing of it is visible "
            "and it is aborted; decided: its transactions are committed by the next pass, and part of them may be "
            "visible already). Next: fix the cause and clear this task again, which finishes a decided repair or "
            "replaces an undecided one; acknowledge the loss "
            f"(`{acknowledge_command(prefix, run)}`) only if the error says the source changed."
        )
    if isinstance(error, TransactionLostError):  # the run, or an earlier one, lost records: a clear cannot help
        return (
            f"prepare of run {run} (exporter {prefix}) refused: a COMMIT decision in force has transactions that "
            f"can never become visible; nothing was written. Next: {loss_next_steps(error)}."
        )
    if not seen.get("writing"):  # the checks before Spark: the topic, the ACLs, the turn, recovery
        return (
            f"prepare of run {run} (exporter {prefix}) failed ({type(error).__name__}) before its write job "
            "started: nothing was written and no transaction of this run is open. Next: fix the cause above, "
            "then clear this task."
        )
    p = seen.get("progress")
    # What the driver last heard from Spark's status tracker: a partition may have finished since.
    how_far = (
        f"{p.partitions_done} of {p.partitions} partition(s) were written and prepared at the last progress report "
        f"({p.records} records, {time.monotonic() - seen['progress_at']:.0f} s before the failure)"
        if p is not None
        else "before its write job reported progress"
    )
    head = f"prepare of run {run} (exporter {prefix}) failed ({type(error).__name__}) {how_far}"
    if seen.get("aborted"):
        return (
            f"{head}; every transaction the write job opened was aborted at once: nothing is open, nothing is "
            "visible. Next: fix the cause, then clear the whole DAG run to export it again."
        )
    if p is None and "aborted" not in seen:
        opened = "it may have opened transactions (none if it failed before writing)"
    else:
        opened = "their transactions stay open, nothing of the run is visible"
    return (
        f"{head}; {opened}. The abort task of this run aborts what it opened once every export has finished; "
        f"`kafka2pc list --prefix {prefix}` shows what is open. Next: after the abort task, clear the whole DAG run."
    )


def commit_failure_line(progress: CommitProgress, error: BaseException) -> str:
    """What a failed commit says last: the run's state after ``error`` and the next step."""
    run = f"run {progress.run}"
    if isinstance(error, TransactionLostError):
        seen = "; ".join(v.sentence() for v in error.visibility) or f"{len(error.lost)} transaction(s) lost"
        return (
            f"{run}: decided COMMIT, and part of it can never become visible: {seen}. Next: {loss_next_steps(error)}."
        )

    if isinstance(error, OffsetsNotMovedError):
        return (
            f"{run}: committed, its output is visible, but its source's consumer group did not move with it (the "
            "error above names the partitions). Next: run the kafka-consumer-groups commands it gives before the "
            "exporter's next run, which refuses until then; clearing this task changes nothing."
        )
    if isinstance(error, SecondExportError):
        return (
            f"{run}: already decided by its first COMMIT ({progress.decision_id or 'see the error'}); these "
            f"{progress.transactions} transaction(s) came from a second export of the run and were aborted. The run "
            "stays as its first decision made it. Next: nothing to do for this run."
        )
    if isinstance(error, RunAbortedError | DecisionConflictError):
        return f"{run}: aborted as a whole, nothing of it is visible. Next: clear the whole DAG run to export it again."
    if isinstance(error, MalformedCommittableError):
        return (
            f"{run}: no decision was written: a committable was refused ({type(error).__name__}). Next: check the "
            "export task's XCom, then clear the whole DAG run; what this run left open is ended by its abort task "
            "or the exporter's next recovery, at the latest at its broker deadline."
        )
    waiting = f"{progress.transactions} transaction(s) with {progress.records} records"
    until = _until(progress)
    if progress.decision_id is not None:
        done = f"{progress.committed} of {progress.transactions}" if progress.committed else "none or some"
        return (
            f"{run}: COMMIT {progress.decision_id} is decided, so the whole run becomes visible; {done} of its "
            f"transactions were committed when this failed, the rest are prepared{until}. Next: clear this "
            f"commit task once Kafka answers{' (before that time)' if until else ''}: it commits the rest."
        )
    if not progress.log_read and not progress.first_try:
        return (
            f"{run}: the decision log could not be read, so it is not known whether an earlier try of this task "
            f"decided the run ({_describe(progress)} shows it); {waiting} are prepared{until}. Next: clear this "
            "commit task after Kafka is back: it finishes the run whichever way it went."
        )
    if progress.decision_sent:
        return (
            f"{run}: the COMMIT decision was sent but Kafka did not confirm it, so it may or may not be written; "
            f"{waiting} are prepared{until}. Next: clear this commit task after Kafka is back: it finishes the "
            f"run whichever way it went ({_describe(progress)} shows the decision)."
        )
    before = " and before then" if until else ""
    return (
        f"{run}: no decision was written; {waiting} are prepared, not visible,"
        f"{until or ' until their broker deadline'}. Next: clear this commit task after Kafka is back{before}; "
        "past it the broker aborts them and the whole DAG run must be cleared."
    )


def _until(progress: CommitProgress) -> str:
    if progress.deadline_ms is None:
        return ""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(progress.deadline_ms / 1000))
    return f" until {at}" if progress.deadline_exact else f" until at least {at}"


def _describe(progress: CommitProgress) -> str:
    return " or ".join(f"`kafka2pc describe --prefix {p}`" for p in progress.prefixes) or "`kafka2pc describe`"


def recovery_failure_line(prefix: str, conn_id: str, error: BaseException, cause: str = "") -> str:
    """What a failed recovery leaves and the next click. ``cause``: the class name of the error the
    trigger met (deferrable mode hands the task only its message)."""
    cause = cause or type(error).__name__
    # A cleared run may have been decided before: this attempt only wrote nothing of its own.
    head = f"recovery of exporter {prefix} failed ({cause}) before this run's prepare started"
    if cause == "TransactionLostError" and not isinstance(error, TransactionLostError):
        return (
            f"{head}. A run of the exporter lost records (the error names them, with the `kafka2pc repair` and "
            "`kafka2pc acknowledge` commands). Next: repair that run (clear its export task, or `kafka2pc repair`), "
            "or acknowledge its loss, then clear this task."
        )
    if cause in _FIX_THE_CONNECTION:
        return f"{head}. Next: fix connection {conn_id!r} as the error says, then clear this task."
    if isinstance(error, TransactionLostError):
        seen = "; ".join(v.sentence() for v in error.visibility) or f"{len(error.lost)} transaction(s) lost"
        return (
            f"{head}. A run of the exporter lost records: {seen}. Next: {loss_next_steps(error)}; then clear this task."
        )
    if type(error).__name__ == "AirflowSensorTimeout":
        return (
            f"{head}; it waited past its timeout for the exporter's transactions to end, or for another run "
            f"holding the exporter's ids (the lines above say which). Next: let that run finish (`kafka2pc list "
            f"--prefix {prefix}` shows what is open), then clear this task."
        )
    return (
        f"{head}; earlier runs' open transactions stay as they are (`kafka2pc list --prefix {prefix}` shows "
        "them). Next: clear this task once Kafka answers."
    )


__all__ = ["commit_failure_line", "prepare_failure_line", "recovery_failure_line"]
