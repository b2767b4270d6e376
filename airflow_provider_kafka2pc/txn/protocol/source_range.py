"""A Kafka source's range for one run: what the run reads and where its consumer group moves to.

A Kafka-sourced export (KIP-447) reads, per source partition, the offsets ``[start, end)``: start
is the group's committed offset (or the starting policy's, for a partition the group never
committed), end the partition's last stable offset when the run took its snapshot. The run commits
``end`` as the group's offsets inside one of its own transactions (the offsets participant), so the
source position and the output become visible together. Pure data: the snapshot that fills it is
``txn/kafka/source_snapshot.py``.

Offsets, not records: a range may hold transaction markers and aborted records, which Spark's
``read_committed`` source skips, so a range of 10 offsets reads at most 10 records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

STARTING_POLICIES = ("earliest", "latest")
# How many partitions a sentence names before it says "and N more".
_SHOWN = 5


@dataclass(frozen=True)
class PartitionRange:
    """One source partition's share of a run."""

    topic: str
    partition: int
    start: int  # the first offset the run reads
    end: int  # the first offset it does not read: the last stable offset at the snapshot
    committed: int | None  # the group's offset before the run; None: it had none (start is the policy's)

    @property
    def offsets(self) -> int:
        return max(0, self.end - self.start)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def to_list(self) -> list[Any]:
        return [self.topic, self.partition, self.start, self.end, self.committed]

    @classmethod
    def from_list(cls, v: Any) -> PartitionRange:
        topic, partition, start, end, committed = v
        r = cls(str(topic), _int(partition), _int(start), _int(end), None if committed is None else _int(committed))
        if r.partition < 0 or r.start < 0 or r.end < r.start:
            raise ValueError(f"partition range {v!r}")
        return r


@dataclass(frozen=True)
class SourceRange:
    """The run's range over every partition of its source topics, for one consumer group."""

    group_id: str
    partitions: tuple[PartitionRange, ...]

    @property
    def offsets(self) -> int:
        return sum(p.offsets for p in self.partitions)

    @property
    def moves(self) -> bool:
        """Whether the run moves the group: a partition whose end is not the group's offset (it reads
        records, or pins a partition the group had no offset for, or skips a gap). Only then does the
        run commit the group's offsets; a run with nothing new leaves them as they are."""
        return any(p.end != p.committed for p in self.partitions)

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(sorted({p.topic for p in self.partitions}))

    def ends(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset the group commits with the run."""
        return {(p.topic, p.partition): p.end for p in self.partitions}

    def before(self) -> dict[tuple[str, int], int | None]:
        """(topic, partition) -> the group's offset before the run (None: none)."""
        return {(p.topic, p.partition): p.committed for p in self.partitions}

    def spark_options(self) -> dict[str, str]:
        """``startingOffsets`` and ``endingOffsets`` for Spark's batch Kafka source: this range exactly."""
        starts: dict[str, dict[str, int]] = {}
        ends: dict[str, dict[str, int]] = {}
        for p in self.partitions:
            starts.setdefault(p.topic, {})[str(p.partition)] = p.start
            ends.setdefault(p.topic, {})[str(p.partition)] = p.end
        return {
            "startingOffsets": json.dumps(starts, sort_keys=True),
            "endingOffsets": json.dumps(ends, sort_keys=True),
        }

    def describe(self) -> str:
        """``group 'g': orders-0 [10, 25), orders-1 [0, 3) (18 offsets)``, a few partitions named."""
        moved = [p for p in self.partitions if p.offsets] or list(self.partitions)
        shown = ", ".join(f"{p.name} [{p.start}, {p.end})" for p in moved[:_SHOWN])
        more = f" and {len(moved) - _SHOWN} more partition(s)" if len(moved) > _SHOWN else ""
        return f"group {self.group_id!r}: {shown}{more} ({self.offsets} offsets)"

    def to_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "partitions": [p.to_list() for p in self.partitions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceRange:
        try:
            return cls(str(data["group_id"]), tuple(PartitionRange.from_list(v) for v in data["partitions"]))
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedCommittableError(f"malformed Kafka source range {dict(data)!r}: {e!r}") from e


def offset_text(offset: int | None) -> str:
    """A group's offset as sentences name it: a number, or "no offset"."""
    return "no offset" if offset is None else str(offset)


def moved_elsewhere(
    source: SourceRange, now: Mapping[tuple[str, int], int | None]
) -> list[tuple[PartitionRange, int | None]]:
    """The partitions whose group offset is no longer what the run started from: another
    consumer of the group committed meanwhile (``now`` is a fresh read of the group's offsets)."""
    return _off(source, now, lambda p: p.committed)


def departures(previous: SourceRange, now: SourceRange) -> list[tuple[PartitionRange, int | None]]:
    """The partitions of the exporter's last committed run (``previous``, same group) whose group
    offset is not where that run left it: (its range, the offset now). Empty when they follow on."""
    return not_at_end(previous, {(p.topic, p.partition): p.committed for p in now.partitions})


def not_at_end(
    source: SourceRange, now: Mapping[tuple[str, int], int | None]
) -> list[tuple[PartitionRange, int | None]]:
    """The partitions whose group offset (``now``) is not the range's end."""
    return _off(source, now, lambda p: p.end)


def at_start(off: Sequence[tuple[PartitionRange, int | None]]) -> bool:
    """Whether every partition ``off`` names stands at the offset the group had before the run, and
    some has an offset: a regular commit of the old value replaced the run's own (none at all is
    offsets that expired or were deleted)."""
    return bool(off) and all(now == p.committed for p, now in off) and any(now is not None for _, now in off)


def _off(
    source: SourceRange, now: Mapping[tuple[str, int], int | None], expected: Callable[[PartitionRange], int | None]
) -> list[tuple[PartitionRange, int | None]]:
    """(partition, offset now) for each of ``source``'s partitions ``now`` knows whose offset is not
    ``expected(partition)``."""
    return [
        (p, now[(p.topic, p.partition)])
        for p in source.partitions
        if (p.topic, p.partition) in now and now[(p.topic, p.partition)] != expected(p)
    ]


def cap_ranges(ranges: Iterable[PartitionRange], max_offsets: int | None) -> tuple[PartitionRange, ...]:
    """At most ``max_offsets`` offsets over all partitions, shared as evenly as their backlogs allow
    (a partition with little to read leaves its share to the others); None reads everything."""
    ranges = tuple(ranges)
    if max_offsets is None or sum(r.offsets for r in ranges) <= max_offsets:
        return ranges
    if max_offsets <= 0:
        raise ValueError(f"max_offsets must be positive, got {max_offsets}")
    grant = {r.name: 0 for r in ranges}
    left, open_ = max_offsets, [r for r in ranges if r.offsets]
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for r in list(open_):
            take = min(share, r.offsets - grant[r.name], left)
            grant[r.name] += take
            left -= take
            if grant[r.name] == r.offsets:
                open_.remove(r)
            if left == 0:
                break
    return tuple(PartitionRange(r.topic, r.partition, r.start, r.start + grant[r.name], r.committed) for r in ranges)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v
