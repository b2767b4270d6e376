"""What a prepare job reports: its committables, counts, timings and the window it had."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.protocol.committable import Committable

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.window import WindowBudget, WriteRate


@dataclass(frozen=True)
class ExportResult:
    committables: tuple[Committable, ...]
    records: int
    bytes: int
    partitions: int  # non-empty Spark partitions written
    counts_by_topic: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    retried: tuple[int, ...] = ()  # partitions whose successful attempt was a retry
    budget: WindowBudget | None = None  # EXACTLY_ONCE: the window the write phase had
    materialize_s: float = 0.0  # computing and storing the frame, before any transaction opened
    write_s: float = 0.0  # the write job: transactions open from its start
    write_rate: WriteRate | None = None  # what a task slot wrote per second (materialized frames only)
    staged_bytes: int = 0  # the Arrow files the source was staged in (spark/staging.py), if it was

    @property
    def first_write_ms(self) -> int | None:
        """Wall-clock ms of the run's first transactional record (its window opens there)."""
        return min((c.first_write_ms for c in self.committables if c.first_write_ms), default=None)

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "bytes": self.bytes,
            "partitions": self.partitions,
            "transactions": len(self.committables),
            "counts_by_topic": dict(self.counts_by_topic),
            "duration_s": round(self.duration_s, 3),
            "retried_partitions": list(self.retried),
            "materialize_s": round(self.materialize_s, 3),
            "write_rate": self.write_rate.to_json() if self.write_rate is not None else None,
            "staged_bytes": self.staged_bytes,
            "write_s": round(self.write_s, 3),
            "first_write_ms": self.first_write_ms,
            # With first_write_ms, a lower bound of the broker deadline that a failed commit can name
            # without asking Kafka (the XCom's committables do not carry it).
            "transaction_timeout_ms": min(
                (c.transaction_timeout_ms for c in self.committables if c.transaction_timeout_ms), default=None
            ),
        }


__all__ = ["ExportResult"]
