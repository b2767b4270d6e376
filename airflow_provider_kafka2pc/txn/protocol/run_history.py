"""A run's record, derived from the ordered log so that a late record cannot overturn it (DESIGN §15).

A run record says what became of one exporter's run once its decision was final. It used to be
the latest value of its key; a stale writer (a commit that paused after its decision and came back
after a retry elsewhere finished the run) could then replace COMMITTED with LOST, and every tool
told the false story from then on. Now a record takes effect only if it may follow the one in
effect, in log order:

- nothing yet, or DECIDED (0.1.0's run mark) → anything;
- LOST → ACKNOWLEDGED of the same repair generation (an acknowledgement of an earlier loss is
  stale), REPAIRED, or LOST again by a later repair generation (a repair that lost part of what it
  exported again);
- ACKNOWLEDGED → REPAIRED or LOST of a later generation: the end of a repair decided before the
  acknowledgement (``acknowledge_loss`` reads again after its append and says its acknowledgement
  is void; a repair decided after it is void, ``decisions._rule``);
- COMMITTED, REPAIRED → nothing: they are final.

A record of the same status and generation as the one in effect replaces it, as the latest value
did before (two actors finishing one decision write it twice; the settle step writes it again).

Any other record is *overruled*: it changes nothing, and its writer, which re-reads after its
append, appends the record in effect again so that compaction (which keeps a key's latest value)
keeps the truth. Partition 1 (the history) holds every run record ever written; partition 0 holds
copies of the ones recovery must meet (not COMMITTED). Where a key was read from both, the
history's order decides: the two partitions have no order between them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_provider_kafka2pc.txn.protocol.records import RUN_KEY, Entry, RunRecord, RunStatus

HISTORY = 1  # the decision topic's partition of finished runs' records
FINAL = frozenset({RunStatus.COMMITTED, RunStatus.REPAIRED, RunStatus.ACKNOWLEDGED})


@dataclass(frozen=True)
class _InEffect:
    partition: int
    status: RunStatus
    generation: int  # repairs the record has seen (0: none)
    raw: bytes


def status_of(raw: bytes) -> tuple[RunStatus, int]:
    """A run record's status and repair generation, without building the record."""
    d = json.loads(raw)
    repair = d.get("repair") or {}
    return RunStatus(d.get("status", RunStatus.DECIDED.value)), int(repair.get("generation", 0))


def may_follow(before: tuple[RunStatus, int] | None, after: tuple[RunStatus, int]) -> bool:
    """Whether a run record of ``after`` (status, generation) takes effect over ``before``."""
    if before is None or before[0] is RunStatus.DECIDED:
        return True
    status, generation = before
    if status is RunStatus.LOST:
        if after[0] is RunStatus.ACKNOWLEDGED:
            return after[1] == generation  # an acknowledgement of this loss, not of an earlier one
        return after[0] is RunStatus.REPAIRED or (after[0] is RunStatus.LOST and after[1] > generation)
    if status is RunStatus.ACKNOWLEDGED:  # a repair decided before the acknowledgement ends
        return after[0] is RunStatus.REPAIRED or (after[0] is RunStatus.LOST and after[1] > generation)
    return False


@dataclass
class RunHistory:
    """Folds run records as they are read; ``runs`` gives each run's record in effect."""

    _in_effect: dict[tuple[str, str], _InEffect] = field(default_factory=dict)
    # Runs whose latest record came too late to take effect, (prefix, run) -> its status: until the
    # record in effect is appended again, compaction would keep the overruled one.
    overruled: dict[tuple[str, str], RunStatus] = field(default_factory=dict)
    # Where in partition 0 (the decisions' order) each run's loss was acknowledged: a repair decided
    # after that is void.
    acknowledged_at: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, e: Entry) -> None:
        prefix, _, run = e.key[len(RUN_KEY) :].decode().partition(":")
        key = (prefix, run)
        now = self._in_effect.get(key)
        if now is not None and e.partition == HISTORY and now.partition != HISTORY:
            now = None  # the history holds every record of the run, in its own order: it decides
            self.overruled.pop(key, None)
        if e.value is None:  # a tombstone: as after compaction, nothing of the key is left there
            self._in_effect.pop(key, None)
            self.overruled.pop(key, None)
            return
        status, generation = status_of(e.value)
        same = now is not None and (status, generation) == (now.status, now.generation)
        if now is not None and not same and not may_follow((now.status, now.generation), (status, generation)):
            self.overruled[key] = status  # the key's latest value is not the truth: settle it
            return
        self._in_effect[key] = _InEffect(e.partition, status, generation, e.value)
        self.overruled.pop(key, None)
        if status is RunStatus.ACKNOWLEDGED and e.partition != HISTORY:
            self.acknowledged_at.setdefault(key, e.offset)

    def runs(self, keep_run: Callable[[str, str, bytes], bool] | None) -> dict[tuple[str, str], RunRecord]:
        return {
            key: RunRecord.from_json(r.raw)
            for key, r in self._in_effect.items()
            if keep_run is None or keep_run(key[0], key[1], r.raw)
        }


__all__ = ["FINAL", "HISTORY", "RunHistory", "may_follow", "status_of"]
