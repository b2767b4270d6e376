"""What an exporter's state is, as reports: its open transactions with the decisions that rule them
and what recovery would do, its decisions and run records, and its losses counted from the broker.

One implementation for every reader: the ``kafka2pc`` CLI prints these reports (as text or JSON),
the Airflow UI's exporters page shows them. Read-only: nothing here writes to Kafka.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.source_snapshot import group_left_behind
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, acknowledge_command, repair_command
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import DecisionRecord, LostTxn, RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.two_phase import visibility
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryPlan, plan_recovery
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

ACTIONS = {"commit": "roll forward", "abort": "abort", "wait": "wait"}


def exporter_report(
    inspector: TransactionInspector, open_states: Sequence[TxnState], state: LogState, prefix: str
) -> dict[str, Any]:
    """The prefix's open transactions joined with the decisions that rule them, the plan recovery
    would follow, and the losses (``losses_report``)."""
    rows, plan = plan_rows(open_states, state, now_ms())
    return {"transactions": rows, "plan": plan_json(plan)} | losses_report(inspector, state, prefix)


def describe_report(inspector: TransactionInspector, state: LogState, prefix: str) -> dict[str, Any]:
    """The decisions touching the prefix (in force and void; a COMMIT with a loss counted from the
    broker), the prefix's claim and run records, and its losses."""
    losses = losses_report(inspector, state, prefix)["losses"]
    seen = {(f["decision_id"], f["run"]): f for f in losses if not f["final"]}
    mine = touches(prefix)
    decisions = [
        decision_json(state, d, prefix, seen.get((did, d.run)))
        for did, d in state.decisions.items()
        if any(mine(c.transactional_id) for c in d.txns)
    ]
    runs = sorted((r for (p, _), r in state.runs.items() if p == prefix), key=lambda r: (r.at_ms, r.run))
    position = state.last_source(prefix)
    return {
        "claim_owner": state.claims.get(prefix),
        # Where the exporter's Kafka source group stands: its latest run whose offsets committed.
        "source_position": run_json(position) if position is not None else None,
        "open_transactions": len(inspector.list_prefix(prefix)),
        "decisions": decisions,
        "runs": [run_json(r) for r in runs],
        "losses": losses,
    }


def source_report(config: Mapping[str, Any], state: LogState, prefix: str) -> dict[str, Any]:
    """``source_behind``: for an exporter whose latest committed run's output is visible while its
    Kafka source group stands at that run's start (a regular offset commit replaced the run's own),
    the sentence with the commands that move the group; None otherwise (or without a source)."""
    try:
        return {"source_behind": group_left_behind(config, state.last_source(prefix)), "source_unread": None}
    except Kafka2PCError as e:  # the rest of the report stands without it
        return {"source_behind": None, "source_unread": f"the Kafka source's consumer group could not be read: {e}"}


def touches(prefix: str) -> Callable[[str], bool]:
    return lambda tid: naming.belongs_to(tid, prefix)


def losses_report(inspector: TransactionInspector, state: LogState, prefix: str) -> dict[str, Any]:
    """The prefix's losses, counted from the broker (DescribeTransactions of every transaction a COMMIT
    in force still rules) and the run records, before any recovery ran; read-only."""
    unresolved = visibility.unresolved_commits(state, prefix)
    found = visibility.losses(state, prefix, visibility.observe_broker(inspector, unresolved, state))
    return {
        "losses": [loss_json(f) for f in found],
        # The older two views of the same losses, kept for scripts that read them.
        "lost_runs": [loss_json(f) | run_json(state.runs[(prefix, f.visibility.run)]) for f in found if f.final],
        "lost_decisions": [
            decision_ref_json(state.decisions[f.decision_id]) | loss_json(f) for f in found if not f.final
        ],
    }


def loss_json(f: visibility.RunLoss) -> dict[str, Any]:
    v = f.visibility
    return {
        "prefix": v.prefix,
        "run": v.run,
        "decision_id": f.decision_id,
        "final": f.final,
        "transactions": v.transactions,
        "records": v.records,
        "visible_transactions": v.visible_transactions,
        "visible_records": v.visible_records,
        "lost_transactions": v.lost_transactions,
        "lost_records": v.lost_records,
        "pending_transactions": v.pending_transactions,
        "partly_visible": v.partly_visible,
        "summary": v.sentence(),
        "acknowledge": acknowledge_command(v.prefix, v.run),
        "repair": repair_command(v.prefix, v.run),
        "lost": [
            lost_json(t.transactional_id, t.producer_id, t.producer_epoch, t.records, t.topic_partitions, t.reason)
            for t in f.lost
        ],
    }


def plan_rows(states: Sequence[TxnState], state: LogState, now_ms: int) -> tuple[list[dict[str, Any]], RecoveryPlan]:
    plan = plan_recovery(states, state)
    action = {r.transactional_id: ACTIONS["commit"] for r in plan.commit}
    action.update({r.transactional_id: ACTIONS["abort"] for r in plan.abort})
    action.update({tid: ACTIONS["wait"] for tid in plan.wait})
    rows = []
    for s in sorted(states, key=lambda s: id_order(s.transactional_id)):
        ruling = state.ruled_by(ref_of(s))
        rows.append(
            {
                "transactional_id": s.transactional_id,
                "state": s.state,
                "producer_id": s.producer_id,
                "producer_epoch": s.producer_epoch,
                "partitions": [{"topic": t, "partition": p} for t, p in s.topic_partitions],
                "start_time_ms": s.start_time_ms if s.start_time_ms > 0 else None,
                "age_ms": now_ms - s.start_time_ms if s.start_time_ms > 0 else None,
                "timeout_ms": s.timeout_ms,
                # Only a decision for the same (id, producer id, epoch) rules it; another one in
                # the log for the id (another epoch, or void) is shown too, so it explains itself.
                "decision": decision_ref_json(ruling) if ruling is not None else None,
                "other_decision": _other_decision(state, s, ruling),
                "action": action[s.transactional_id],
            }
        )
    return rows, plan


def _other_decision(state: LogState, s: TxnState, ruling: DecisionRecord | None) -> dict[str, Any] | None:
    """The newest live decision naming this id that does not rule this transaction, if any."""
    for did, d in reversed(state.decisions.items()):
        if ruling is not None and did == ruling.decision_id:
            continue
        for c in d.txns:
            if c.transactional_id == s.transactional_id:
                return decision_ref_json(d) | {
                    "producer_id": c.producer_id,
                    "producer_epoch": c.producer_epoch,
                    "void": state.void.get(did),
                }
    return None


def decision_json(
    state: LogState, d: DecisionRecord, prefix: str, seen: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A decision and its outcome as recorded; for a COMMIT with a loss the broker showed (``seen``),
    the prefix's counts from the broker instead, so that "pending" never hides a loss."""
    did = d.decision_id
    outcome = state.outcome(did)
    counts = {
        "committed": len(outcome.committed),
        "aborted": len(outcome.aborted),
        "lost": len(outcome.lost),
        "pending": len(state.unresolved(did)) if state.in_force(did) else 0,
    }
    if seen is not None:
        counts = {
            "committed": seen["visible_transactions"],
            "aborted": 0,
            "lost": seen["lost_transactions"],
            "pending": seen["pending_transactions"],
        }
    source = d.sources.get(prefix)
    return decision_ref_json(d) | {
        "source_range": source.describe() if source is not None else None,
        "in_force": state.in_force(did),
        # An ABORT stays in the log until its transactions' deadlines pass (the deadline rule needs
        # it) even when an earlier COMMIT rules all of them: then it rules nothing.
        "rules": sum(1 for ruler in state.ruling.values() if ruler == did),
        "void": state.void.get(did),
        "voided_by": state.voided_by.get(did),
        "prefixes": list(d.prefixes),
        "at_ms": d.at_ms,
        "time": iso(d.at_ms) if d.at_ms > 0 else "-",
        "appended_ms": state.appended_ms.get(did),
        "transactions": len(d.txns),
        "transactions_of_prefix": sum(1 for c in d.txns if naming.belongs_to(c.transactional_id, prefix)),
        "records": sum(c.records for c in d.txns),
        "outcome": counts,
        "counted_from": "broker" if seen is not None else "decision log",
        "lost": seen["lost"] if seen is not None else [lost_txn_json(t) for t in outcome.lost],
    }


def plan_json(plan: RecoveryPlan) -> dict[str, list[str]]:
    return {
        "roll_forward": sorted((r.transactional_id for r in plan.commit), key=id_order),
        "abort": sorted((r.transactional_id for r in plan.abort), key=id_order),
        "wait": sorted(plan.wait, key=id_order),
    }


def decision_ref_json(d: DecisionRecord) -> dict[str, Any]:
    return {"kind": d.kind.value, "decision_id": d.decision_id, "run": d.run, "actor": d.actor}


def lost_json(
    tid: str, producer_id: int, producer_epoch: int, records: int, partitions: Iterable[str], reason: str
) -> dict[str, Any]:
    return {
        "transactional_id": tid,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "records": records,
        "partitions": list(partitions),
        "reason": reason,
    }


def lost_txn_json(t: LostTxn) -> dict[str, Any]:
    c = t.covered
    return lost_json(c.transactional_id, c.producer_id, c.producer_epoch, c.records, c.partitions, t.reason)


def run_json(r: RunRecord) -> dict[str, Any]:
    return {
        "run": r.run,
        "status": r.status.value,
        "transactions": r.transactions,
        "records": r.records,
        "at_ms": r.at_ms,
        "time": iso(r.at_ms),
        "decision_id": r.decision_id,
        "note": r.note,
        "lost": [lost_txn_json(t) for t in r.lost],
        # A Kafka source's range: what the run read and where it moved the group (None: no source).
        "source": r.source.to_dict() if r.source is not None else None,
        "source_range": r.source.describe() if r.source is not None else None,
        # A repair of a loss (REPAIRED, or LOST again): its decision, who, when, what it restored.
        "repair": None if r.repair is None else r.repair.to_dict() | {"time": iso(r.repair.at_ms)},
        # Visible whole, in one step: only COMMITTED (a repaired run became so in two; a lost or an
        # acknowledged one is only partly visible).
        "atomic": r.status is RunStatus.COMMITTED,
    }


def id_order(tid: str) -> tuple[str, int, str]:
    """Slot 10 after slot 9, not after slot 1."""
    parsed = naming.parse_transactional_id(tid)
    return (parsed.run_key or "", parsed.slot, tid) if parsed is not None else ("", -1, tid)


def ref_order(r: TxnRef) -> tuple[tuple[str, int, str], int, int]:
    return id_order(r.transactional_id), r.producer_id, r.producer_epoch


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def now_ms() -> int:
    return int(time.time() * 1000)
