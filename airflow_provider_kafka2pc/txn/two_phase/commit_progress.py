"""How far one commit of a run got (``CommitProgress``): nothing decided, a decision sent and not
confirmed, a COMMIT in force, how many EndTxn went through, the earliest broker deadline.

``commit_prepared`` fills it in as it works; when the commit task fails, the Airflow layer turns it
into the line a user reads first (``operators/failure_lines.py``), without asking Kafka.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.committable import Committable


@dataclass
class CommitProgress:
    """How far one commit of a run got; filled in by ``commit_prepared`` as it goes."""

    run: str
    prefixes: tuple[str, ...]
    transactions: int
    records: int
    # The earliest broker deadline (start + transaction.timeout.ms) of the run's transactions:
    # exact once DescribeTransactions answered, else a lower bound from the export's clock.
    deadline_ms: int | None = None
    deadline_exact: bool = False
    log_read: bool = False  # the decision log was read: an earlier try's decision would be known
    first_try: bool = False  # no earlier try of this commit task could have decided the run
    decision_sent: bool = False  # the COMMIT was sent to the decision log, not yet read back
    decision_id: str | None = None  # the run's COMMIT in force, read back
    committed: int = 0  # transactions this commit ended committed
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        run: str,
        prefixes: Iterable[str],
        committables: Sequence[Committable],
        summaries: Iterable[Mapping[str, Any]] = (),
    ) -> CommitProgress:
        """From the committables (or the exports' summaries, when the XCom's committables do not carry
        their first record's time and timeout): the deadline's lower bound, clock of the export."""
        bounds = [
            c.first_write_ms + c.transaction_timeout_ms
            for c in committables
            if c.first_write_ms and c.transaction_timeout_ms
        ] + [
            int(s["first_write_ms"]) + int(s["transaction_timeout_ms"])
            for s in summaries
            if s.get("first_write_ms") and s.get("transaction_timeout_ms")
        ]
        return cls(
            run,
            tuple(sorted(set(prefixes))),
            len(committables),
            sum(c.records for c in committables),
            min(bounds) if bounds else None,
        )

    def saw_deadlines(self, deadlines: Iterable[int | None]) -> None:
        known = [d for d in deadlines if d is not None]
        if known:
            self.deadline_ms, self.deadline_exact = min(known), True
