"""The decision protocol (DESIGN §3a): one decision per run, the log is the order, the first wins.

Every actor (commit, abort, recovery, the CLI) follows the same three steps:

1. **append** its decision (COMMIT or ABORT) as *one* record listing every transaction it
   covers, acks=all, and learn the record's offset;
2. **read back** the log up to that offset and ``replay`` it;
3. **obey** the ruling: for each transaction, the first decision in force that covers it.

``replay`` is a pure function of the log, so every actor that reads the same log reaches the same
ruling. Its rules, in log order:

- A COMMIT is *in force* only if none of its transactions is already ruled by an earlier decision
  and it was appended (broker time, LogAppendTime) before every transaction's broker deadline
  (start + transaction.timeout.ms). Otherwise it is *void* for all of its transactions: a run is
  never half decided. A commit that finds its decision void aborts the whole run.
- An ABORT rules every transaction it covers that no earlier decision rules. (Transactions already
  ruled by a COMMIT are rolled forward by whoever meets them; ABORT is per transaction.)

Keys are chosen for compaction (a later record with the same key replaces an earlier one):
a decision's key is unique (``kafka2pc.decision:{id}``), so nothing can replace it while it
matters. It is removed (tombstoned) only when it no longer can matter:

- a COMMIT in force, once every transaction it covers is final on the broker: it collapses into a
  small *run record* per exporter (``kafka2pc.run:{prefix}:{run}``: COMMITTED, or LOST with the
  lost transactions), which is what a later clear of the run needs;
- an ABORT, once its transactions are final *and* their broker deadlines have passed (plus a
  slack): any COMMIT appended after that is void by the deadline rule, so forgetting the ABORT
  changes no ruling;
- a void decision at any time (it rules nothing).

Outcomes (which transactions of a decision ended committed, aborted or lost) are kept under
``kafka2pc.outcome:{id}``, replaced by each actor with the union of what it knows.

A **repair** (``txn.two_phase.repair``) is a COMMIT of new transactions that carries the LOST run
record it was planned from, and so the generation it claims: one more than the repairs that record
had seen. One repair per generation: a repair's COMMIT is also void if an earlier repair of the
same generation is in force, or if that generation is taken already. A final repair takes it with
a claim record (``kafka2pc.repair:{prefix}:{run}:{generation}``, one key per generation, never
removed, read by every replay), written before its decision is retired. So a repair planned from a
stale record (another repair finished, or lost again, meanwhile; a stale finalize or an
acknowledgement rewrote the run record) is void whatever the run record says now.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.handoff import parse_handoff_key
from airflow_provider_kafka2pc.txn.protocol.naming import parse_transactional_id
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import (
    ABORT_RETENTION_SLACK_MS,
    CLAIM_KEY,
    DECISION_KEY,
    FORMAT_VERSION,
    GROUP_KEY,
    HANDOFF_KEY,
    LEASE_KEY,
    OUTCOME_KEY,
    POSITION_KEY,
    REPAIR_KEY,
    REPAIR_LEASE_KEY,
    RUN_KEY,
    SOURCE_FILES_KEY,
    Covered,
    DecisionRecord,
    Entry,
    Kind,
    Lease,
    LostTxn,
    OutcomeRecord,
    Repair,
    RunRecord,
    RunStatus,
    prefix_of,
    repair_claim_key,
)
from airflow_provider_kafka2pc.txn.protocol.repair_lease import RepairLease, holder_of
from airflow_provider_kafka2pc.txn.protocol.run_history import RunHistory


@dataclass
class LogState:
    """The log replayed: live decisions in log order, the ruling, outcomes, runs and claims."""

    decisions: dict[str, DecisionRecord] = field(default_factory=dict)  # insertion = log order
    offsets: dict[str, int] = field(default_factory=dict)
    appended_ms: dict[str, int] = field(default_factory=dict)
    ruling: dict[TxnRef, str] = field(default_factory=dict)  # transaction -> decision id in force
    void: dict[str, str] = field(default_factory=dict)  # decision id -> why it rules nothing
    voided_by: dict[str, str] = field(default_factory=dict)  # void decision id -> the one that came first
    outcomes: dict[str, OutcomeRecord] = field(default_factory=dict)
    runs: dict[tuple[str, str], RunRecord] = field(default_factory=dict)  # each run's record in effect
    overruled: dict[tuple[str, str], RunStatus] = field(default_factory=dict)  # runs a late record tried to change
    # (prefix, run, generation) -> offset of the acknowledgement of that generation's loss
    acknowledged_at: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # The record in effect of each overruled run, whatever ``keep_run`` kept: what settling appends.
    overruled_records: dict[tuple[str, str], RunRecord] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    positions: dict[str, RunRecord] = field(default_factory=dict)  # prefix -> its source's latest run
    stale_positions: set[str] = field(default_factory=set)  # prefixes whose latest position record is behind
    group_owners: dict[str, str] = field(default_factory=dict)  # a source's consumer group -> its exporter
    leases: dict[bytes, tuple[int, Lease]] = field(default_factory=dict)  # key -> (offset, lease)
    repair_claims: dict[tuple[str, str, int], str] = field(default_factory=dict)  # (prefix, run, gen) -> decision
    # Spark applications' handoffs, (prefix, run) -> attempt -> the record as read (``txn.protocol.handoff``).
    handoffs: dict[tuple[str, str], dict[str, Entry]] = field(default_factory=dict)
    # Live repairs' leases, (prefix, run) -> holder -> (offset, lease) (``txn.protocol.repair_lease``).
    repair_leases: dict[tuple[str, str], dict[str, tuple[int, RepairLease]]] = field(default_factory=dict)
    end_offset: int = -1  # the last offset read of the protocol's partition
    broker_time_ms: int = 0  # the newest LogAppendTime read: the broker's clock, roughly now

    def ruled_by(self, ref: TxnRef) -> DecisionRecord | None:
        did = self.ruling.get(ref)
        return None if did is None else self.decisions[did]

    def in_force(self, decision_id: str) -> bool:
        return decision_id in self.decisions and decision_id not in self.void

    def outcome(self, decision_id: str) -> OutcomeRecord:
        return self.outcomes.get(decision_id) or OutcomeRecord(decision_id)

    def unresolved(self, decision_id: str) -> list[Covered]:
        """Transactions a decision in force rules that no actor has seen end yet."""
        d = self.decisions[decision_id]
        done = self.outcome(decision_id).resolved()
        return [c for c in d.txns if c.transactional_id not in done and self.ruling.get(c.ref) == decision_id]

    def commit_of_run(self, run: str, refs: Iterable[TxnRef]) -> DecisionRecord | None:
        """The COMMIT in force of ``run`` that rules every one of ``refs``, if there is one."""
        ids = {self.ruling.get(r) for r in refs}
        if len(ids) != 1:
            return None
        d = self.decisions.get(next(iter(ids)) or "")
        return d if d is not None and d.kind is Kind.COMMIT and d.run == run else None

    def repair_holder(self, prefix: str, run: str, now_ms: int) -> RepairLease | None:
        """The repair that holds the run: its live lease came first (``txn.protocol.repair_lease``)."""
        return holder_of(self.repair_leases.get((prefix, run), {}).values(), now_ms)

    def leased(self, prefix: str, now_ms: int) -> list[RepairLease]:
        """Every live repair lease of the exporter: recovery leaves their undecided transactions alone."""
        return [lease for (p, _run), held in self.repair_leases.items() if p == prefix
                for _offset, lease in held.values() if lease.live(now_ms)]  # fmt: skip

    def aborted_since(self, run: str, offset: int) -> bool:
        """Whether an ABORT of ``run`` (its abort task's) was appended after ``offset``."""
        return any(d.kind is Kind.ABORT and d.run == run and self.offsets.get(did, -1) > offset
                   for did, d in self.decisions.items())  # fmt: skip

    def run_status(self, prefix: str, run: str) -> RunRecord | None:
        """The run's record, or a DECIDED one derived from a live COMMIT in force."""
        rec = self.runs.get((prefix, run))
        if rec is not None and rec.status is not RunStatus.DECIDED:
            return rec
        for did, d in self.decisions.items():
            if d.kind is Kind.COMMIT and d.run == run and prefix in d.prefixes and self.in_force(did):
                records = sum(c.records for c in d.txns)
                source = d.sources.get(prefix)
                return RunRecord(prefix, run, RunStatus.DECIDED, len(d.txns), records, d.at_ms, did, source=source)
        return rec

    def queue(self, prefix: str) -> list[Lease]:
        """The exporter's leases in log order: the first live one holds it."""
        return [lease for _, lease in sorted(v for v in self.leases.values() if v[1].prefix == prefix)]

    def last_source(self, prefix: str) -> RunRecord | None:
        """Where the exporter's Kafka source group stands once its runs are visible: the latest COMMIT
        in force that carries its source (in log order; not final yet), else its position record
        (the latest final run; LOST when a loss took its offsets)."""
        decided = [
            rec
            for did, d in self.decisions.items()  # in log order
            if d.kind is Kind.COMMIT and prefix in d.sources and self.in_force(did)
            if (rec := self.run_status(prefix, d.run)) is not None and rec.source is not None
        ]
        return decided[-1] if decided else self.positions.get(prefix)

    def repair_of(self, prefix: str, run: str) -> DecisionRecord | None:
        """The repair of the run in force and not final yet, if there is one."""
        return next(
            (
                d
                for did, d in self.decisions.items()
                if d.repair_key is not None and d.repair_key[:2] == (prefix, run) and self.in_force(did)
            ),
            None,
        )

    def lost_runs(self, prefix: str) -> list[RunRecord]:
        return [r for (p, _), r in self.runs.items() if p == prefix and r.status is RunStatus.LOST]

    def decisions_touching(self, prefix_of: Any) -> list[DecisionRecord]:
        """Live decisions in force with a transaction for which ``prefix_of(tid)`` is true."""
        return [
            d
            for did, d in self.decisions.items()
            if self.in_force(did) and any(prefix_of(c.transactional_id) for c in d.txns)
        ]


def replay(entries: Iterable[Entry], keep_run: Any = None) -> LogState:
    """The state every actor derives from the same log. ``keep_run(prefix, run, raw)`` filters the
    run records in effect (a reader that needs one run should not hold a hundred thousand); which
    record of a run is in effect is ``run_history``'s rule, not the latest value."""
    latest: dict[bytes, Entry] = {}
    state = LogState()
    history = RunHistory()
    for e in entries:
        if e.partition == 0:
            state.end_offset = max(state.end_offset, e.offset)
            state.broker_time_ms = max(state.broker_time_ms, e.timestamp_ms)
        key = e.key
        if key.startswith(RUN_KEY.encode()):  # the highest rank holds: a late record changes nothing
            history.add(e)
            continue
        if key.startswith(SOURCE_FILES_KEY.encode()):  # a repair reads its run's by key, nobody else
            continue
        if key.startswith(LEASE_KEY.encode()):
            state.leases.pop(key, None)
            if e.value is not None:
                state.leases[key] = (e.offset, Lease.from_json(e.value))
            continue
        if key.startswith(CLAIM_KEY.encode()):
            if e.value:
                state.claims[key[len(CLAIM_KEY) :].decode()] = json.loads(e.value)["owner"]
            continue
        if key.startswith(POSITION_KEY.encode()):
            prefix = key[len(POSITION_KEY) :].decode()
            state.stale_positions.discard(prefix)
            if not e.value:
                state.positions.pop(prefix, None)
            elif behind(rec := RunRecord.from_json(e.value), state.positions.get(prefix)):
                state.stale_positions.add(prefix)  # a stale finalize (a paused commit): it changes nothing
            else:
                state.positions[prefix] = rec
            continue
        if key.startswith(REPAIR_KEY.encode()):  # kept whatever keep_run says: they make repairs void
            prefix, _, rest = key[len(REPAIR_KEY) :].decode().partition(":")
            run, _, generation = rest.rpartition(":")
            if e.value:  # the first in the log holds; a second of one generation never comes from the rules
                state.repair_claims.setdefault((prefix, run, int(generation)), str(json.loads(e.value)["decision"]))
            continue
        if key.startswith(REPAIR_LEASE_KEY.encode()):
            prefix, _, rest = key[len(REPAIR_LEASE_KEY) :].decode().partition(":")
            holder, _, run = rest.partition(":")
            holders = state.repair_leases.setdefault((prefix, run), {})
            holders.pop(holder, None)
            if e.value is not None:
                holders[holder] = (e.offset, RepairLease.from_json(e.value))
            continue
        if key.startswith(HANDOFF_KEY.encode()):
            prefix, attempt, run = parse_handoff_key(key)
            attempts = state.handoffs.setdefault((prefix, run), {})
            attempts.pop(attempt, None)  # the latest of a key, in log order, as compaction leaves it
            if e.value is not None:
                attempts[attempt] = e
            continue
        if key.startswith(GROUP_KEY.encode()):
            group = key[len(GROUP_KEY) :].decode()
            if e.value:  # the first claim in the log wins; a later one of another exporter is void
                state.group_owners.setdefault(group, str(json.loads(e.value)["prefix"]))
            else:
                state.group_owners.pop(group, None)
            continue
        # Decisions, outcomes and 0.1.0 per-id records: latest value per key, at its newest offset
        # (as compaction leaves it); a tombstone drops the key, so memory holds what is live.
        latest.pop(key, None)
        if e.value is not None:
            latest[key] = e
    state.runs, state.overruled = history.runs(keep_run), history.overruled()
    state.overruled_records = {k: held for k in state.overruled if (held := history.record(k)) is not None}
    state.acknowledged_at = history.acknowledged_at
    for key, e in sorted(latest.items(), key=lambda kv: kv[1].offset):
        assert e.value is not None
        if key.startswith(DECISION_KEY.encode()):
            d = DecisionRecord.from_json(e.value)
        elif key.startswith(OUTCOME_KEY.encode()):
            o = OutcomeRecord.from_json(e.value)
            state.outcomes[o.decision_id] = o
            continue
        else:
            legacy = _legacy(e)
            if legacy is None:
                continue
            d = legacy
        state.decisions[d.decision_id] = d
        state.offsets[d.decision_id] = e.offset
        state.appended_ms[d.decision_id] = e.timestamp_ms
        _rule(state, d, e.timestamp_ms)
    return state


def behind(new: RunRecord, current: RunRecord | None) -> bool:
    """Whether a Kafka source's position ``new`` is older than ``current``: it ends before it in a
    partition they share and after it in none (a run's range ends at the last stable offset at its
    snapshot, which only grows). A paused commit's late finalize writes such a record."""
    if current is None or new.source is None or current.source is None:
        return False
    ends = {(p.topic, p.partition): p.end for p in current.source.partitions}
    shared = [(p.end, ends[(p.topic, p.partition)]) for p in new.source.partitions if (p.topic, p.partition) in ends]
    return any(n < c for n, c in shared) and not any(n > c for n, c in shared)


def _rule(state: LogState, d: DecisionRecord, appended_ms: int) -> None:
    refs = [c.ref for c in d.txns]
    if d.kind is Kind.ABORT:
        for r in refs:
            state.ruling.setdefault(r, d.decision_id)
        return
    earlier = [state.ruling[r] for r in refs if r in state.ruling]
    if d.repair_key is not None and not earlier:
        prefix, run, generation = d.repair_key  # a repair of the loss of generation - 1
        acked = state.acknowledged_at.get((prefix, run, generation - 1))
        if acked is not None and acked < state.offsets[d.decision_id]:
            state.void[d.decision_id] = f"the run's loss was acknowledged first (offset {acked})"
            return
        taken = state.repair_claims.get(d.repair_key)
        if taken is not None and taken != d.decision_id:
            state.void[d.decision_id] = f"repair {d.repair_key[2]} of the run was decision {taken}"
            return
        first = next((o.decision_id for o in state.decisions.values() if o is not d and o.repair_key == d.repair_key
                      and state.in_force(o.decision_id)), None)  # fmt: skip
        earlier = [first] if first is not None else []
    if earlier:
        state.void[d.decision_id] = f"decision {earlier[0]} came first"
        state.voided_by[d.decision_id] = earlier[0]
        return
    late = [c for c in d.txns if c.deadline_ms is not None and appended_ms > c.deadline_ms]
    if late:
        state.void[d.decision_id] = f"appended after the broker deadline of {late[0].transactional_id}"
        return
    for r in refs:
        state.ruling[r] = d.decision_id


def repaired_record(d: DecisionRecord, lost: Iterable[LostTxn], now_ms: int) -> RunRecord:
    """The run record a final repair leaves: REPAIRED, or LOST again with what is still missing
    (the run's lost transactions whose slot the repair lost too: a next repair exports only those).
    The run's totals and first loss stay as they were; the repair is added."""
    assert d.repairs is not None and d.repair_key is not None
    run = d.repairs
    missing = {slot_of(t.covered.transactional_id) for t in lost}
    still = tuple(t for t in run.lost if slot_of(t.covered.transactional_id) in missing)
    before = run.repair.restored if run.repair is not None else 0
    restored = before + sum(t.covered.records for t in run.lost) - sum(t.covered.records for t in still)
    records = sum(c.records for c in d.txns)
    repair = Repair(d.decision_id, d.actor, now_ms, len(d.txns), records, restored, d.repair_key[2])
    if still:
        return dataclasses.replace(run, status=RunStatus.LOST, at_ms=now_ms, lost=still, repair=repair)
    return dataclasses.replace(run, status=RunStatus.REPAIRED, at_ms=now_ms, repair=repair)


def slot_of(tid: str) -> int | None:
    parsed = parse_transactional_id(tid)
    return None if parsed is None else parsed.slot


def _legacy(e: Entry) -> DecisionRecord | None:
    """A 0.1.0 per-id record whose latest value is COMMIT: a decision still in flight."""
    assert e.value is not None
    d = json.loads(e.value)
    if d.get("decision") != "COMMIT":
        return None  # COMMITTED / ABORTED are final; a 0.1.0 LOST was already reported
    c = Covered(str(d["tid"]), int(d["pid"]), int(d["epoch"]), int(d.get("records", 0)))
    return DecisionRecord(f"v1.{e.key.decode()}", Kind.COMMIT, str(d.get("run", "")), "0.1.0", (), (c,), 0)


# -- what an actor writes after it obeyed -----------------------------------------------------


def finalize(state: LogState, decision_id: str, now_ms: int) -> list[tuple[bytes, bytes | None]]:
    """Records that retire a decision whose transactions are all final; [] while it still matters.

    Run records go first: the topic has one partition and the producer is idempotent, so a reader
    that no longer sees the decision sees what it left.
    """
    d = state.decisions[decision_id]
    tombstones: list[tuple[bytes, bytes | None]] = [(d.key, None), (OUTCOME_KEY.encode() + decision_id.encode(), None)]
    if d.decision_id.startswith("v1."):
        tombstones = [(d.decision_id[3:].encode(), None), tombstones[1]]  # its outcome record too
    if not state.in_force(decision_id):
        return tombstones
    if state.unresolved(decision_id):
        return []
    # What this decision made void goes with it, or it would come back into force.
    for did, by in state.voided_by.items():
        if by == decision_id:
            voided = state.decisions[did]
            tombstones[:0] = [(voided.key, None), (OUTCOME_KEY.encode() + did.encode(), None)]
    outcome = state.outcome(decision_id)
    if d.kind is Kind.ABORT:
        deadlines = [c.deadline_ms or state.appended_ms[decision_id] for c in d.txns]
        if state.broker_time_ms < max(deadlines, default=0) + ABORT_RETENTION_SLACK_MS:
            return []
        return tombstones
    items: list[tuple[bytes, bytes | None]] = []
    if d.repair_key is not None:
        # The generation's claim first: once the decision is retired, it is what keeps a stale repair void.
        claim = json.dumps({"v": FORMAT_VERSION, "decision": decision_id, "at_ms": now_ms}).encode()
        items.append((repair_claim_key(*d.repair_key), claim))
        rec = repaired_record(d, outcome.lost, now_ms)
        items.append((rec.key, rec.to_json()))
        position = state.positions.get(rec.prefix)
        if rec.source is not None and position is not None and position.run == rec.run:  # a later run moved it on
            items.append(((POSITION_KEY + rec.prefix).encode(), rec.to_json()))
        return items + tombstones
    for prefix in d.prefixes:
        mine = [c for c in d.txns if prefix_of(c.transactional_id) == prefix]
        lost = tuple(t for t in outcome.lost if prefix_of(t.covered.transactional_id) == prefix)
        rec = RunRecord(
            prefix,
            d.run,
            RunStatus.LOST if lost else RunStatus.COMMITTED,
            len(mine),
            sum(c.records for c in mine),
            now_ms,
            decision_id,
            lost,
            source=d.sources.get(prefix),
        )
        items.append((rec.key, rec.to_json()))
        if rec.source is not None:  # where the group stands now (if a loss took its offsets: LOST, named)
            items.append(((POSITION_KEY + prefix).encode(), rec.to_json()))
    if outcome.lost and not d.prefixes:  # a 0.1.0 decision has no run record to carry the loss
        return []
    return items + tombstones
