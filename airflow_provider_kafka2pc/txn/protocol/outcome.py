"""The one table of outcomes (DESIGN §5): what a committable's state on the broker means.

DescribeTransactions, not an EndTxn error code, tells the truth about a committable. Every path
that has to decide something about a prepared transaction observes it here first and then looks
up the verdict in ``OUTCOME_TABLE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

# Kafka error codes we react to (numbers from the protocol's error table).
NONE = 0
REQUEST_TIMED_OUT = 7
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
NOT_ENOUGH_REPLICAS = 19
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
PRODUCER_FENCED = 90
TRANSACTIONAL_ID_NOT_FOUND = 105

# Re-find the coordinator, back off, send the same request again at the same version.
RETRIABLE = frozenset(
    {
        REQUEST_TIMED_OUT,
        COORDINATOR_LOAD_IN_PROGRESS,
        COORDINATOR_NOT_AVAILABLE,
        NOT_COORDINATOR,
        NOT_ENOUGH_REPLICAS,
        CONCURRENT_TRANSACTIONS,
    }
)
# Coordinator-lookup problems: the next FindCoordinator may name another broker.
STALE_COORDINATOR = frozenset({COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR})


class Intent(StrEnum):
    """What the coordinator (the DAG run) decided for the transaction."""

    COMMIT = "COMMIT"
    ABORT = "ABORT"


class Observation(StrEnum):
    """A committable (tid, producer id p, epoch e) as DescribeTransactions shows it."""

    OPEN = "open"  # Ongoing, p, e: prepared and waiting
    COMMITTING = "committing"  # PrepareCommit, p, e: the broker has the commit, markers pending
    COMMITTED = "committed"  # CompleteCommit, p, e
    ABORTING = "aborting"  # PrepareAbort, p, e
    ABORTED = "aborted"  # CompleteAbort, p, e
    FENCING = "fencing"  # PrepareEpochFence: the broker is aborting it on timeout right now
    EMPTY = "empty"  # Empty, p, e: the id was initialised but this transaction never started
    SUPERSEDED = "superseded"  # epoch > e or another producer id: timed out (epoch + 1) or fenced
    UNKNOWN_ID = "unknown id"  # the broker no longer knows the id (expired) or never did


class Verdict(StrEnum):
    END_TXN = "end the transaction as intended"
    COMMITTED = "committed"
    ABORTED = "aborted"
    LOST = "lost"
    WAIT = "wait and observe again"
    CONSULT_LOG = "committed if the decision log says COMMITTED, else lost (commit) or gone (abort)"


OUTCOME_TABLE: dict[tuple[Observation, Intent], Verdict] = {
    (Observation.OPEN, Intent.COMMIT): Verdict.END_TXN,
    (Observation.OPEN, Intent.ABORT): Verdict.END_TXN,
    (Observation.COMMITTING, Intent.COMMIT): Verdict.COMMITTED,
    (Observation.COMMITTED, Intent.COMMIT): Verdict.COMMITTED,
    # Committed data cannot be taken back: the abort side reports it and rolls forward.
    (Observation.COMMITTING, Intent.ABORT): Verdict.COMMITTED,
    (Observation.COMMITTED, Intent.ABORT): Verdict.COMMITTED,
    (Observation.ABORTING, Intent.COMMIT): Verdict.LOST,
    (Observation.ABORTED, Intent.COMMIT): Verdict.LOST,
    (Observation.ABORTING, Intent.ABORT): Verdict.ABORTED,
    (Observation.ABORTED, Intent.ABORT): Verdict.ABORTED,
    (Observation.FENCING, Intent.COMMIT): Verdict.WAIT,
    (Observation.FENCING, Intent.ABORT): Verdict.WAIT,
    (Observation.EMPTY, Intent.COMMIT): Verdict.LOST,
    (Observation.EMPTY, Intent.ABORT): Verdict.ABORTED,
    (Observation.SUPERSEDED, Intent.COMMIT): Verdict.CONSULT_LOG,
    (Observation.SUPERSEDED, Intent.ABORT): Verdict.CONSULT_LOG,
    (Observation.UNKNOWN_ID, Intent.COMMIT): Verdict.CONSULT_LOG,
    (Observation.UNKNOWN_ID, Intent.ABORT): Verdict.CONSULT_LOG,
}

_SAME_PRODUCER_STATES = {
    "Ongoing": Observation.OPEN,
    "PrepareCommit": Observation.COMMITTING,
    "CompleteCommit": Observation.COMMITTED,
    "PrepareAbort": Observation.ABORTING,
    "CompleteAbort": Observation.ABORTED,
    "PrepareEpochFence": Observation.FENCING,
    "Empty": Observation.EMPTY,
}

_REASONS = {
    Observation.ABORTING: "the transaction was aborted",
    Observation.ABORTED: "the transaction was aborted",
    Observation.EMPTY: "the broker holds no transaction for this producer epoch",
    Observation.SUPERSEDED: (
        "the producer epoch moved on: the broker aborted the transaction after "
        "transaction.timeout.ms, or a newer producer took the transactional id (fenced)"
    ),
    Observation.FENCING: "the broker is aborting the transaction: transaction.timeout.ms elapsed",
    Observation.UNKNOWN_ID: "the broker does not know the transactional id (expired or never written)",
}


@dataclass(frozen=True)
class TxnRef:
    """The identity of one transaction: all that EndTxn needs."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class HoldsProducer(Protocol):
    """What names a transaction and the producer holding it: a ``TxnRef``, a committable, a
    DescribeTransactions row or a decision record's ``Covered``."""

    @property
    def transactional_id(self) -> str: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...


def observe(ref: TxnRef, state: str | None, producer_id: int, producer_epoch: int) -> Observation:
    """Compare the broker's view of ``ref.transactional_id`` with the transaction we hold.

    ``state`` is None when DescribeTransactions answered TRANSACTIONAL_ID_NOT_FOUND.
    """
    if state is None or state == "Dead":
        return Observation.UNKNOWN_ID
    if producer_id != ref.producer_id or producer_epoch != ref.producer_epoch:
        # During PrepareEpochFence the broker already shows the bumped epoch.
        if state == "PrepareEpochFence" and producer_id == ref.producer_id:
            return Observation.FENCING
        return Observation.SUPERSEDED
    try:
        return _SAME_PRODUCER_STATES[state]
    except KeyError:
        raise ValueError(f"unexpected transaction state {state!r} for {ref.transactional_id!r}") from None


def verdict(observation: Observation, intent: Intent) -> Verdict:
    return OUTCOME_TABLE[(observation, intent)]


def reason(observation: Observation) -> str:
    return _REASONS.get(observation, observation.value)


class _Described(HoldsProducer, Protocol):
    """A DescribeTransactions row (``wire.TxnState``): what ``observe_row`` reads of it."""

    @property
    def state(self) -> str: ...


def observe_row(ref: TxnRef, row: _Described | None) -> Observation:
    """``observe`` for a DescribeTransactions row, None where the broker does not know the id."""
    if row is None:
        return observe(ref, None, -1, -1)
    return observe(ref, row.state, row.producer_id, row.producer_epoch)
