"""What became of a transaction's records, read from its data partitions (DESIGN §15).

DescribeTransactions forgets a transaction once its id moves on: a later producer epoch (a newer
run of a POOLING id, or the broker's abort on timeout) looks the same whether the transaction was
committed or aborted before. The data partitions do not forget: after a transaction's records
comes its producer's control marker, COMMIT or ABORT. So a loss is proven here before it is
recorded: read each partition from just before the transaction began (ListOffsets by time), at
``read_uncommitted``, batch headers only, and find the first marker of the producer that follows a
batch of the transaction's producer id and epoch. (Under Kafka's timeout the broker aborts with the
epoch bumped by one, so the marker is the producer's next control batch, whatever its epoch.)

Uses kafka-python's generated protocol classes and record parser, both public, through
``WireClient.request``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from airflow_provider_kafka2pc.txn.kafka.errors import RetriableCoordinatorError, error_name, is_connection_error
from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.protocol.errors import CoordinatorError
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef

log = logging.getLogger(__name__)

# A record's CreateTime is the producer's clock; the transaction's start is the broker's. Read from
# this long before the start, so that a producer clock behind the broker's does not hide a batch.
CLOCK_SLACK_MS = 5 * 60 * 1000
_FETCH_MAX_VERSION = 12  # topics by name (v13 names them by id)
_FETCH_BYTES = 4 * 1024 * 1024
_READ_UNCOMMITTED = 0
_RETRIABLE = frozenset({5, 6, 7, 74, 75})  # LEADER_NOT_AVAILABLE, NOT_LEADER..., epochs: ask the leader again
_UNKNOWN_TOPIC_OR_PARTITION = 3
_OFFSET_OUT_OF_RANGE = 1
_EARLIEST = -2  # ListOffsets' timestamp for the log's start
_STALE_NODE = ("UnknownBrokerIdError", "NodeNotReadyError")


class Fate(StrEnum):
    """A transaction's records, as its data partitions show them."""

    COMMITTED = "committed"  # a COMMIT marker follows them: visible to read_committed readers
    ABORTED = "aborted"  # an ABORT marker follows them in every partition where they are
    OPEN = "open"  # its records are there, no marker yet: still open (or its markers are on the way)
    ABSENT = "absent"  # none of its records is in the partitions any more (retention, a deleted topic)


class Requests(Protocol):
    """What is read with: ``WireClient.request`` (this module is below the wire client, which offers it)."""

    def request(self, request: Any, node_id: int | None = None) -> Any: ...


@dataclass(frozen=True)
class PartitionFate:
    partition: str  # "topic-N", as the broker lists it
    fate: Fate
    marker_offset: int | None = None


def transaction_fate(
    wire: Requests, ref: TxnRef, partitions: Sequence[str], since_ms: int, timeout_s: float = 60.0
) -> tuple[Fate, tuple[PartitionFate, ...]]:
    """The fate of ``ref``'s records in ``partitions`` (``topic-N``), read from ``since_ms`` (broker
    clock: the transaction's start or earlier; 0: from the log's start) on. A COMMIT marker anywhere
    means committed (markers of one transaction are all of one kind); ABORTED only when every
    partition that still holds records shows its ABORT marker. Kafka's internal topics (the offsets
    participant's ``__consumer_offsets``) are not read: no exporter is granted them."""
    readable = [p for p in partitions if not _split(p)[0].startswith("__")]
    deadline = time.monotonic() + timeout_s
    leaders = _leaders(wire, readable, timeout_s) if readable else {}
    fates = tuple(_partition_fate(wire, ref, p, leaders, since_ms, deadline) for p in readable)
    kinds = {f.fate for f in fates}
    for fate in (Fate.COMMITTED, Fate.OPEN, Fate.ABORTED):
        if fate in kinds:
            return fate, fates
    return Fate.ABSENT, fates


def _split(partition: str) -> tuple[str, int]:
    topic, _, n = partition.rpartition("-")
    return topic, int(n)


def _leaders(wire: Requests, partitions: Sequence[str], timeout_s: float) -> dict[str, int]:
    from kafka.protocol.metadata import MetadataRequest

    topics = sorted({_split(p)[0] for p in partitions})

    def go() -> dict[str, int]:
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics], allow_auto_topic_creation=False
        )
        response = wire.request(request)
        found: dict[str, int] = {}
        for t in response.topics:
            _check(int(t.error_code), str(t.name))
            for p in t.partitions:
                if p.error_code in _RETRIABLE or (p.leader_id < 0 and p.error_code == 0):
                    raise RetriableCoordinatorError(p.error_code or 5, f"Metadata({t.name})", "no leader")
                if p.leader_id >= 0:
                    found[f"{t.name}-{p.partition_index}"] = int(p.leader_id)
        return found

    return retry("Metadata for the transaction's partitions", go, timeout_s)


def _partition_fate(
    wire: Requests, ref: TxnRef, partition: str, leaders: dict[str, int], since_ms: int, deadline: float
) -> PartitionFate:
    def go() -> PartitionFate:
        node = leaders.get(partition)
        if node is None:
            return PartitionFate(partition, Fate.ABSENT)  # the topic or partition is gone
        offset = _offset_at(wire, node, partition, max(0, since_ms - CLOCK_SLACK_MS) if since_ms > 0 else 0)
        if offset < 0:
            return PartitionFate(partition, Fate.ABSENT)
        return _scan(wire, ref, node, partition, offset, deadline)

    def refreshed() -> PartitionFate:
        try:
            return go()
        except Exception as e:  # a moved or dead leader: ask the metadata again, then the new leader
            if isinstance(e, RetriableCoordinatorError) or is_connection_error(e) or type(e).__name__ in _STALE_NODE:
                leaders.update(_leaders(wire, [partition], max(1.0, deadline - time.monotonic())))
            raise

    left = max(1.0, deadline - time.monotonic())
    return retry(f"reading {partition} for the markers of {ref.transactional_id}", refreshed, left)


def _offset_at(wire: Requests, node: int, partition: str, timestamp_ms: int) -> int:
    """The first offset with a timestamp at or after ``timestamp_ms`` (0: the log's start); -1 when none is."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest

    topic, n = _split(partition)
    Topic = ListOffsetsRequest.ListOffsetsTopic
    stamp = timestamp_ms if timestamp_ms > 0 else _EARLIEST
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=_READ_UNCOMMITTED,
        topics=[Topic(name=topic, partitions=[Topic.ListOffsetsPartition(partition_index=n, timestamp=stamp)])],
        min_version=1,
    )
    [answer] = [p for t in wire.request(request, node).topics for p in t.partitions]
    _check(answer.error_code, partition)
    return -1 if answer.error_code else int(answer.offset)


def _check(code: int, partition: str) -> None:
    if code in _RETRIABLE:
        raise RetriableCoordinatorError(code, f"reading {partition}", error_name(code))
    if code and code not in (_UNKNOWN_TOPIC_OR_PARTITION, _OFFSET_OUT_OF_RANGE):
        raise CoordinatorError(
            f"reading {partition} to see whether a transaction's records are visible: {error_name(code)}. A "
            "transaction whose id moved on before its outcome was recorded is proven committed or lost from its "
            f"partitions' markers: grant this principal Read on topic {_split(partition)[0]!r} (docs/acls.md); "
            "nothing was recorded"
        )


def _scan(wire: Requests, ref: TxnRef, node: int, partition: str, offset: int, deadline: float) -> PartitionFate:
    """From ``offset`` up to the high watermark met first: the producer's control batch that ends
    (pid, epoch). Under transaction version 1 a commit or an abort by EndTxn keeps the epoch, so a
    control batch of (pid, epoch) is this transaction's marker wherever the read began; the broker's
    abort on timeout carries epoch + 1, so after a batch of records of (pid, epoch) the producer's
    next control batch is it."""
    from kafka.protocol.consumer.fetch import FetchRequest
    from kafka.record import MemoryRecords

    topic, n = _split(partition)
    seen_records = False
    end: int | None = None  # markers of an ended transaction lie below the high watermark seen first
    while end is None or offset < end:
        if time.monotonic() > deadline:
            raise CoordinatorError(f"reading {partition} for the markers of {ref.transactional_id}: out of time")
        fetch = FetchRequest.FetchTopic.FetchPartition(
            partition=n, fetch_offset=offset, partition_max_bytes=_FETCH_BYTES, current_leader_epoch=-1
        )
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=_FETCH_BYTES,
            isolation_level=_READ_UNCOMMITTED,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[fetch])],
            max_version=_FETCH_MAX_VERSION,
        )
        [answer] = [p for t in wire.request(request, node).responses for p in t.partitions]
        if answer.error_code == _OFFSET_OUT_OF_RANGE and offset < int(answer.log_start_offset):
            offset = int(answer.log_start_offset)  # retention moved the log's start meanwhile
            continue
        _check(answer.error_code, partition)
        if answer.error_code:
            break
        end = int(answer.high_watermark) if end is None else end
        records = MemoryRecords(bytes(answer.records or b""))
        moved = False
        while (batch := records.next_batch()) is not None:
            offset, moved = batch.next_offset, True
            if getattr(batch, "producer_id", None) != ref.producer_id:  # another producer, or a legacy batch
                continue
            if batch.is_control_batch and (seen_records or batch.producer_epoch == ref.producer_epoch):
                fate = Fate.COMMITTED if _first_control_record(batch).commit else Fate.ABORTED
                return PartitionFate(partition, fate, batch.base_offset)
            if batch.producer_epoch > ref.producer_epoch and not seen_records:
                break  # the producer moved on before any record of this epoch here: none are after
            seen_records = seen_records or (batch.producer_epoch == ref.producer_epoch and not batch.is_control_batch)
        else:
            if moved:
                continue
            if offset < end:  # only a batch cut short by the byte limit: cannot happen from Fetch v3 on
                raise CoordinatorError(f"reading {partition} at offset {offset}: the broker returned no whole batch")
        break
    return PartitionFate(partition, Fate.OPEN if seen_records else Fate.ABSENT)


def _first_control_record(batch: Any) -> Any:
    """The batch's one control record (its key says COMMIT or ABORT)."""
    return next(iter(batch))


__all__ = ["CLOCK_SLACK_MS", "Fate", "PartitionFate", "transaction_fate"]
