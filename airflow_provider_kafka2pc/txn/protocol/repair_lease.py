"""A repair's lease (DESIGN §6): while a repair of a LOST run exports and commits, recovery and a
second repair of the same run leave its transactions alone.

A repair writes its transactions under ids of its own attempt (``{prefix}-repair.<run hash>.<n>-{slot}``),
undecided until its COMMIT: a recovery pass over the exporter (the next DAG run's sensor of a POOLING
exporter, ``kafka2pc recover``) or a second repair of the run would abort them as an attempt that
died. The lease says which attempt is alive: the repair appends it before it exports and renews it
every third of its time to live; a repair that ends tombstones it; a killed or paused one stops
renewing, and the lease lapses after ``ttl_ms``. Recovery never aborts the undecided transactions
of an attempt whose lease is live (decisions in force are obeyed whatever the lease says). Of
several repairs of one run, the one whose live lease came first in the log holds the run; the
others wait for it and report its result.

The lease is cooperative, never what makes a repair safe: two repairs that both decide are ruled by
the decision log (one generation, one winner). A holder paused past its lease finds its
transactions aborted by the next holder's recovery pass, and its decision void.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.protocol.naming import parse_transactional_id
from airflow_provider_kafka2pc.txn.protocol.records import REPAIR_LEASE_KEY

FORMAT = 1
DEFAULT_TTL_MS = 30_000  # renewed every 10 s: a repair dead for 30 s no longer holds its run


def lease_key(prefix: str, run: str, holder: str) -> bytes:
    """One key per holder: a second repair's lease never compacts the first's away. The run last:
    an Airflow run id holds ':', a prefix and a holder never do."""
    return f"{REPAIR_LEASE_KEY}{prefix}:{holder}:{run}".encode()


@dataclass(frozen=True)
class RepairLease:
    prefix: str
    run: str
    holder: str  # one repair attempt, e.g. a uuid
    attempt_key: str  # the run key of the ids it writes (``RepairPlan.attempt_key``)
    at_ms: int  # written or renewed at, on the holder's clock
    ttl_ms: int = DEFAULT_TTL_MS
    acquired_offset: int = -1  # where its first lease record is in the log (renewals carry it)

    @property
    def key(self) -> bytes:
        return lease_key(self.prefix, self.run, self.holder)

    def live(self, now_ms: int) -> bool:
        return self.at_ms + self.ttl_ms > now_ms

    def protects(self, transactional_id: str) -> bool:
        parsed = parse_transactional_id(transactional_id)
        return parsed is not None and parsed.prefix == self.prefix and parsed.run_key == self.attempt_key

    def to_json(self) -> bytes:
        d = {
            "v": FORMAT,
            "prefix": self.prefix,
            "run": self.run,
            "holder": self.holder,
            "attempt_key": self.attempt_key,
            "at_ms": self.at_ms,
            "ttl_ms": self.ttl_ms,
            "acquired_offset": self.acquired_offset,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RepairLease:
        d = json.loads(raw)
        return cls(
            str(d["prefix"]),
            str(d["run"]),
            str(d["holder"]),
            str(d["attempt_key"]),
            int(d["at_ms"]),
            int(d["ttl_ms"]),
            int(d.get("acquired_offset", -1)),
        )


def holder_of(leases: Iterable[tuple[int, RepairLease]], now_ms: int) -> RepairLease | None:
    """The live lease that came first: by the offset of its first record (a renewal keeps its place)."""
    live = [(lease.acquired_offset if lease.acquired_offset >= 0 else offset, lease)
            for offset, lease in leases if lease.live(now_ms)]  # fmt: skip
    return min(live, key=lambda pair: pair[0])[1] if live else None


__all__ = ["DEFAULT_TTL_MS", "RepairLease", "holder_of", "lease_key"]
