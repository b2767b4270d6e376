"""The commit's guard for a Kafka source: the group's offsets move with the output, or it is said.

A run commits its source group's offsets as a group without members (KIP-447, generation -1), so
the broker cannot fence another consumer that commits to the same group meanwhile. And when the
run's transaction commits, the broker keeps whichever commit of a group partition is *later in the
offsets log*: a regular commit made after the run's TxnOffsetCommit wins even when it writes the
value the group already had (``kafka-consumer-groups --reset-offsets --to-current``, a script that
re-commits offsets so they do not expire). Comparing values cannot see that. So the guard, around
the decision:

1. ``before_decision`` reads the group's offsets (past the run's own pending commit) and compares
   them with the run's snapshot: a group that moved dooms the offsets participant, and the commit
   aborts the run as a whole, named. Then it sends the range's ends into the open offsets
   transaction again (TxnOffsetCommit by producer id and epoch), so the run's offsets are the
   group's latest write when the decision is taken.
2. ``after_commit`` reads the group once its commit has settled: a regular commit in the remaining
   moment (between that resend and the EndTxn) leaves the output visible and the group behind, and
   ``OffsetsNotMovedError`` says exactly that, with the commands that move the group to the run's end.
   A group past the run's ends is never called behind: a commit that resumes after a pause finds it
   there once later runs committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.errors import (
    KafkaAuthorizationError,
    RetriableCoordinatorError,
    error_name,
    is_connection_error,
)
from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.kafka.source_snapshot import (
    group_offsets,
    offsets_not_moved_sentence,
    settled_group_offsets,
)
from airflow_provider_kafka2pc.txn.kafka.transactions import coordinator_error
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import CoordinatorError, Kafka2PCError, OffsetsNotMovedError
from airflow_provider_kafka2pc.txn.protocol.source_range import (
    SourceRange,
    at_start,
    moved_elsewhere,
    not_at_end,
    offset_text,
)

log = logging.getLogger(__name__)

_SHOWN = 5
# How long the resend may wait out a coordinator: within the commit's headroom, which the coordinator
# checks again after the guard.
_RESEND_BUDGET_S = 15.0


class SourceGuard:
    """The checks of one commit's Kafka sources; ``sources`` pairs each range with the committable
    of its offsets participant."""

    def __init__(self, config: Mapping[str, Any], sources: Sequence[tuple[SourceRange, Committable]]) -> None:
        self.config = config
        self.sources = tuple(sources)

    def before_decision(self, wire: WireClient, resend_s: float = _RESEND_BUDGET_S) -> tuple[dict[str, str], bool]:
        """``({offsets participant: why}, whether a group moved)``: each source whose group moved since
        its run's snapshot, or whose offsets the broker refused to take into its transaction again;
        empty when the run may commit, every group's offsets then being the latest write to it.

        The resend is made only where the broker verifies it against the transaction (Kafka 3.7+): an
        older one would take it for a transaction another actor just ended and keep a pending offset
        commit no coordinator ever ends. There the after-commit check alone says what happened. A
        coordinator that does not answer within ``resend_s`` raises (nothing decided yet: the task's
        retry tries again); it never aborts a prepared run."""
        found = self._moved()
        if found:
            return found, True
        if not wire.verifies_txn_offset_commits():
            log.info("the broker does not verify transactional offset commits (Kafka < 3.7): offsets not sent again")
            return {}, False
        for source, c in self.sources:
            why = self._send_again(wire, source, c, resend_s)
            if why:
                found[c.transactional_id] = why
        return found, False

    def after_commit(self, run: str, committed: Iterable[str]) -> None:
        """Raise ``OffsetsNotMovedError`` for each source whose offsets participant committed
        (``committed``: transactional ids) while its group is behind the run's ends. The run is
        committed whatever this finds: a group that cannot be read is logged, not raised as a failure
        of the commit. A group past the ends is not behind this run: later runs moved it on (this
        commit resumed after a pause, DESIGN §15), and moving it back, as the commands would, makes
        the next run export theirs again; a group someone else moved past them, the next run's
        snapshot names."""
        done = set(committed)
        for source, c in self.sources:
            if c.transactional_id not in done:
                continue
            partitions = [(p.topic, p.partition) for p in source.partitions]
            try:
                now = settled_group_offsets(self.config, source.group_id, partitions)
            except Kafka2PCError as e:
                log.warning(
                    "run %s committed; consumer group %r could not be read to check that it moved with the output "
                    "(%s): kafka2pc describe shows where it stands",
                    run,
                    source.group_id,
                    e,
                )
                continue
            behind = [(p, now.get((p.topic, p.partition))) for p in source.partitions]
            self._raise_if_behind(
                run, source, [(p, offset) for p, offset in behind if offset is None or offset < p.end]
            )

    def still_behind(self, run: str) -> None:
        """For a commit that finds its run already final: raise ``OffsetsNotMovedError`` while a
        source's group stands at the run's start (a retry or a clear of the commit task must not turn
        green while the group is behind); a group a later run moved on is fine."""
        for source, _ in self.sources:
            partitions = [(p.topic, p.partition) for p in source.partitions]
            try:
                off = not_at_end(source, group_offsets(self.config, source.group_id, partitions, stable=False))
            except Kafka2PCError as e:
                log.warning(
                    "consumer group %r could not be read (%s): kafka2pc describe shows where it stands",
                    source.group_id,
                    e,
                )
                continue
            if at_start(off):
                self._raise_if_behind(run, source, off)

    def _raise_if_behind(self, run: str, source: SourceRange, behind: Sequence[tuple[Any, int | None]]) -> None:
        if behind:
            bootstrap = str(self.config.get("bootstrap.servers", ""))
            raise OffsetsNotMovedError(offsets_not_moved_sentence(run, source, behind, bootstrap))

    def _moved(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for source, c in self.sources:
            partitions = [(p.topic, p.partition) for p in source.partitions]
            moved = moved_elsewhere(source, group_offsets(self.config, source.group_id, partitions, stable=False))
            if moved:
                said = ", ".join(
                    f"{p.name} is at {offset_text(now)}, the run read from {offset_text(p.committed)}"
                    for p, now in moved[:_SHOWN]
                )
                found[c.transactional_id] = (
                    f"consumer group {source.group_id!r} moved while the run waited for its commit ({said}): another "
                    "consumer of the group committed offsets, or they were reset or deleted"
                )
        return found

    def _send_again(self, wire: WireClient, source: SourceRange, c: Committable, budget_s: float) -> str | None:
        """TxnOffsetCommit of the range's ends into ``c``'s open transaction; why the broker refused
        it (the transaction ended, was fenced or aborted on timeout), or None."""
        what = f"TxnOffsetCommit({c.transactional_id!r}, group {source.group_id!r})"

        def go() -> None:
            codes = wire.txn_offset_commit(
                c.transactional_id, c.producer_id, c.producer_epoch, source.group_id, source.ends()
            )
            code = next((code for code in codes.values() if code), 0)
            if code:
                named = self._not_allowed(error_name(code), source, c)
                if named is not None:
                    raise named
                raise coordinator_error(code, what)  # retriable codes are waited out by retry

        try:
            retry(what, go, budget_s)
        except KafkaAuthorizationError:
            raise  # nothing decided yet: the fix is an ACL, and the run can still commit after it
        except CoordinatorError as e:
            if isinstance(e.__cause__, RetriableCoordinatorError) or is_connection_error(e.__cause__ or e):
                raise  # not answered in time: nothing decided, the task's retry asks again
            # Refused: the transaction cannot take its offsets any more. The abort that follows
            # describes it and says what it is, not this code.
            return f"the broker refused its offsets into its transaction again before the decision: {e}"
        return None

    def _not_allowed(self, name: str, source: SourceRange, c: Committable) -> KafkaAuthorizationError | None:
        """The ACL a TxnOffsetCommit refusal names: Read on the group or the source topic, Write on the
        transactional id."""
        if name == "TOPIC_AUTHORIZATION_FAILED":
            return authorization_error_of(name, self.config, source.topics[0], "Read")
        if name == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
            return authorization_error_of(name, self.config, c.transactional_id, "Write")
        return authorization_error_of(name, self.config, source.group_id, "Read")
