"""A run's record, derived from every record the log holds for it, in any order, so that neither a
late record nor compaction can overturn it (DESIGN §15).

A run record says what became of one exporter's run once its decision was final. It used to be
the latest value of its key; a stale writer (a commit that paused after its decision and came back
after a retry elsewhere finished the run) could then replace COMMITTED with LOST, and every tool
told the false story from then on. Now every record has a rank, and the run's record is the
highest-ranked one read:

    DECIDED (0.1.0's run mark) < LOST of generation g < ACKNOWLEDGED of g < LOST of g + 1 < …
        < COMMITTED < REPAIRED

- an acknowledgement outranks the loss it acknowledges, and a repair's later loss outranks an
  acknowledgement of an earlier one (a repair decided before the acknowledgement ends; one decided
  after it is void, ``decisions._rule``);
- COMMITTED and REPAIRED are final. A COMMITTED record is written only on proof that every
  transaction committed, a LOST one only on proof that one did not (``two_phase.loss_proof``), so a
  run never has both but from a stale writer, and then COMMITTED is the fact.

A record of the same status and generation replaces the one in effect (two actors finishing one
decision write it twice). A lower-ranked record read after a higher one is *overruled*: it changes
nothing, and its reader appends the record in effect again (``DecisionLog.settle``) for readers of
partition 0 alone.

Partition 1 (the history) holds every run record ever written under one key per run, status and
generation (``history_key``), so compaction, which keeps a key's latest value, keeps every rank:
the order of the records never matters, and nothing a stale writer appends can remove the truth.
Partition 0 holds copies of the records recovery must meet (not COMMITTED), one key per run; a
run read from both has the highest rank of both. A one-partition topic (0.1.0's layout) holds one
key per run and relies on the settle step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_provider_kafka2pc.txn.protocol.records import RUN_KEY, Entry, RunRecord, RunStatus

HISTORY = 1  # the decision topic's partition of finished runs' records
FINAL = frozenset({RunStatus.COMMITTED, RunStatus.REPAIRED, RunStatus.ACKNOWLEDGED})
# Between a run key and its status and generation in the history's keys: no run id or prefix holds it.
_RANKED = b"\x00"
_TOP = {RunStatus.COMMITTED: 0, RunStatus.REPAIRED: 1}


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


def rank(status: RunStatus, generation: int) -> tuple[int, int, int]:
    """The order of run records (module docstring): the highest read is the run's record."""
    if status in _TOP:
        return (2, 0, _TOP[status])
    if status is RunStatus.DECIDED:
        return (0, 0, 0)
    return (1, generation, 1 if status is RunStatus.ACKNOWLEDGED else 0)


def may_follow(before: tuple[RunStatus, int] | None, after: tuple[RunStatus, int]) -> bool:
    """Whether a run record of ``after`` (status, generation) takes effect over ``before``."""
    return before is None or rank(*after) > rank(*before)


def history_key(key: bytes, value: bytes) -> bytes:
    """A run record's key in the history: its run key, status and generation (one key per rank)."""
    status, generation = status_of(value)
    return key + _RANKED + f"{status.value}.{generation}".encode()


def run_key_of(key: bytes) -> bytes:
    """The run key of a run record's key, in either partition."""
    return key.partition(_RANKED)[0]


@dataclass
class RunHistory:
    """Folds run records as they are read; ``runs`` gives each run's record in effect."""

    _in_effect: dict[tuple[str, str], _InEffect] = field(default_factory=dict)
    # What compaction would leave under a run's one key: partition 0's latest copy (None: a
    # tombstone), and the history's latest value of a 0.x key (one key per run there too).
    _latest: dict[tuple[int, tuple[str, str]], tuple[RunStatus, int] | None] = field(default_factory=dict)
    # The ranks the history holds under keys of their own (``history_key``): compaction keeps them.
    _ranked: dict[tuple[str, str], set[tuple[RunStatus, int]]] = field(default_factory=dict)
    # Where in partition 0 (the decisions' order) each run's loss of a generation was acknowledged,
    # (prefix, run, generation) -> offset: a repair of the next generation decided after it is void.
    acknowledged_at: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def add(self, e: Entry) -> None:
        plain = run_key_of(e.key)
        prefix, _, run = plain[len(RUN_KEY) :].decode().partition(":")
        key = (prefix, run)
        ranked = e.partition == HISTORY and plain != e.key
        got = None if e.value is None else status_of(e.value)
        if ranked and got is not None:
            self._ranked.setdefault(key, set()).add(got)
        else:
            self._latest[(e.partition, key)] = got
        if got is None:  # a tombstone: as after compaction, nothing of the key is left there
            if e.partition != HISTORY:  # partition 0 is read first: what is in effect came from it
                self._in_effect.pop(key, None)
            return
        # The highest rank of both partitions: a copy that landed where its twin did not still counts.
        now = self._in_effect.get(key)
        if now is None or got == (now.status, now.generation) or may_follow((now.status, now.generation), got):
            self._in_effect[key] = _InEffect(e.partition, got[0], got[1], e.value or b"")
            if got[0] is RunStatus.ACKNOWLEDGED and e.partition != HISTORY:  # only one that took effect
                self.acknowledged_at.setdefault((prefix, run, got[1]), e.offset)

    def record(self, key: tuple[str, str]) -> RunRecord | None:
        """The run's record in effect, whatever a read keeps."""
        r = self._in_effect.get(key)
        return None if r is None else RunRecord.from_json(r.raw)

    def overruled(self) -> dict[tuple[str, str], RunStatus]:
        """Runs whose record in effect compaction could lose, (prefix, run) -> the status of the late
        record a key would keep instead: partition 0's latest copy ranks below the record in effect
        (a COMMITTED run keeps no copy there), or a 0.x history key's latest value does and no key
        of its own holds the record. Appending the record again settles them (``DecisionLog.settle``)."""
        out: dict[tuple[str, str], RunStatus] = {}
        for (partition, key), latest in self._latest.items():
            now = self._in_effect.get(key)
            if now is None or latest is None or latest == (now.status, now.generation):
                continue
            held = (now.status, now.generation) in self._ranked.get(key, set())
            if rank(*latest) < rank(now.status, now.generation) and (partition != HISTORY or not held):
                out[key] = latest[0]
        return out

    def runs(self, keep_run: Callable[[str, str, bytes], bool] | None) -> dict[tuple[str, str], RunRecord]:
        return {
            key: RunRecord.from_json(r.raw)
            for key, r in self._in_effect.items()
            if keep_run is None or keep_run(key[0], key[1], r.raw)
        }


__all__ = ["FINAL", "HISTORY", "RunHistory", "history_key", "may_follow", "rank", "run_key_of", "status_of"]
