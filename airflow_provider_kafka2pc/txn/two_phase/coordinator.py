"""The two-phase-commit coordinator: finishing prepared transactions from another process (DESIGN §4-§6).

Not Kafka's transaction coordinator (the broker that owns a transactional id, found by
``txn/kafka/transactions.py``): this module decides for a run and tells those brokers.

``TransactionResolver`` ends transactions by (transactional id, producer id, epoch) over the
public wire protocol and classifies every result by the outcome table. ``commit_prepared`` and
``abort_prepared`` are the two halves of the coordinator's second phase: decision first, then
EndTxn, then the final record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog, KeepRun
from airflow_provider_kafka2pc.txn.kafka.transactions import OPEN_STATES
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    SecondExportError,
    StaleCommittableError,
    TransactionLostError,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    Observation,
    TxnRef,
    Verdict,
)
from airflow_provider_kafka2pc.txn.protocol.records import (
    Covered,
    DecisionRecord,
    Kind,
    RunRecord,
    RunStatus,
    new_decision,
    prefix_of,
    run_key,
)
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
from airflow_provider_kafka2pc.txn.two_phase import visibility
from airflow_provider_kafka2pc.txn.two_phase.commit_progress import CommitProgress
from airflow_provider_kafka2pc.txn.two_phase.doomed import aborted_whole, commit_headroom, doomed_of
from airflow_provider_kafka2pc.txn.two_phase.loss_proof import FORGOTTEN
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver, check_unique
from airflow_provider_kafka2pc.txn.two_phase.ruling import (
    CommitReport,
    abort_reopened,
    committed_in,
    covered,
    deadline_of,
    lost_of_decisions,
    lost_of_run,
    now_ms,
    obey,
    ref_of,
)
from airflow_provider_kafka2pc.txn.two_phase.ruling import (
    iso as _iso,
)
from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard

log = logging.getLogger(__name__)


@dataclass
class Decided:
    """The first half of a commit: the run's COMMIT in force, read back from the log."""

    state: LogState
    decision: DecisionRecord
    resolver: TransactionResolver


class CommitOptions(TypedDict, total=False):
    """The options ``commit_prepared`` hands to ``decide_commit``, which documents and defaults them."""

    max_workers: int
    prefixes: Sequence[str | naming.Members]
    end_txn_timeout_s: float
    headroom_ms: int | None
    progress: CommitProgress | None
    guard: SourceGuard | None
    sources: Mapping[str, SourceRange] | None


def commit_prepared(
    committables: Sequence[Committable],
    wire: WireClient,
    decision_log: DecisionLog,
    run: str,
    **options: Unpack[CommitOptions],
) -> CommitReport:
    """Phase two, COMMIT, by the protocol of DESIGN §3a, with ``decide_commit``'s options.
    ``progress`` records how far it got, for the line a failed commit task ends with
    (``txn.two_phase.commit_progress``).

    1. The run's own record says it is final → answer from it ("already committed", or the loss),
       writing nothing: a clear of an old run never writes over newer runs' state. Only handed
       transactions still open under their own producer id and epoch (a second export of the
       finished run) are aborted, and ``DecisionConflictError`` says so.
    2. Every transaction is described. If one can no longer commit (aborted, timed out, fenced,
       within the commit's headroom of its broker deadline: ``headroom_ms``, else
       ``txn.protocol.window.commit_headroom_ms`` bounded by the commit's own timeouts), the whole run is
       aborted: ABORT is appended, read back, obeyed, and ``RunAbortedError`` says why (nothing
       of it is visible: not a loss); or, if an
       earlier decision rules them by then (recovery's ABORT, appended since step 1's read),
       ``DecisionConflictError`` names it, as in step 3. ``guard`` (a Kafka source's: its group's
       offsets did not move, and are sent into the open offsets participant again, so that they are
       the group's latest write) may doom transactions too. The COMMIT records ``sources`` (each
       exporter's Kafka source range), and so does the run record.
    3. Otherwise one COMMIT for the whole run is appended (or the run's earlier COMMIT reused, on
       a retry) and read back. If an earlier decision rules any transaction of it, the COMMIT is
       void: the run is aborted the same way and ``DecisionConflictError`` names who won.
    4. EndTxn for all, in parallel; outcomes recorded; the run collapses to its run record.
       A transaction lost after the decision raises ``TransactionLostError``; a committed offsets
       participant whose group is not at the run's ends (a regular commit landed after the guard's
       resend) raises ``OffsetsNotMovedError`` with the commands that move it.
    """
    decided = decide_commit(committables, wire, decision_log, run, **options)
    if isinstance(decided, CommitReport):
        return decided
    state, did = decided.state, decided.decision.decision_id
    resolutions = obey(decision_log, state, [did], decided.resolver)
    if (progress := options.get("progress")) is not None:
        progress.committed = sum(1 for r in resolutions if r.outcome is Verdict.COMMITTED)
    lost = lost_of_decisions(state, [did])
    if lost:
        seen = [visibility.of_decision(state, did, p)[0] for p in _prefixes(decided.decision)]
        raise TransactionLostError(lost, seen)
    if (guard := options.get("guard")) is not None:
        # Not what the markers proved committed: its id moved on, so later runs moved the group on too.
        ours = [r for r in resolutions if r.outcome is Verdict.COMMITTED and r.observation not in FORGOTTEN]
        guard.after_commit(run, [r.ref.transactional_id for r in ours])
    return CommitReport(tuple(resolutions), committed=all(r.outcome is Verdict.COMMITTED for r in resolutions))


def decide_commit(
    committables: Sequence[Committable],
    wire: WireClient,
    decision_log: DecisionLog,
    run: str,
    max_workers: int = 16,
    prefixes: Sequence[str | naming.Members] = (),
    end_txn_timeout_s: float = 60.0,
    headroom_ms: int | None = None,
    progress: CommitProgress | None = None,
    guard: SourceGuard | None = None,
    sources: Mapping[str, SourceRange] | None = None,
    look_again: bool = True,
) -> Decided | CommitReport:
    """Steps 1-3 of ``commit_prepared``: a COMMIT in force for the run, or the report of why not.
    ``look_again``: transactions found doomed send it back to step 1 once if the log, read afresh,
    holds the run's decision (a twin decided it while this one was paused)."""
    refs = [ref_of(c) for c in committables]
    check_unique(refs)
    exporters = _members(prefixes)
    if exporters:  # before anything is read or decided: another exporter's committable is never decided
        naming.check_members((r.transactional_id for r in refs), exporters)
    by_tid = {c.transactional_id: c for c in committables}
    # Every run gets a run record per exporter, derived from the ids if the caller named none.
    run_prefixes = sorted(
        {m.prefix for m in exporters} | {p for c in committables if (p := prefix_of(c.transactional_id))}
    )
    keep = decision_log.keep_run_of(run_prefixes, run)
    state = decision_log.read(keep_run=keep, history={run_key(p, run) for p in run_prefixes})
    finished = [f for p in run_prefixes if (f := state.runs.get((p, run))) is not None]
    if progress is not None:
        progress.log_read = True
        progress.decision_id = next((f.decision_id for f in finished if f.decision_id), None)
    resolver = TransactionResolver(wire, committed_in(state), max_workers=max_workers, timeout_s=end_txn_timeout_s)
    if run_prefixes and len(finished) == len(run_prefixes) and all(f.status is not RunStatus.DECIDED for f in finished):
        # Final: answer from the run record. The handed transactions are the run's own, long ended
        # (their ids may be a newer run's by now, under another epoch: never touched), unless the
        # broker shows them open with exactly this producer id and epoch: a second export of the run,
        # aborted here even if an ABORT already rules it (its writer may have died before obeying).
        observed = resolver.observe_all(refs)
        second = [r for r in refs if observed[r.transactional_id][0] is Observation.OPEN]
        if not second:
            if guard is not None:  # a retry or clear stays red while the run's group is behind
                guard.still_behind(run)
            return answer_from_run_records(run, finished)
        _abort_run(decision_log, resolver, second, observed, run, by_tid)
        raise _second_export(run, finished[0], len(second))

    mine = state.commit_of_run(run, refs)
    if mine is None:
        ruled = {r: state.ruled_by(r) for r in refs if state.ruled_by(r) is not None}
        observed = resolver.observe_all(refs)
        if progress is not None:
            progress.saw_deadlines(deadline_of(s) for _, s in observed.values())

        def followed() -> Decided | CommitReport | None:
            """What this reading makes of the transactions (doomed, another producer's) is not the
            answer if a twin of this task (a retry, while this one was paused) decided the run, and
            may have committed it, since this one read the log: then its decision is."""
            if not (look_again and _decided_since(decision_log, keep, run_prefixes, run, refs)):
                return None
            log.info("run %s was decided by another process since this commit read the log: following it", run)
            return decide_commit(
                committables, wire, decision_log, run, max_workers=max_workers, prefixes=prefixes,
                end_txn_timeout_s=end_txn_timeout_s, headroom_ms=headroom_ms, progress=progress, guard=guard,
                sources=sources, look_again=False,
            )  # fmt: skip

        try:
            check_current_producers(refs, observed, run_prefixes)
        except StaleCommittableError:
            if (answer := followed()) is not None:  # its ids taken anew since the twin committed them
                return answer
            raise
        decided = [st for p in run_prefixes if (st := state.run_status(p, run)) is not None]
        if decided:  # the run is decided with other transactions: these are a second export of it
            _abort_run(decision_log, resolver, refs, observed, run, by_tid)
            raise _second_export(run, decided[0], len(refs))
        if ruled:  # decided before we got here: by another actor (ABORT), or by another run
            return _abort_run(decision_log, resolver, refs, observed, run, by_tid, conflict=ruled)
        headroom = commit_headroom(len(refs), max_workers, decision_log.budget_s, end_txn_timeout_s, headroom_ms)
        doomed = doomed_of(refs, observed, headroom)
        moved, group_moved = guard.before_decision(wire) if guard is not None and not doomed else ({}, False)
        if guard is not None and not doomed and not moved:
            doomed = doomed_of(refs, observed, headroom)  # the guard's own time counts against the deadline
        if (doomed or moved) and (answer := followed()) is not None:
            return answer
        if doomed or moved:
            log.error("run %s cannot commit atomically (%d doomed); aborting all of it", run, len(doomed or moved))
            # Recovery may have decided ABORT and ended them since the log was read: then it won.
            _abort_run(decision_log, resolver, refs, observed, run, by_tid, name_earlier=True)
            raise aborted_whole(run, by_tid, doomed or moved, observed, moved=group_moved)
        decision = new_decision(
            Kind.COMMIT,
            (covered(c, observed[c.transactional_id][1]) for c in committables),
            run,
            "commit",
            run_prefixes,
            now_ms(),
            sources,
        )
        log.info("appending the COMMIT decision for run %s (%d transaction(s))", run, len(refs))
        if progress is not None:
            progress.decision_sent = True
        state = decision_log.decide(decision, keep_run=keep)
        # A twin of this task (a zombie, a concurrent retry) may have decided the same run first: obey it.
        mine = decision if state.in_force(decision.decision_id) else state.commit_of_run(run, refs)
        if progress is not None:
            progress.decision_sent, progress.decision_id = False, mine.decision_id if mine is not None else None
        if mine is None:
            return _abort_run(decision_log, resolver, refs, observed, run, by_tid, void=decision)
        _log_decision(mine, committables, state, "" if mine is decision else "appended first by a twin of this task")
    else:
        if progress is not None:
            progress.decision_id = mine.decision_id
        _log_decision(mine, committables, state, "appended by an earlier try")
    resolver.committed_in_log = committed_in(state)
    return Decided(state, mine, resolver)


def _decided_since(
    decision_log: DecisionLog, keep: KeepRun, run_prefixes: Sequence[str], run: str, refs: Sequence[TxnRef]
) -> bool:
    """Whether the log read afresh holds a decision of this run: a run record, or a COMMIT of these
    transactions in force."""
    state = decision_log.read(keep_run=keep, history={run_key(p, run) for p in run_prefixes})
    return any(state.runs.get((p, run)) is not None for p in run_prefixes) or state.commit_of_run(run, refs) is not None


def _prefixes(d: DecisionRecord) -> list[str]:
    return sorted(set(d.prefixes) | {p for c in d.txns if (p := prefix_of(c.transactional_id))})


def _members(prefixes: Sequence[str | naming.Members]) -> list[naming.Members]:
    return [p if isinstance(p, naming.Members) else naming.Members(naming.validate_prefix(p)) for p in prefixes]


def check_current_producers(
    refs: Sequence[TxnRef], observed: Mapping[str, tuple[Observation, TxnState | None]], prefixes: Sequence[str]
) -> None:
    """Refuse, before any decision, a committable the broker knows under another producer id or an
    older epoch than the committable claims: it was edited, or is another producer's. An older epoch
    of the same producer id is not this: the broker's timeout or a newer run of the id moved it on,
    and the run is aborted whole (``RunAbortedError``)."""
    for ref in refs:
        s = observed[ref.transactional_id][1]
        if s is None:
            continue
        # Same producer: an epoch the broker never gave out. Another producer id with an open
        # transaction: not ours. With a finished one, the id may have expired and been taken anew
        # since (an old run cleared late): superseded, aborted whole like a timeout.
        same = s.producer_id == ref.producer_id
        if not (s.producer_epoch < ref.producer_epoch if same else s.state in OPEN_STATES):
            continue
        shows = " or ".join(f"`kafka2pc list --prefix {p}`" for p in prefixes) or "`kafka2pc list`"
        raise StaleCommittableError(
            f"committable {ref.transactional_id!r} names producer id {ref.producer_id}, epoch {ref.producer_epoch}, "
            f"but the broker's producer of that id is {s.producer_id}, epoch {s.producer_epoch} ({s.state}): the "
            "committable was edited, or it is another producer's. Nothing was decided. What the run left open is "
            "ended by its abort task or the exporter's next recovery, at the latest at its broker deadline "
            f"({shows} shows it); check the export task's XCom, then clear the whole DAG run to export again"
        )


def _second_export(run: str, first: RunRecord, count: int) -> SecondExportError:
    return SecondExportError(
        f"run {run} already has a COMMIT decision ({first.decision_id}, {first.transactions} transactions, "
        f"{first.status.value}) for other transactions than these {count}: they come from a second export of the "
        "run (an export cleared while, or after, the run's commit went on). They were aborted; the run stays as its "
        "first decision made it."
    )


def _log_decision(decision: DecisionRecord, committables: Sequence[Committable], state: LogState, note: str) -> None:
    """The one line that says the run is decided, before the first EndTxn."""
    topics = sorted({t for c in committables for t in c.topics})
    offset = state.offsets.get(decision.decision_id)
    log.info(
        "decision: COMMIT %s for run %s: %d transaction(s), %d records, topics %s, at offset %s%s: "
        "from here on the run becomes visible",
        decision.decision_id,
        decision.run,
        len(committables),
        sum(c.records for c in committables),
        ", ".join(topics),
        "?" if offset is None else offset,
        f" ({note})" if note else "",
    )


def answer_from_run_records(run: str, records: Sequence[RunRecord]) -> CommitReport:
    """A finished run's answer, from its final records (COMMITTED, REPAIRED, ACKNOWLEDGED; LOST
    raises): the commit of a cleared run says this first and writes nothing."""
    lost = [t for rec in records if rec.status is RunStatus.LOST for t in lost_of_run(rec)]
    if lost:
        raise TransactionLostError(lost, [visibility.of_run_record(r) for r in records if r.status is RunStatus.LOST])
    note = "; ".join(_finished(r) for r in records)
    log.info("run %s: %s; nothing to do", run, note)
    return CommitReport((), note=note, committed=all(r.whole for r in records))


def _finished(rec: RunRecord) -> str:
    """What a finished run's record says is visible; an acknowledged loss is still a loss."""
    lost = sum(t.covered.records for t in rec.lost)
    if rec.status is RunStatus.ACKNOWLEDGED:
        return (
            f"exporter {rec.prefix}: its loss was acknowledged ({rec.note or 'no note'}): {rec.records - lost} of "
            f"{rec.records} records are visible, {lost} were lost"
        )
    if rec.status is RunStatus.REPAIRED and rec.repair is not None:
        r = rec.repair
        return (
            f"repaired: all {rec.records} records in {rec.transactions} transactions of exporter {rec.prefix} are "
            f"visible once; {r.restored} of them were lost after decision {rec.decision_id} and exported again, the "
            f"last time by repair decision {r.decision_id} ({r.actor}, final at {_iso(r.at_ms)}), so the run became "
            "visible in steps, not atomically"
        )
    decided = f", final at {_iso(rec.at_ms)}" if rec.at_ms > 0 else ""  # when its run record was written
    return (
        f"already {rec.status.value.lower()}: {rec.records} records in {rec.transactions} transactions of exporter "
        f"{rec.prefix}{decided} (decision {rec.decision_id or 'of 0.1.0'})"
    )


def _abort_run(
    decision_log: DecisionLog,
    resolver: TransactionResolver,
    refs: Sequence[TxnRef],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
    run: str,
    by_tid: Mapping[str, Committable],
    conflict: Mapping[TxnRef, DecisionRecord | None] | None = None,
    void: DecisionRecord | None = None,
    name_earlier: bool = False,
) -> CommitReport:
    """Abort every transaction of the run (ABORT appended and read back first), and say who won:
    ``conflict`` names the earlier decisions known before; with ``name_earlier``, any decision
    found ruling them when this ABORT is read back counts as one."""
    decision = new_decision(
        Kind.ABORT,
        (covered(by_tid[r.transactional_id], observed[r.transactional_id][1]) for r in refs),
        run,
        "commit",
        (),
        now_ms(),
    )
    state = decision_log.decide(decision)
    if void is not None:
        conflict = {c.ref: state.ruled_by(c.ref) for c in void.txns if state.ruled_by(c.ref) not in (None, decision)}
    elif name_earlier:
        conflict = {r: state.ruled_by(r) for r in refs if state.ruled_by(r) not in (None, decision)} or None
    resolver.committed_in_log = committed_in(state)
    rulers = [d.decision_id for d in (state.ruled_by(r) for r in refs) if d is not None]
    # The void COMMIT rules nothing: obey retires it at once (bounded log).
    resolutions = obey(decision_log, state, rulers + ([void.decision_id] if void is not None else []), resolver)
    if void is not None and not conflict:  # void by the deadline rule: no other decision won, time ran out
        why = state.void.get(void.decision_id, "appended after a broker deadline")
        raise aborted_whole(run, by_tid, dict.fromkeys(by_tid, f"COMMIT {why}"), observed, timed_out=True)
    if conflict is None:
        return CommitReport(tuple(resolutions))
    winners = {d.decision_id: d for d in conflict.values() if d is not None}
    who = "; ".join(
        f"{d.kind.value} {d.decision_id} by {d.actor} for {d.run} at {_iso(d.at_ms)}" for d in winners.values()
    )
    committed_elsewhere = [r for r in resolutions if r.outcome is Verdict.COMMITTED]
    raise DecisionConflictError(
        f"run {run} was not committed: an earlier decision in the decision log covers "
        f"{len(conflict)} of its {len(refs)} transaction(s) ({who}). First decision wins, so this run was aborted "
        f"as a whole and none of its records are visible"
        + (
            f" (except {len(committed_elsewhere)} transaction(s) that another run's COMMIT rules: "
            "its committables do not belong to this run)"
            if committed_elsewhere
            else ""
        )
        + ". Clear the whole DAG run to export it again."
    )


def abort_prepared(
    committables: Sequence[Committable] | Sequence[TxnRef] | Sequence[Covered],
    wire: WireClient,
    decision_log: DecisionLog,
    run: str,
    max_workers: int = 16,
    actor: str = "abort",
    prefixes: Sequence[str | naming.Members] = (),
) -> CommitReport:
    """Phase two, ABORT: append ABORT for what has no decision yet, read back, obey the first
    decision of each transaction. One whose first decision is COMMIT is rolled forward, never aborted.
    With ``prefixes``, a committable of another exporter (or run) is refused before anything is
    decided, as is one the broker knows under another producer (``check_current_producers``)."""
    refs = [_as_ref(c) for c in committables]
    check_unique(refs)
    exporters = _members(prefixes)
    if exporters:
        naming.check_members((r.transactional_id for r in refs), exporters)
    state = decision_log.read(history=())
    resolver = TransactionResolver(wire, committed_in(state), max_workers=max_workers)
    undecided = [r for r in refs if r not in state.ruling]
    if undecided:
        observed = resolver.observe_all(undecided)
        check_current_producers(undecided, observed, [m.prefix for m in exporters])
        known = {_as_ref(c).transactional_id: c for c in committables}
        decision = new_decision(
            Kind.ABORT,
            (_covered_any(known[r.transactional_id], observed[r.transactional_id][1]) for r in undecided),
            run,
            actor,
            (),
            now_ms(),
        )
        state = decision_log.decide(decision)
        resolver.committed_in_log = committed_in(state)
    rulers = [d.decision_id for d in (state.ruled_by(r) for r in refs) if d is not None]
    forward = [r.transactional_id for r in refs if (d := state.ruled_by(r)) is not None and d.kind is Kind.COMMIT]
    if forward:
        log.warning(
            "rolling forward %d transaction(s) whose first decision is COMMIT: %s", len(forward), ", ".join(forward)
        )
    resolutions = obey(decision_log, state, rulers, resolver)
    return CommitReport(tuple(resolutions + abort_reopened(resolver, state, refs, resolutions)))


def _as_ref(c: Committable | TxnRef | Covered) -> TxnRef:
    return c if isinstance(c, TxnRef) else ref_of(c)


def _covered_any(c: Committable | TxnRef | Covered, s: TxnState | None) -> Covered:
    if isinstance(c, Committable):
        return covered(c, s)
    if isinstance(c, Covered):
        return c
    return Covered(c.transactional_id, c.producer_id, c.producer_epoch, 0, (), deadline_of(s))


__all__ = [
    "CommitOptions",
    "Decided",
    "abort_prepared",
    "answer_from_run_records",
    "check_current_producers",
    "commit_prepared",
    "decide_commit",
]
