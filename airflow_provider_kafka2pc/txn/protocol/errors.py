"""Typed errors of the transaction core."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass


class Kafka2PCError(Exception):
    """Base class of every kafka2pc error."""


class InvalidPrefixError(Kafka2PCError, ValueError):
    """A transactional id prefix that cannot be matched unambiguously."""


class PrefixCollisionError(Kafka2PCError):
    """Another exporter already owns this transactional id prefix."""

    def __init__(self, prefix: str, owner: str, claimed_by: str) -> None:
        super().__init__(
            f"transactional id prefix {prefix!r} belongs to exporter {owner!r}; "
            f"{claimed_by!r} must use a prefix of its own, or two exporters would fence "
            "and resolve each other's transactions"
        )
        self.prefix = prefix
        self.owner = owner
        self.claimed_by = claimed_by


class MalformedCommittableError(Kafka2PCError, ValueError):
    """A committable that does not parse or does not describe a transaction."""


class ForeignCommittableError(MalformedCommittableError):
    """A committable whose transactional id is not one of the exporter's ids for this run."""


class MalformedHandoffError(MalformedCommittableError):
    """A Spark application's handoff record that cannot be read as one (``txn.protocol.handoff``)."""


class ForeignHandoffError(ForeignCommittableError):
    """A handoff, under this run's key, that names another exporter or run, or carries their ids."""


class StaleCommittableError(MalformedCommittableError):
    """A committable whose producer id or epoch is not what the broker holds for its id: edited, or
    another producer's. (An older epoch of the same producer is the broker's timeout or a newer run
    fencing it: that is not this error, the run is aborted as a whole.)"""


class MissingTopicError(Kafka2PCError):
    """The export's default topic does not exist (or cannot be seen); kafka2pc never creates data topics."""


class SourceError(Kafka2PCError):
    """A Kafka source that cannot be read as one run's range (a live group, a gap, a missing topic,
    an unresolved earlier run); nothing was written."""


class UnstableOffsetsError(SourceError):
    """A stable offset fetch found an offset commit to the group pending in an open transaction."""


class OffsetsNotMovedError(Kafka2PCError):
    """A committed run's output is visible but its source group is not at the run's ends: a regular
    offset commit replaced the run's own. The message carries the commands that move the group."""


class DeliveryError(Kafka2PCError):
    """A record was not acknowledged by the broker; the transaction must not be committed."""

    def __init__(self, transactional_id: str, failed: int, first_error: str) -> None:
        super().__init__(f"{failed} record(s) of transaction {transactional_id!r} were not delivered: {first_error}")
        self.transactional_id = transactional_id
        self.failed = failed
        self.first_error = first_error


class SupersededExportError(Kafka2PCError):
    """An export try that another try of its exporter superseded (DESIGN §15): mostly a newer try or
    run while this one was paused or cut off. It stood down before it took a transactional id."""

    def __init__(self, prefix: str, what: str) -> None:
        super().__init__(
            f"this export try of exporter {prefix!r} was superseded by another try or run of the exporter, most "
            f"likely while it was paused or cut off ({what}). It stood down before taking a transactional id: it "
            "wrote nothing and ended nothing of the other's. If another try or run of this exporter is running, "
            "its outcome stands (its task, or its run's commit, says what it is); if none is, clear this task "
            "to export again"
        )
        self.prefix = prefix


class CoordinatorError(Kafka2PCError):
    """The transaction coordinator could not be reached or kept answering retriable errors."""


class BrokerUnavailableError(Kafka2PCError):
    """Kafka could not be reached at all; nothing was changed on the broker."""


@dataclass(frozen=True)
class LostTransaction:
    """One committable whose records can no longer become visible."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    records: int
    topic_partitions: tuple[str, ...]
    reason: str
    prefix: str = ""  # the exporter and the run whose decision covered it, for the acknowledge command
    run: str = ""


@dataclass(frozen=True)
class Visibility:
    """How much of one exporter's run, decided COMMIT, a ``read_committed`` consumer sees: counted
    from the broker's view of each transaction or from the run's final record, never assumed."""

    prefix: str
    run: str
    transactions: int
    records: int
    visible_transactions: int
    visible_records: int
    lost_transactions: int
    lost_records: int

    @property
    def pending_transactions(self) -> int:
        """Still open under their own producer: they can still be committed."""
        return self.transactions - self.visible_transactions - self.lost_transactions

    @property
    def partly_visible(self) -> bool:
        return self.lost_transactions > 0 and self.visible_transactions > 0

    def sentence(self) -> str:
        pending = self.pending_transactions
        return (
            f"run {self.run} of exporter {self.prefix}: {self.visible_transactions} of {self.transactions} "
            f"transaction(s) visible ({self.visible_records} of {self.records} records), {self.lost_transactions} "
            f"lost ({self.lost_records} records)" + (f", {pending} still open" if pending else "")
        )


class TransactionLostError(Kafka2PCError):
    """Committed records are gone: the run cannot end exactly once without a repair.

    Raised instead of dropping a committable silently. ``visibility`` says, per run, how much of it
    is visible; a run missing there is told to look it up rather than guessed at.
    """

    def __init__(self, lost: Sequence[LostTransaction], visibility: Sequence[Visibility] = ()) -> None:
        self.lost = tuple(lost)
        self.visibility = tuple(visibility)
        records = sum(t.records for t in self.lost)
        lines = [
            f"  {t.transactional_id} (producer id {t.producer_id}, epoch {t.producer_epoch}): "
            f"{t.records} records on {', '.join(t.topic_partitions) or 'no partitions'}: {t.reason}"
            for t in self.lost
        ]
        super().__init__(
            f"{len(self.lost)} transaction(s) with {records} record(s) are lost: the broker aborted them after "
            "the run's COMMIT, and their records are not visible (only a repair makes them so):\n"
            + "\n".join(lines)
            + _what_now(self.lost, self.visibility)
        )


def acknowledge_command(prefix: str, run: str) -> str:
    """The CLI call that acknowledges a lost run, ready to paste."""
    return f"kafka2pc acknowledge --prefix {shlex.quote(prefix)} --run {shlex.quote(run)}"


def repair_command(prefix: str, run: str) -> str:
    """The CLI call that repairs a lost run, ready to paste but for the source it cannot know."""
    return f"kafka2pc repair --prefix {shlex.quote(prefix)} --run {shlex.quote(run)} --source MODULE:NAME"


def loss_next_step(prefix: str, run: str) -> str:
    """What to do about a run that lost transactions after its COMMIT (DESIGN §6), one clause."""
    return (
        "repair the run: clear its export task (it exports exactly the lost Spark partitions again, proves them "
        f"the same records and commits them), or run `{repair_command(prefix, run)}`; if its source no longer "
        "gives the same records, re-export the missing part another way and acknowledge the loss with "
        f"`{acknowledge_command(prefix, run)}`"
    )


def _what_now(lost: Sequence[LostTransaction], visibility: Sequence[Visibility]) -> str:
    known = {(v.prefix, v.run): v for v in visibility}
    runs = sorted({(t.prefix, t.run) for t in lost})
    lines = []
    for prefix, run in runs:
        v = known.get((prefix, run))
        ack = f"`{acknowledge_command(prefix, run)}`" if prefix and run else "`kafka2pc acknowledge`"
        if v is None:
            where = f"`kafka2pc list --prefix {shlex.quote(prefix)}`" if prefix else "`kafka2pc list` of its exporter"
            then = loss_next_step(prefix, run) if prefix and run else f"acknowledge the loss with {ack}"
            lines.append(f"The run was decided COMMIT; {where} shows how much of it is visible. Next: {then}.")
        elif v.visible_transactions:
            lines.append(f"The run is partly visible: {v.sentence()}. Next: {loss_next_step(prefix, run)}.")
        else:
            lines.append(
                f"Nothing of the run is visible, but it was decided COMMIT: {v.sentence()}. Acknowledge the loss "
                f"with {ack}, then start a new DAG run to export it again."
            )
    return "".join("\n" + line for line in lines)


class RunAbortedError(Kafka2PCError):
    """The run could not commit and was aborted as a whole, before anything of it became visible.

    Not a loss: no COMMIT decision ever ruled these records. ``why`` lists the transactions that could
    no longer commit (the others were aborted with them, so that the run stays atomic)."""

    def __init__(self, run: str, transactions: int, records: int, why: Sequence[LostTransaction], fix: str) -> None:
        self.run = run
        self.transactions = transactions
        self.records = records
        self.why = tuple(why)
        lines = [
            f"  {t.transactional_id} (producer id {t.producer_id}, epoch {t.producer_epoch}, {t.records} records on "
            f"{', '.join(t.topic_partitions) or 'no partitions'}): {t.reason}"
            for t in self.why
        ]
        super().__init__(
            f"run {run} was aborted as a whole, nothing of it is visible: {transactions} transaction(s) with "
            f"{records} record(s). {len(self.why)} of them could no longer commit:\n" + "\n".join(lines) + f"\n{fix}"
        )


class DecisionConflictError(Kafka2PCError):
    """The run's COMMIT came after another decision for one of its transactions: the run is aborted."""


class SecondExportError(DecisionConflictError):
    """Transactions of a second export of a run that already has its COMMIT: they were aborted; the
    run stays as its first decision made it (visible, or being committed)."""


class NativeUnsupportedError(Kafka2PCError):
    """The native path cannot write this (a setting, a column); the Python writer can."""


class WindowError(Kafka2PCError):
    """The run's transactions cannot be written and committed within the broker's transaction timeout."""


class WindowRefusedError(WindowError):
    """Refused before any transaction opened: the expected write phase does not fit the window."""


class WindowExceededError(WindowError):
    """The write phase ran past its budget: the job was stopped and what it opened was aborted."""


class NotLostError(Kafka2PCError):
    """Only a LOST run can be acknowledged or repaired."""


class RepairRefusedError(Kafka2PCError):
    """A repair that cannot prove its re-export identical to what was lost: nothing of it is visible."""
