"""What a failed commit says last: the run's state and the next step, in one line a user reads first.

The commit task records how far it got (``CommitProgress``: nothing decided, a decision sent and
not confirmed, a COMMIT in force, how many EndTxn went through) while it works; when it fails,
``failure_line`` turns that and the error into one sentence: is there a decision, how many
transactions wait and until when (their broker deadline), and what to click. It never asks Kafka:
the failure may be that Kafka cannot be reached.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    MalformedCommittableError,
    RunAbortedError,
    SecondExportError,
    TransactionLostError,
    acknowledge_command,
)


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

    def failure_line(self, error: BaseException) -> str:
        """The run's state after ``error`` and the next step."""
        run = f"run {self.run}"
        if isinstance(error, TransactionLostError):
            seen = "; ".join(v.sentence() for v in error.visibility) or f"{len(error.lost)} transaction(s) lost"
            commands = " and ".join(
                f"`{acknowledge_command(p, r)}`" for p, r in sorted({(t.prefix, t.run) for t in error.lost})
            )
            return (
                f"{run}: decided COMMIT, and part of it can never become visible: {seen}. Next: re-export the lost "
                f"partitions, then acknowledge the loss with {commands}."
            )

        if isinstance(error, SecondExportError):
            return (
                f"{run}: already decided by its first COMMIT ({self.decision_id or 'see the error'}); these "
                f"{self.transactions} transaction(s) came from a second export of the run and were aborted. The run "
                "stays as its first decision made it. Next: nothing to do for this run."
            )
        if isinstance(error, RunAbortedError | DecisionConflictError):
            return (
                f"{run}: aborted as a whole, nothing of it is visible. Next: clear the whole DAG run to export it "
                "again."
            )
        if isinstance(error, MalformedCommittableError):
            return (
                f"{run}: no decision was written: a committable was refused ({type(error).__name__}). Next: check the "
                "export task's XCom, then clear the whole DAG run; what this run left open is ended by its abort task "
                "or the exporter's next recovery, at the latest at its broker deadline."
            )
        waiting = f"{self.transactions} transaction(s) with {self.records} records"
        until = self._until()
        if self.decision_id is not None:
            done = f"{self.committed} of {self.transactions}" if self.committed else "none or some"
            return (
                f"{run}: COMMIT {self.decision_id} is decided, so the whole run becomes visible; {done} of its "
                f"transactions were committed when this failed, the rest are prepared{until}. Next: clear this "
                f"commit task once Kafka answers{' (before that time)' if until else ''}: it commits the rest."
            )
        if not self.log_read and not self.first_try:
            return (
                f"{run}: the decision log could not be read, so it is not known whether an earlier try of this task "
                f"decided the run ({self._describe()} shows it); {waiting} are prepared{until}. Next: clear this "
                "commit task after Kafka is back: it finishes the run whichever way it went."
            )
        if self.decision_sent:
            return (
                f"{run}: the COMMIT decision was sent but Kafka did not confirm it, so it may or may not be written; "
                f"{waiting} are prepared{until}. Next: clear this commit task after Kafka is back: it finishes the "
                f"run whichever way it went ({self._describe()} shows the decision)."
            )
        before = " and before then" if until else ""
        return (
            f"{run}: no decision was written; {waiting} are prepared, not visible,"
            f"{until or ' until their broker deadline'}. Next: clear this commit task after Kafka is back{before}; "
            "past it the broker aborts them and the whole DAG run must be cleared."
        )

    def _until(self) -> str:
        if self.deadline_ms is None:
            return ""
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.deadline_ms / 1000))
        return f" until {at}" if self.deadline_exact else f" until at least {at}"

    def _describe(self) -> str:
        return " or ".join(f"`kafka2pc describe --prefix {p}`" for p in self.prefixes) or "`kafka2pc describe`"
