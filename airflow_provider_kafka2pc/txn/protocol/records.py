"""The records of the decision topic: decisions, outcomes, run records, the prefix claim and the
POOLING lease, with their keys and their JSON. Pure data; ``decisions.py`` holds the rules that
replay them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from airflow_provider_kafka2pc.txn.protocol.errors import LostTransaction
from airflow_provider_kafka2pc.txn.protocol.naming import parse_transactional_id
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange

# Key families of the decision topic. ':' never occurs in a transactional id kafka2pc writes, so a
# key without one of these prefixes is a per-id record of 0.1.0 (read for the upgrade).
DECISION_KEY = "kafka2pc.decision:"
OUTCOME_KEY = "kafka2pc.outcome:"
RUN_KEY = "kafka2pc.run:"
CLAIM_KEY = "kafka2pc.prefix:"
LEASE_KEY = "kafka2pc.lease:"
# A Spark application's handoff of one driver attempt's committables (``txn.protocol.handoff``).
HANDOFF_KEY = "kafka2pc.handoff:"
# Where a Kafka-sourced exporter's group stands: the run record of its latest run whose offsets
# participant committed, one key per prefix on the protocol's partition (compacted to the latest).
POSITION_KEY = "kafka2pc.position:"
# A Kafka source's consumer group claimed by the one exporter whose runs move it (first claim wins).
GROUP_KEY = "kafka2pc.group:"
# Which repair decision took generation N of a LOST run's repairs: written when that repair is final,
# one key per generation, never removed (``txn.protocol.decisions``: a repair of a taken generation is void).
REPAIR_KEY = "kafka2pc.repair:"
# A live repair's lease, one key per repair attempt (``txn.protocol.repair_lease``); tombstoned at its end.
REPAIR_LEASE_KEY = "kafka2pc.repair-lease:"
# The files each Spark partition of a run read (``txn.protocol.source_files``): on the history
# partition, read by key by a repair only; replay passes over them.
SOURCE_FILES_KEY = "kafka2pc.source-files:"

FORMAT_VERSION = 2
# How long after the last deadline an ABORT is kept: covers clock differences between brokers.
ABORT_RETENTION_SLACK_MS = 5 * 60 * 1000


class Kind(StrEnum):
    COMMIT = "COMMIT"
    ABORT = "ABORT"


class RunStatus(StrEnum):
    """What a run record says of one exporter's run."""

    DECIDED = "DECIDED"  # a COMMIT in force (0.1.0 run marks mean this too); not yet final
    COMMITTED = "COMMITTED"  # every transaction committed: never export this run again
    LOST = "LOST"  # decided COMMIT, part of it can never become visible: fail loudly
    ACKNOWLEDGED = "ACKNOWLEDGED"  # LOST, and an operator acknowledged it with the CLI
    REPAIRED = "REPAIRED"  # LOST, then what it lost was exported again and committed by a repair


def topics_of(partitions: Iterable[str]) -> frozenset[str]:
    """The topics of partitions named as the broker lists them, ``{topic}-{partition}`` (a topic
    name may hold '-' too: the partition is after the last one)."""
    return frozenset(p.rsplit("-", 1)[0] for p in partitions)


@dataclass(frozen=True)
class Covered:
    """One transaction a decision covers."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    records: int = 0
    partitions: tuple[str, ...] = ()
    deadline_ms: int | None = None  # broker clock: transaction start + transaction.timeout.ms
    # What a repair compares a re-computation with: the writer's digest of the records' keys and
    # values (``txn.protocol.record_digest``); None when the writer recorded none.
    digest: str | None = None
    start_ms: int | None = None  # broker clock: when the transaction began (DescribeTransactions)

    @property
    def ref(self) -> TxnRef:
        return TxnRef(self.transactional_id, self.producer_id, self.producer_epoch)

    @property
    def topics(self) -> frozenset[str]:
        return topics_of(self.partitions)

    def to_list(self) -> list[Any]:
        v = [
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.records,
            self.deadline_ms,
            list(self.partitions),
        ]
        if self.start_ms is not None:
            return [*v, self.digest, self.start_ms]
        return v if self.digest is None else [*v, self.digest]

    @classmethod
    def from_list(cls, v: Sequence[Any]) -> Covered:
        digest = str(v[6]) if len(v) > 6 and v[6] is not None else None
        start = _opt_int(v[7]) if len(v) > 7 else None
        return cls(
            str(v[0]), int(v[1]), int(v[2]), int(v[3]), tuple(str(p) for p in v[5]), _opt_int(v[4]), digest, start
        )


@dataclass(frozen=True)
class DecisionRecord:
    """COMMIT or ABORT of a set of transactions, as one record."""

    decision_id: str
    kind: Kind
    run: str  # the DAG run (dag_id/run_id) the decision is about, or who decided
    actor: str  # commit, abort, recovery, cli
    prefixes: tuple[str, ...]  # the exporters whose runs a COMMIT marks
    txns: tuple[Covered, ...]
    at_ms: int  # the writer's clock; the record's LogAppendTime is what the rules use
    # A COMMIT's Kafka sources by exporter: the range each read, whose ends its offsets participant holds.
    sources: Mapping[str, SourceRange] = field(default_factory=dict)
    # A repair's COMMIT: the LOST run record whose lost transactions its own export again.
    repairs: RunRecord | None = None

    @property
    def repair_key(self) -> tuple[str, str, int] | None:
        """(prefix, run, generation) of a repair: it follows the repairs its LOST record had seen."""
        r = self.repairs
        return None if r is None else (r.prefix, r.run, (r.repair.generation if r.repair is not None else 0) + 1)

    @property
    def key(self) -> bytes:
        return (DECISION_KEY + self.decision_id).encode()

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "id": self.decision_id,
            "kind": self.kind.value,
            "run": self.run,
            "actor": self.actor,
            "prefixes": list(self.prefixes),
            "at_ms": self.at_ms,
            "txns": [c.to_list() for c in self.txns],
        }
        if self.sources:
            d["sources"] = {p: r.to_dict() for p, r in sorted(self.sources.items())}
        if self.repairs is not None:
            d["repairs"] = self.repairs.to_dict()
        return _dumps(d)

    @classmethod
    def from_json(cls, raw: bytes) -> DecisionRecord:
        d = json.loads(raw)
        return cls(
            decision_id=str(d["id"]),
            kind=Kind(d["kind"]),
            run=str(d["run"]),
            actor=str(d["actor"]),
            prefixes=tuple(d["prefixes"]),
            txns=tuple(Covered.from_list(c) for c in d["txns"]),
            at_ms=int(d["at_ms"]),
            sources={str(p): SourceRange.from_dict(r) for p, r in (d.get("sources") or {}).items()},
            repairs=RunRecord.from_dict(d["repairs"]) if d.get("repairs") else None,
        )


def new_decision(
    kind: Kind,
    txns: Iterable[Covered],
    run: str,
    actor: str,
    prefixes: Iterable[str] = (),
    now_ms: int = 0,
    sources: Mapping[str, SourceRange] | None = None,
    repairs: RunRecord | None = None,
) -> DecisionRecord:
    covered = tuple(txns)
    seen: set[str] = set()
    for c in covered:
        if c.transactional_id in seen:
            raise ValueError(f"a decision covers transactional id {c.transactional_id!r} twice")
        seen.add(c.transactional_id)
    return DecisionRecord(
        uuid.uuid4().hex, kind, run, actor, tuple(sorted(set(prefixes))), covered, now_ms, dict(sources or {}), repairs
    )


@dataclass(frozen=True)
class LostTxn:
    covered: Covered
    reason: str

    def to_list(self) -> list[Any]:
        return [*self.covered.to_list(), self.reason]

    @classmethod
    def from_list(cls, v: Sequence[Any]) -> LostTxn:
        return cls(Covered.from_list(v[:-1]), str(v[-1]))  # the reason is last, after an optional digest

    def reported(self, run: str) -> LostTransaction:
        """As errors and reports name it: with its exporter and the run whose decision covered it."""
        c = self.covered
        return LostTransaction(
            c.transactional_id,
            c.producer_id,
            c.producer_epoch,
            c.records,
            c.partitions,
            self.reason,
            prefix_of(c.transactional_id),
            run,
        )


@dataclass(frozen=True)
class OutcomeRecord:
    """How the transactions of one decision ended, as far as any actor has seen."""

    decision_id: str
    committed: frozenset[str] = frozenset()
    aborted: frozenset[str] = frozenset()
    lost: tuple[LostTxn, ...] = ()

    @property
    def key(self) -> bytes:
        return (OUTCOME_KEY + self.decision_id).encode()

    @property
    def lost_ids(self) -> frozenset[str]:
        return frozenset(t.covered.transactional_id for t in self.lost)

    def resolved(self) -> frozenset[str]:
        return self.committed | self.aborted | self.lost_ids

    def merge(self, other: OutcomeRecord) -> OutcomeRecord:
        lost = {t.covered.transactional_id: t for t in (*self.lost, *other.lost)}
        return OutcomeRecord(
            self.decision_id,
            self.committed | other.committed,
            self.aborted | other.aborted,
            tuple(lost[k] for k in sorted(lost)),
        )

    def to_json(self) -> bytes:
        return _dumps(
            {
                "v": FORMAT_VERSION,
                "id": self.decision_id,
                "committed": sorted(self.committed),
                "aborted": sorted(self.aborted),
                "lost": [t.to_list() for t in self.lost],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> OutcomeRecord:
        d = json.loads(raw)
        return cls(
            str(d["id"]),
            frozenset(d["committed"]),
            frozenset(d["aborted"]),
            tuple(LostTxn.from_list(t) for t in d["lost"]),
        )


@dataclass(frozen=True)
class RunRecord:
    """What is left of one exporter's run once its COMMIT is final: small, one key per run."""

    prefix: str
    run: str
    status: RunStatus
    transactions: int
    records: int
    at_ms: int
    decision_id: str = ""
    lost: tuple[LostTxn, ...] = ()
    note: str = ""
    source: SourceRange | None = None  # the Kafka source range the run read, whose ends it committed
    repair: Repair | None = None  # REPAIRED (or LOST again): the repair that exported its losses again

    @property
    def key(self) -> bytes:
        return run_key(self.prefix, self.run)

    @property
    def whole(self) -> bool:
        """Every record of the run is visible once: committed, or repaired after a loss."""
        return self.status in (RunStatus.COMMITTED, RunStatus.REPAIRED)

    def to_json(self) -> bytes:
        return _dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "prefix": self.prefix,
            "run": self.run,
            "status": self.status.value,
            "txns": self.transactions,
            "records": self.records,
            "at_ms": self.at_ms,
            "decision": self.decision_id,
        }
        if self.lost:
            d["lost"] = [t.to_list() for t in self.lost]
        if self.note:
            d["note"] = self.note
        if self.source is not None:
            d["source"] = self.source.to_dict()
        if self.repair is not None:
            d["repair"] = self.repair.to_dict()
        return d

    @classmethod
    def from_json(cls, raw: bytes) -> RunRecord:
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunRecord:
        # 0.1.0 wrote a run mark with its COMMIT decisions and never anything final.
        status = RunStatus(d["status"]) if "status" in d else RunStatus.DECIDED
        return cls(
            prefix=str(d["prefix"]),
            run=str(d["run"]),
            status=status,
            transactions=int(d["txns"]),
            records=int(d["records"]),
            at_ms=int(d["at_ms"]),
            decision_id=str(d.get("decision", "")),
            lost=tuple(LostTxn.from_list(t) for t in d.get("lost", ())),
            note=str(d.get("note", "")),
            source=SourceRange.from_dict(d["source"]) if d.get("source") else None,
            repair=Repair.from_dict(d["repair"]) if d.get("repair") else None,
        )


@dataclass(frozen=True)
class Repair:
    """A repair of a LOST run, as its run record keeps it: its decision, who, when, how much."""

    decision_id: str
    actor: str
    at_ms: int
    transactions: int
    records: int
    restored: int  # records of the run's losses made visible by its repairs so far (all, when REPAIRED)
    generation: int = 1  # the run's first repair is 1; one that follows a repair that lost again, 2...

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision_id,
            "actor": self.actor,
            "at_ms": self.at_ms,
            "txns": self.transactions,
            "records": self.records,
            "restored": self.restored,
            "generation": self.generation,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Repair:
        return cls(
            str(d["decision"]),
            str(d["actor"]),
            int(d["at_ms"]),
            int(d["txns"]),
            int(d["records"]),
            int(d["restored"]),
            int(d["generation"]),
        )


def repair_claim_key(prefix: str, run: str, generation: int) -> bytes:
    return f"{REPAIR_KEY}{prefix}:{run}:{generation}".encode()


@dataclass(frozen=True)
class Lease:
    """A run's place in the queue of a POOLING exporter: its runs share ids, so they take turns.

    The log orders the leases; the first whose run is still live holds the exporter. Liveness is
    the scheduler's to say (the caller passes it in), so a crashed run never blocks for ever.
    """

    prefix: str
    dag_id: str
    run_id: str
    at_ms: int = 0

    @property
    def key(self) -> bytes:
        return f"{LEASE_KEY}{self.prefix}:{self.dag_id}/{self.run_id}".encode()

    def to_json(self) -> bytes:
        return _dumps(
            {"v": FORMAT_VERSION, "prefix": self.prefix, "dag": self.dag_id, "run": self.run_id, "at_ms": self.at_ms}
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Lease:
        d = json.loads(raw)
        return cls(str(d["prefix"]), str(d["dag"]), str(d["run"]), int(d["at_ms"]))


def run_key(prefix: str, run: str) -> bytes:
    return f"{RUN_KEY}{prefix}:{run}".encode()


class Entry(NamedTuple):
    """One record of the log as read: offset, broker timestamp, key, value (None: tombstone).

    A NamedTuple, not a dataclass: a read builds one per record, hundreds of thousands of them.
    ``partition`` 1 holds the run records of finished runs (the history); 0 holds the protocol.
    """

    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes | None
    partition: int = 0


def prefix_of(tid: str) -> str:
    parsed = parse_transactional_id(tid)
    return parsed.prefix if parsed is not None else ""


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _dumps(d: Mapping[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()
