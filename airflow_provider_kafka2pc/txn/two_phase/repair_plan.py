"""What a repair exports again (DESIGN §6): the lost Spark partitions of one exporter's LOST run.

``plan_repair`` reads the run's record and refuses, before anything is written, a run that is not
LOST (or acknowledged), a loss whose ids name no slot, a lost consumer-offsets participant, and
lost transactions without a digest. Every repair attempt of a run writes ids under the run's
repair key (``attempts_of``), which no export of the exporter writes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState, slot_of
from airflow_provider_kafka2pc.txn.protocol.errors import NotLostError, RepairRefusedError
from airflow_provider_kafka2pc.txn.protocol.records import LostTxn, RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing


def attempts_of(run: str) -> str:
    """The run key every repair attempt of ``run`` starts with: ids no export of the exporter
    writes (a POOLING run has no run key, an INCREMENTING one a sanitized run id)."""
    return f"repair.{hashlib.sha256(run.encode()).hexdigest()[:10]}."


@dataclass(frozen=True)
class RepairPlan:
    """What one repair attempt exports again: the lost slots of one exporter's run."""

    record: RunRecord  # the run as its LOST (or ACKNOWLEDGED) record has it
    attempt_key: str
    # The task slots the run dealt its frame over round-robin (the barrier stage), which the
    # re-export deals over again; None for a frame written with its own partitioning.
    dealt: Dealing | None = None

    @property
    def prefix(self) -> str:
        return self.record.prefix

    @property
    def run(self) -> str:
        return self.record.run

    @property
    def lost(self) -> tuple[LostTxn, ...]:
        return self.record.lost

    @property
    def slots(self) -> tuple[int, ...]:
        """The lost transactions' slots: the Spark partitions to export again."""
        return tuple(sorted(s for t in self.lost if (s := slot_of(t.covered.transactional_id)) is not None))

    def transactional_id(self, slot: int) -> str:
        """The id the re-export of ``slot`` writes into."""
        return naming.transactional_id(self.prefix, slot, naming.NamingStrategy.INCREMENTING, self.attempt_key)

    def describe(self) -> str:
        records = sum(t.covered.records for t in self.lost)
        return (
            f"run {self.run} of exporter {self.prefix}: {len(self.lost)} lost transaction(s) with {records} records "
            f"(Spark partitions {', '.join(map(str, self.slots))}), exported again as "
            f"{self.transactional_id(self.slots[0]) if self.slots else '-'}..."
        )


def plan_repair(state: LogState, prefix: str, run: str, attempt_key: str) -> RepairPlan | RunRecord:
    """The plan, or the run's record when it is REPAIRED already. Refuses what cannot be repaired."""
    rec = state.runs.get((prefix, run))
    if rec is not None and rec.status is RunStatus.REPAIRED:
        return rec
    if rec is None or rec.status is not RunStatus.LOST:
        status = "has no final run record" if rec is None else f"is {rec.status.value}"
        if rec is not None and rec.status is RunStatus.ACKNOWLEDGED:
            # A person dealt with the loss, perhaps by exporting the missing part again: a repair could duplicate it.
            status += ": its loss was acknowledged (and perhaps exported again by hand), so a repair could duplicate it"
        elif rec is not None:
            status += ": nothing of it was lost"
        raise NotLostError(
            f"run {run!r} of exporter {prefix!r} {status}; only a LOST run can be repaired "
            f"(`kafka2pc list --prefix {prefix}` shows the LOST ones)"
        )
    unnamed = [t.covered.transactional_id for t in rec.lost if slot_of(t.covered.transactional_id) is None]
    if unnamed:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} lost transaction(s) whose ids name no slot ({', '.join(unnamed)}): "
            "the Spark partitions to export again are unknown. Nothing was written"
        )
    offsets = [t for t in rec.lost if slot_of(t.covered.transactional_id) == naming.OFFSETS_SLOT]
    if offsets:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} lost its consumer-offsets participant "
            f"({offsets[0].covered.transactional_id}): its Kafka source's group did not move with the run, and a "
            "repair re-exports output only. Nothing was written. Move the group to the run's ends "
            f"(`kafka2pc describe --prefix {prefix}` shows them), then repair"
        )
    undigested = [t.covered.transactional_id for t in rec.lost if t.covered.digest is None]
    if undigested:
        raise RepairRefusedError(
            f"run {run} of exporter {prefix} cannot be repaired: its lost transaction(s) {', '.join(undigested)} "
            "carry no digest of their records (the export had repairable=False, or wrote a frame stored already, a "
            "cache or a checkpoint, which a repair cannot read again, or ran a version before 0.2.0, whose barrier "
            "stage dealt rows without one), so a "
            "re-computation cannot be proven identical. Nothing was written. Re-export the missing part in a run "
            f"of its own, or acknowledge the loss (`kafka2pc acknowledge --prefix {prefix} --run {run}`)"
        )
    return RepairPlan(rec, attempt_key)


__all__ = ["RepairPlan", "attempts_of", "plan_repair"]
