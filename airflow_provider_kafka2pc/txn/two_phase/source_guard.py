"""The commit's guard for a Kafka source: the group's offsets must still be where the run read from.

A run commits its source group's offsets as a group without members (KIP-447, generation -1), so
the broker cannot fence another consumer that commits to the same group meanwhile. Before deciding,
the commit reads the group's committed offsets (past its own pending offset commit) and compares
them with the run's snapshot; a group that moved dooms the run's offsets participant, and the
commit aborts the run as a whole, named, instead of overwriting the other consumer's position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.source_snapshot import group_offsets
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange, moved_elsewhere, offset_text


def offsets_guard(
    config: Mapping[str, Any], sources: Sequence[tuple[SourceRange, str]]
) -> Callable[[], dict[str, str]] | None:
    """``{offsets participant: why}`` for each source whose group moved since its run's snapshot;
    ``sources`` pairs each range with its offsets participant. None without a source."""
    if not sources:
        return None

    def check() -> dict[str, str]:
        found: dict[str, str] = {}
        for source, tid in sources:
            partitions = [(p.topic, p.partition) for p in source.partitions]
            moved = moved_elsewhere(source, group_offsets(config, source.group_id, partitions, stable=False))
            if moved:
                said = ", ".join(
                    f"{p.name} is at {offset_text(now)}, the run read from {offset_text(p.committed)}"
                    for p, now in moved[:5]
                )
                found[tid] = (
                    f"consumer group {source.group_id!r} moved while the run waited for its commit ({said}): another "
                    "consumer of the group committed offsets, or they were reset or deleted"
                )
        return found

    return check
