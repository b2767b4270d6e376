"""A Spark application's prepared transactions, handed to the Airflow side through the decision topic.

``hand_off`` (the application, once every transaction of its driver attempt is prepared) appends
the attempt's record and reads it back. ``accept`` (the Airflow side) reads the run's handoffs,
refuses a malformed or foreign one by name, and accepts the first, in log order, whose
transactions the broker still holds open at the producer epochs the record names. Each attempt
(a driver restarted by YARN, a resubmission by an Airflow retry) writes ids of its own, so no
attempt fences another, before or after the run's decision: a live earlier attempt that starts a
Spark task again cannot abort the transactions of the attempt being committed. An attempt that
hands off after the run's decision is never accepted; what the others leave open is aborted by
the commit task's recovery pass, the abort task or the next attempt's recovery (DESIGN §15, §16).
Once the run has its record, ``retire_handoffs`` tombstones the handoffs (the commit and abort tasks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.protocol.handoff import Handoff
from airflow_provider_kafka2pc.txn.protocol.naming import NamingStrategy
from airflow_provider_kafka2pc.txn.protocol.records import Entry, Kind, RunRecord
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acceptance:
    """What ``accept`` found: the attempt to commit, or why there is none yet."""

    handoff: Handoff | None
    waiting: str = ""  # why nothing was accepted (yet)
    stale: tuple[str, ...] = ()  # attempts whose transactions the broker no longer holds open
    decided: RunRecord | None = None  # the run already reached its decision: nothing is accepted


def hand_off(decision_log: DecisionLog, handoff: Handoff) -> bool:
    """Append the attempt's record and read it back: once this returns True, the Airflow side can
    see it. False: the run reached its decision meanwhile and its handoffs were retired, this one
    with them (it will never be accepted)."""
    decision_log.append([(handoff.key, handoff.to_json())])
    state = decision_log.read_for(handoff.prefix, handoff.run)
    got = state.handoffs.get((handoff.prefix, handoff.run), {}).get(handoff.attempt)
    if got is None and state.run_status(handoff.prefix, handoff.run) is not None:
        return False
    if got is None or got.value != handoff.to_json():
        raise DecisionLogError(
            f"the handoff of attempt {handoff.attempt!r} for run {handoff.run} was appended to decision topic "
            f"{decision_log.topic!r} but not read back; run the application again"
        )
    log.info(
        "handed off run %s of exporter %s (attempt %s): %d transaction(s), %d records",
        handoff.run,
        handoff.prefix,
        handoff.attempt,
        len(handoff.committables),
        handoff.records,
    )
    return True


def accept(
    decision_log: DecisionLog,
    inspector: TransactionInspector,
    prefix: str,
    run: str,
    strategy: NamingStrategy,
    run_key: str | None,
) -> Acceptance:
    """The run's live attempt, checked against the broker; ``MalformedHandoffError`` and
    ``ForeignHandoffError`` name a record that must never be committed."""
    state = decision_log.read_for(prefix, run)
    decided = state.run_status(prefix, run)
    if decided is not None:
        return Acceptance(None, f"run {run} of exporter {prefix!r} already reached its decision", decided=decided)
    entries = sorted(state.handoffs.get((prefix, run), {}).values(), key=lambda e: e.offset)
    if not entries:
        return Acceptance(None, f"no application has handed off run {run} of exporter {prefix!r} yet")
    handoffs = [Handoff.from_json(e.value or b"", e.key) for e in entries]
    for h in handoffs:
        h.check(prefix, run, strategy, run_key)
    described = inspector.describe({c.transactional_id for h in handoffs for c in h.committables})
    live = [h for h in handoffs if all(_held(c, described.get(c.transactional_id)) for c in h.committables)]
    stale = tuple(h.attempt for h in handoffs if h not in live)
    # An attempt that prepared nothing (an empty frame) holds nothing that can be aborted, so it
    # always looks live. One that prepared transactions wins; an empty one only if it is the newest
    # handoff (a newer attempt that wrote records and was aborted is waited for, not replaced by none).
    # Of several complete attempts the first to hand off is the run's: each is whole, and the first
    # stays the first as later ones arrive.
    if any(h.committables for h in live):
        live = [h for h in live if h.committables][:1]
    elif live:
        live = live[-1:] if live[-1] is handoffs[-1] else []
    if not live:
        return Acceptance(
            None,
            f"attempt(s) {', '.join(repr(a) for a in stale)} of run {run} handed off transactions the broker no "
            "longer holds open at their producer epochs (aborted by a recovery or the abort task, or timed out): "
            "waiting for an attempt that completes",
            stale,
        )
    return Acceptance(live[0], stale=stale)


def retire_handoffs(decision_log: DecisionLog, prefix: str, run: str) -> int:
    """Tombstone the run's handoff records that nothing will read again, and return how many:
    compaction keeps a compacted topic's every key, so each run would leave its attempts'
    committables in the topic for good. Once the run has its decision (a COMMIT, or the outcome
    after it) that is all of them: ``accept`` answers from the run's record, an application returns
    before it looks. An aborted run has no record (a cleared run may hand off again): only the
    handoffs whose every transaction an ABORT in force rules, which ``accept`` passes over anyway."""
    state = decision_log.read_for(prefix, run)
    entries = list(state.handoffs.get((prefix, run), {}).values())
    if state.run_status(prefix, run) is None:
        entries = [e for e in entries if _aborted(state, e)]
    keys = [e.key for e in entries]
    if keys:
        decision_log.append([(key, None) for key in keys])
        log.info("retired %d handoff record(s) of run %s of exporter %s", len(keys), run, prefix)
    return len(keys)


def _aborted(state: LogState, entry: Entry) -> bool:
    """Every transaction of the handoff (one at least) is ruled by an ABORT in force; a record that
    cannot be read stays (``accept`` names it)."""
    try:
        handoff = Handoff.from_json(entry.value or b"", entry.key)
    except Kafka2PCError:
        return False
    rulings = [state.ruled_by(ref_of(c)) for c in handoff.committables]
    return bool(rulings) and all(
        d is not None and d.kind is Kind.ABORT and state.in_force(d.decision_id) for d in rulings
    )


def _held(c: Committable, s: TxnState | None) -> bool:
    """The broker holds the committable's transaction open at its producer id and epoch, and is not
    ending it (one that wrote nothing opened none: its producer id and epoch must still be the id's)."""
    if s is None or (s.producer_id, s.producer_epoch) != (c.producer_id, c.producer_epoch):
        return False
    return c.records == 0 or s.state == "Ongoing"


__all__ = ["Acceptance", "accept", "hand_off", "retire_handoffs"]
