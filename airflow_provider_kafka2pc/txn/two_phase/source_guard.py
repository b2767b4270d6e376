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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
from airflow_provider_kafka2pc.txn.kafka.source_snapshot import (
    group_offsets,
    offsets_not_moved_sentence,
    settled_group_offsets,
)
from airflow_provider_kafka2pc.txn.kafka.transactions import coordinator_error, retry
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient, error_name
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, OffsetsNotMovedError
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange, moved_elsewhere, offset_text

_SHOWN = 5


class SourceGuard:
    """The checks of one commit's Kafka sources; ``sources`` pairs each range with the committable
    of its offsets participant."""

    def __init__(self, config: Mapping[str, Any], sources: Sequence[tuple[SourceRange, Committable]]) -> None:
        self.config = config
        self.sources = tuple(sources)

    def before_decision(self, wire: WireClient) -> dict[str, str]:
        """``{offsets participant: why}`` for each source whose group moved since its run's snapshot,
        or whose offsets could not be sent into its transaction again; empty when the run may commit,
        every group's offsets then being the latest write to it."""
        found = self._moved()
        if found:
            return found
        for source, c in self.sources:
            why = self._send_again(wire, source, c)
            if why:
                found[c.transactional_id] = why
        return found

    def after_commit(self, run: str, committed: Iterable[str]) -> None:
        """Raise ``OffsetsNotMovedError`` for each source whose offsets participant committed
        (``committed``: transactional ids) while its group is not at the run's ends."""
        done = set(committed)
        for source, c in self.sources:
            if c.transactional_id not in done:
                continue
            partitions = [(p.topic, p.partition) for p in source.partitions]
            now = settled_group_offsets(self.config, source.group_id, partitions)
            at = [(p, now[(p.topic, p.partition)]) for p in source.partitions]
            behind = [(p, offset) for p, offset in at if offset != p.end]
            if behind:
                raise OffsetsNotMovedError(
                    offsets_not_moved_sentence(run, source, behind, str(self.config.get("bootstrap.servers", "")))
                )

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

    def _send_again(self, wire: WireClient, source: SourceRange, c: Committable) -> str | None:
        """TxnOffsetCommit of the range's ends into ``c``'s open transaction; why it could not be, or None."""
        what = f"TxnOffsetCommit({c.transactional_id!r}, group {source.group_id!r})"

        def go() -> None:
            codes = wire.txn_offset_commit(
                c.transactional_id, c.producer_id, c.producer_epoch, source.group_id, source.ends()
            )
            code = next((code for code in codes.values() if code), 0)
            if code:
                named = authorization_error_of(error_name(code), self.config, source.group_id, "Read")
                if named is not None:
                    raise named
                raise coordinator_error(code, what)  # retriable codes are waited out by retry

        try:
            retry(what, go)
        except KafkaAuthorizationError:
            raise  # nothing decided yet: the fix is an ACL, and the run can still commit after it
        except Kafka2PCError as e:
            # The transaction can no longer take its offsets (aborted on timeout, fenced, ...): doomed,
            # decided by the DescribeTransactions the abort that follows makes, not guessed from a code.
            return f"its offsets could not be sent into its transaction again before the decision: {e}"
        return None
