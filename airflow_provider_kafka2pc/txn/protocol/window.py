"""The transaction window (DESIGN §3b): how long a run's transactions may stay open, and what fits.

A run's window runs from its first transactional record to its last EndTxn, and the broker aborts
any transaction older than its ``transaction.timeout.ms``. The window is split, in this order:

    writing (the Spark write job) | hand-over (prepare ends -> commit starts) | commit headroom

The commit's headroom (decision write + EndTxn waves + marker wait) is derived here from the
timeout and the run's size, so the export's budget and the commit's "too late to start" check use
one number. Nothing here talks to Kafka or Spark: the export feeds it what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.protocol.errors import (
    WindowError,
    WindowExceededError,
    WindowRefusedError,
)

# The commit's headroom is a quarter of the timeout within [floor, ceiling], plus one EndTxn wave
# per ``max_workers`` transactions. The floor covers a decision write and a retried EndTxn on a
# healthy cluster (both take tens of ms, a coordinator move a few seconds); the ceiling is what a
# commit may spend at most on a 15-minute cap (the old fixed 90 s: 30 s decision flush + 60 s EndTxn).
HEADROOM_FLOOR_MS = 5_000
HEADROOM_CEILING_MS = 90_000
HEADROOM_SHARE = 0.25
END_TXN_WAVE_MS = 250  # one parallel wave of EndTxn and its markers, generous (measured: ~20 ms)

# Between the prepare task's end and the commit task's first EndTxn: XCom, the scheduler starting the
# next task, the commit's own start-up (imports, connections). Gate tasks add their own time.
DEFAULT_HANDOVER_MS = 10_000

# The fixed cost of each write task (init_transactions, prepare, the Python worker's start), added
# to what its records take at the rate in force.
TASK_FIXED_MS = 1_000

# A write job shorter than this shows no rate: its tasks' start-up would pass for a slow rate, and
# a next, larger export would be refused by it.
SHORTEST_SHOWING_S = 1.0


# Why a budget has no estimate: the frame was not computed first, so its size is unknown.
NOT_MATERIALIZED = "the data is not materialized first"
# Why a budget has no estimate: the size is known, the rate is not.
NO_RATE = "no write rate stated, and none shown by an earlier run of this exporter"


def commit_headroom_ms(
    timeout_ms: int,
    transactions: int,
    max_workers: int = 16,
    override_ms: int | None = None,
    worst_case_ms: int | None = None,
) -> int:
    """What the commit needs before the earliest broker deadline: ``override_ms`` when given, else
    derived from the timeout in force and the number of transactions (see the constants above), but
    never more than ``worst_case_ms``, the most the commit can spend (its own timeouts)."""
    if override_ms is not None:
        if override_ms < 0:
            raise ValueError(f"commit_headroom_ms={override_ms}: must be >= 0")
        return override_ms
    base = min(HEADROOM_CEILING_MS, max(HEADROOM_FLOOR_MS, int(timeout_ms * HEADROOM_SHARE)))
    derived = base + math.ceil(max(transactions, 1) / max(max_workers, 1)) * END_TXN_WAVE_MS
    return derived if worst_case_ms is None else min(derived, worst_case_ms)


@dataclass(frozen=True)
class PartitionSize:
    partition: int
    records: int
    bytes: int


@dataclass(frozen=True)
class WriteRate:
    """What one task slot writes per second, and where that number comes from: stated by the user, or
    shown by an earlier run of the exporter. A partition takes the longer of its records and its bytes
    at these rates (either may be unknown)."""

    records_per_s: float | None
    bytes_per_s: float | None
    source: str

    def __post_init__(self) -> None:
        if self.records_per_s is None and self.bytes_per_s is None:
            raise ValueError("a write rate needs records_per_s or bytes_per_s")
        if any(r is not None and r <= 0 for r in (self.records_per_s, self.bytes_per_s)):
            raise ValueError("write rates must be positive")

    def seconds(self, records: int, nbytes: int) -> float:
        by_records = records / self.records_per_s if self.records_per_s else 0.0
        by_bytes = nbytes / self.bytes_per_s if self.bytes_per_s else 0.0
        return max(by_records, by_bytes)

    @classmethod
    def shown(cls, sizes: Sequence[PartitionSize], seconds: float, slots: int, source: str) -> WriteRate | None:
        """The rate per slot a write job showed: the lowest at which ``WriteEstimate`` gives the job's
        own sizes the time it took (``seconds``), so the same export is budgeted exactly the time it
        took, skew included. A job whose fixed costs would be half its time or more shows its plain
        throughput (the same export is then budgeted more than it took, never a rate above twice
        what it moved). None for a job under
        ``SHORTEST_SHOWING_S``: start-up costs would pass for a slow rate."""
        busy = [s for s in sizes if s.records > 0]
        if not busy or seconds < SHORTEST_SHOWING_S:
            return None
        slots = max(slots, 1)
        fixed = TASK_FIXED_MS / 1000
        # Fixed costs of half the job or more: inverting them would divide by nearly nothing and
        # show a rate many times what the job moved, admitting exports that cannot fit.
        if seconds < 2 * fixed or slots * seconds - len(busy) * fixed < slots * seconds / 2:
            fixed = 0.0

        def lowest(amounts: list[int]) -> float | None:
            largest, total = max(amounts), sum(amounts)
            if total <= 0:
                return None
            # The estimate is the longest partition, or the sum spread over the slots: the rate must
            # bring both within ``seconds``.
            return max(largest / (seconds - fixed), total / (slots * seconds - len(busy) * fixed))

        records, nbytes = lowest([s.records for s in busy]), lowest([s.bytes for s in busy])
        return cls(records, nbytes, source) if records is not None or nbytes is not None else None

    def describe(self) -> str:
        parts = [
            f"{self.records_per_s:.0f} records/s" if self.records_per_s else "",
            f"{self.bytes_per_s:.0f} bytes/s" if self.bytes_per_s else "",
        ]
        return f"{' and '.join(p for p in parts if p)} per slot ({self.source})"

    def to_json(self) -> dict[str, object]:
        return {"records_per_s": self.records_per_s, "bytes_per_s": self.bytes_per_s, "source": self.source}

    @classmethod
    def from_json(cls, d: object) -> WriteRate | None:
        """A rate kept by an earlier run; None for anything else (an older or foreign value)."""
        if not isinstance(d, dict):
            return None
        try:
            return cls(d.get("records_per_s"), d.get("bytes_per_s"), str(d["source"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class WriteEstimate:
    """The expected duration of the write job over materialized data, and what it is based on."""

    records: int
    bytes: int
    partitions: int  # non-empty ones: each opens one transaction
    slots: int  # Spark task slots the job can use at once
    expected_ms: int
    rate: WriteRate

    @classmethod
    def of(cls, sizes: list[PartitionSize], slots: int, rate: WriteRate) -> WriteEstimate:
        """Each partition takes its fixed cost plus its records and bytes at ``rate``; the job takes
        its longest partition, or the sum spread over the slots if that is longer."""
        busy = [s for s in sizes if s.records > 0]
        slots = max(slots, 1)
        times = [TASK_FIXED_MS + 1000 * rate.seconds(s.records, s.bytes) for s in busy]
        expected = max(max(times, default=0.0), sum(times) / slots)
        return cls(
            records=sum(s.records for s in busy),
            bytes=sum(s.bytes for s in busy),
            partitions=len(busy),
            slots=slots,
            expected_ms=math.ceil(expected),
            rate=rate,
        )

    def describe(self) -> str:
        return (
            f"{self.records} records, {self.bytes} bytes in {self.partitions} partition(s) on {self.slots} task "
            f"slot(s): about {self.expected_ms / 1000:.1f} s at {self.rate.describe()}"
        )


@dataclass(frozen=True)
class WindowBudget:
    """The window of one prepare: the timeout in force, split into writing, hand-over and commit."""

    timeout_ms: int
    headroom_ms: int
    handover_ms: int
    estimate: WriteEstimate | None = None  # None: the size or the rate is unknown (``unknown`` says which)
    unknown: str = NOT_MATERIALIZED

    @classmethod
    def of_sizes(
        cls,
        timeout_ms: int,
        headroom_ms: int | None,
        handover_ms: int,
        sizes: list[PartitionSize],
        slots: int,
        rate: WriteRate | None,
    ) -> WindowBudget:
        """The budget of a run whose partitions' sizes are known: a pure function, so that every task
        of a barrier stage, given the same sizes, decides alike (``headroom_ms``: an override, or None)."""
        transactions = sum(1 for s in sizes if s.records > 0)
        estimate = WriteEstimate.of(sizes, slots, rate) if rate is not None else None
        headroom = commit_headroom_ms(timeout_ms, transactions, override_ms=headroom_ms)
        return cls(timeout_ms, headroom, handover_ms, estimate, NO_RATE)

    @property
    def write_ms(self) -> int:
        """How long the write job may run, from its start, before its transactions are doomed."""
        return self.timeout_ms - self.headroom_ms - self.handover_ms

    @property
    def fits(self) -> bool:
        if self.write_ms <= 0:
            return False
        return self.estimate is None or self.estimate.expected_ms <= self.write_ms

    def describe(self) -> str:
        expected = (
            f"; expected write {self.estimate.describe()}"
            if self.estimate is not None
            else f"; expected write unknown ({self.unknown}): nothing is refused up front, the write is stopped "
            f"if it runs past {self.write_ms} ms"
        )
        return (
            f"transaction.timeout.ms={self.timeout_ms}: commit headroom {self.headroom_ms} ms, hand-over to the "
            f"commit {self.handover_ms} ms, left for writing {self.write_ms} ms{expected}"
        )

    def refusal(self) -> WindowRefusedError:
        """The error that refuses this budget, naming the numbers and fixes that can work."""
        if self.write_ms <= 0:
            why = (
                f"the commit headroom ({self.headroom_ms} ms) and the hand-over ({self.handover_ms} ms) leave no time "
                f"for writing within transaction.timeout.ms={self.timeout_ms}"
            )
        else:
            assert self.estimate is not None
            why = (
                f"writing {self.estimate.describe()}, which is more than the {self.write_ms} ms left for writing "
                f"within transaction.timeout.ms={self.timeout_ms} (commit headroom {self.headroom_ms} ms, "
                f"hand-over {self.handover_ms} ms)"
            )
        return WindowRefusedError(
            f"the export was refused before any transaction opened: {why}. Nothing was written. Fixes: give the "
            "export more task slots (executors or cores) so partitions write in parallel; split it into several "
            "export tasks feeding one commit; raise the broker's transaction.max.timeout.ms where the service "
            "allows it; or, if this cluster writes faster than the rate used here, state its rate with "
            "write_records_per_s / write_bytes_per_s"
        )


__all__ = [
    "DEFAULT_HANDOVER_MS",
    "NOT_MATERIALIZED",
    "NO_RATE",
    "PartitionSize",
    "WindowBudget",
    "WindowError",
    "WindowExceededError",
    "WindowRefusedError",
    "WriteEstimate",
    "WriteRate",
    "commit_headroom_ms",
]
