"""Why a run can no longer commit, and the error that says so.

``doomed_of`` finds the transactions of a run that cannot commit any more (not open for their own
producer, or too close to their broker deadline for the commit's headroom); ``aborted_whole`` is
the ``RunAbortedError`` of a run its commit aborted as a whole for them (or for a guard's reason,
such as a Kafka source's group that moved), with the fix a user needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from airflow_provider_kafka2pc.txn.kafka.wire import TxnState
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import LostTransaction, RunAbortedError
from airflow_provider_kafka2pc.txn.protocol.outcome import Observation, TxnRef, reason
from airflow_provider_kafka2pc.txn.protocol.window import commit_headroom_ms
from airflow_provider_kafka2pc.txn.two_phase.ruling import deadline_of, now_ms, partitions_of
from airflow_provider_kafka2pc.txn.two_phase.ruling import iso as _iso


def commit_headroom(
    transactions: int, max_workers: int, log_budget_s: float, end_txn_timeout_s: float, override_ms: int | None = None
) -> Callable[[int], int]:
    """The headroom a commit of ``transactions`` keeps before a broker deadline, by the deadline's
    transaction.timeout.ms; never more than the commit can spend (the decision log's budget, since an
    append waits out a leader change, plus its EndTxn timeout)."""
    worst_case_ms = int((log_budget_s + end_txn_timeout_s) * 1000)
    return lambda timeout_ms: commit_headroom_ms(timeout_ms, transactions, max_workers, override_ms, worst_case_ms)


def doomed_of(
    refs: Sequence[TxnRef],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
    headroom_ms: Callable[[int], int],
    now: int | None = None,
) -> dict[str, str]:
    """The transactions that can no longer commit, and why: not open for this producer, or open
    with less than the commit's headroom (``headroom_ms(transaction.timeout.ms)``) before its deadline."""
    doomed: dict[str, str] = {}
    now = now_ms() if now is None else now
    for ref in refs:
        obs, s = observed[ref.transactional_id]
        if obs is not Observation.OPEN:
            # FENCING: the broker is aborting it on timeout right now; it can only end aborted.
            doomed[ref.transactional_id] = reason(obs)
            continue
        deadline = deadline_of(s)
        if s is not None and deadline is not None and now + (need := headroom_ms(s.timeout_ms)) > deadline:
            doomed[ref.transactional_id] = (
                f"too close to its broker deadline: opened {_iso(s.start_time_ms)} with transaction.timeout.ms="
                f"{s.timeout_ms}, {deadline - now} ms left, and the commit keeps {need} ms of headroom (decision "
                "write + EndTxn)"
            )
    return doomed


def aborted_whole(
    run: str,
    by_tid: Mapping[str, Committable],
    reasons: Mapping[str, str],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
    timed_out: bool = False,
    moved: bool = False,
) -> RunAbortedError:
    """The error of a run aborted whole by its commit; the window is named only when time ran out
    (or may have: a superseded epoch is the broker's timeout or a newer producer of the id), never
    when the guard found the source's group moved (``moved``)."""
    maybe = not timed_out and all(observed[tid][0] is Observation.SUPERSEDED for tid in reasons)
    timed_out = not moved and (timed_out or any(observed[tid][0] in _TIMED_OUT for tid in reasons))
    starts = [s.start_time_ms for _, s in observed.values() if s is not None and s.start_time_ms > 0]
    window = f" (first record {_iso(min(starts))}, commit {_iso(now_ms())})" if starts else ""
    fix = "Clear the whole DAG run to export it again."
    if moved:
        fix = (
            "The group no longer stands where this exporter's runs left it, so the next run refuses it until you "
            "choose: give the export a consumer group of its own, or set accept_gap=True on its KafkaSource for one "
            "run to go on from where the group is now. Then clear the whole DAG run."
        )
    if timed_out:
        fix = (
            ("If no other export of this exporter ran meanwhile (it would fence these ids), its" if maybe else "Its")
            + f" transactions were open too long between their first record and this commit{window}: the broker's "
            "transaction.timeout.ms must cover the export's write phase, the hand-over and every task between "
            "prepare and commit (they run inside the window). " + fix
        )
    return RunAbortedError(
        run, len(by_tid), sum(c.records for c in by_tid.values()), _lost(by_tid, reasons, observed), fix
    )


# Observations that mean the broker's timer ran out (OPEN: within the commit's headroom of it), or
# may have (SUPERSEDED: the epoch moved on, by the timeout or by a newer producer of the id).
_TIMED_OUT = (Observation.OPEN, Observation.FENCING, Observation.SUPERSEDED)


def _lost(
    by_tid: Mapping[str, Committable],
    reasons: Mapping[str, str],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
) -> list[LostTransaction]:
    return [
        LostTransaction(
            tid, c.producer_id, c.producer_epoch, c.records, partitions_of(c, observed[tid][1]), reasons[tid]
        )
        for tid, c in by_tid.items()
        if tid in reasons
    ]
