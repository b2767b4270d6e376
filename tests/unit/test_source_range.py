"""A Kafka source's range (KIP-447): Spark's offsets options, the cap per run, the JSON, the guard."""

from __future__ import annotations

import json

import pytest

from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError
from airflow_provider_kafka2pc.txn.protocol.source_range import (
    PartitionRange,
    SourceRange,
    cap_ranges,
    moved_elsewhere,
)

RANGE = SourceRange(
    "g",
    (
        PartitionRange("orders", 0, 10, 25, 10),
        PartitionRange("orders", 1, 0, 3, None),
        PartitionRange("refunds", 0, 7, 7, 7),
    ),
)


def test_spark_reads_exactly_the_range_and_the_group_commits_its_ends() -> None:
    options = RANGE.spark_options()
    assert json.loads(options["startingOffsets"]) == {"orders": {"0": 10, "1": 0}, "refunds": {"0": 7}}
    assert json.loads(options["endingOffsets"]) == {"orders": {"0": 25, "1": 3}, "refunds": {"0": 7}}
    assert RANGE.ends() == {("orders", 0): 25, ("orders", 1): 3, ("refunds", 0): 7}
    assert (RANGE.offsets, RANGE.moves, RANGE.topics) == (18, True, ("orders", "refunds"))
    assert RANGE.describe() == "group 'g': orders-0 [10, 25), orders-1 [0, 3) (18 offsets)"


def test_an_empty_range_moves_nothing() -> None:
    still = SourceRange("g", (PartitionRange("orders", 0, 5, 5, 5),))
    assert not still.moves and still.describe() == "group 'g': orders-0 [5, 5) (0 offsets)"


def test_the_range_survives_json_and_a_mangled_one_is_named() -> None:
    assert SourceRange.from_dict(json.loads(json.dumps(RANGE.to_dict()))) == RANGE
    for bad in (
        {"group_id": "g"},
        {"group_id": "g", "partitions": [["t", 0, 5, 4, None]]},
        {"group_id": "g", "partitions": [["t", True, 0, 1, None]]},
    ):
        with pytest.raises(MalformedCommittableError, match="malformed Kafka source range"):
            SourceRange.from_dict(bad)


@pytest.mark.parametrize(
    ("cap", "ends"),
    [(None, (25, 3, 7)), (18, (25, 3, 7)), (6, (13, 3, 7)), (4, (12, 2, 7)), (1, (11, 0, 7))],
)
def test_the_cap_shares_the_offsets_and_leaves_a_small_backlog_s_share_to_the_others(
    cap: int | None, ends: tuple[int, ...]
) -> None:
    capped = cap_ranges(RANGE.partitions, cap)
    assert tuple(p.end for p in capped) == ends
    assert sum(p.offsets for p in capped) == min(cap or 18, 18)
    assert [p.start for p in capped] == [p.start for p in RANGE.partitions]


def test_the_guard_names_partitions_another_consumer_moved() -> None:
    now = {("orders", 0): 10, ("orders", 1): 2, ("refunds", 0): 7}
    assert moved_elsewhere(RANGE, now) == [(RANGE.partitions[1], 2)]
    assert moved_elsewhere(RANGE, {("orders", 0): 10, ("refunds", 0): 7}) == []


def test_a_run_follows_on_where_the_last_committed_run_left_the_group() -> None:
    from airflow_provider_kafka2pc.txn.protocol.source_range import departures

    last = SourceRange("g", (PartitionRange("orders", 0, 0, 25, None), PartitionRange("orders", 1, 0, 3, None)))
    follows = SourceRange("g", (PartitionRange("orders", 0, 25, 40, 25), PartitionRange("orders", 1, 3, 3, 3)))
    expired = SourceRange("g", (PartitionRange("orders", 0, 0, 40, None), PartitionRange("orders", 1, 0, 3, None)))
    moved = SourceRange("g", (PartitionRange("orders", 0, 30, 40, 30), PartitionRange("orders", 1, 3, 3, 3)))
    assert departures(last, follows) == []
    assert departures(last, expired) == [(last.partitions[0], None), (last.partitions[1], None)]
    assert departures(last, moved) == [(last.partitions[0], 30)]


def test_a_partition_the_group_never_committed_is_pinned_even_with_nothing_to_read() -> None:
    # starting_offsets="latest" on a new group: nothing to read, but the run commits where it began.
    first = SourceRange("g", (PartitionRange("orders", 0, 40, 40, None),))
    assert first.moves and first.offsets == 0


def test_kafka_source_options_that_would_read_another_range_are_refused_at_parse_time() -> None:
    from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource

    KafkaSource("orders", group_id="g", options={"kafka.fetch.max.bytes": "1048576"})
    for key in ("startingOffsets", "FAILONDATALOSS", "kafka.isolation.level", "subscribePattern"):
        with pytest.raises(ValueError, match="may not set"):
            KafkaSource("orders", group_id="g", options={key: "x"})
    with pytest.raises(ValueError, match="topics or a pattern"):
        KafkaSource(group_id="g")


def test_one_exporter_per_source_group_the_first_claim_in_the_log_wins() -> None:
    from airflow_provider_kafka2pc.txn.protocol.errors import SourceError
    from tests.unit.fakes import MemoryDecisionLog

    log = MemoryDecisionLog()
    log.claim_group("g", "orders")
    log.claim_group("g", "orders")  # again: its own
    with pytest.raises(SourceError, match="consumer group 'g' is the Kafka source group of exporter 'orders'"):
        log.claim_group("g", "refunds")
    log.claim_group("h", "refunds")
    assert log.read().group_owners == {"g": "orders", "h": "refunds"}


def test_a_group_at_the_run_s_start_is_told_from_one_moved_elsewhere_or_expired() -> None:
    from airflow_provider_kafka2pc.txn.protocol.source_range import at_start, not_at_end

    run = SourceRange("g", (PartitionRange("orders", 0, 3, 22, 3), PartitionRange("orders", 1, 0, 8, None)))
    # A regular commit of the old value: p0 back at 3, p1 still without an offset.
    replaced = not_at_end(run, {("orders", 0): 3, ("orders", 1): None})
    assert replaced == [(run.partitions[0], 3), (run.partitions[1], None)] and at_start(replaced)
    assert not at_start(not_at_end(run, {("orders", 0): None, ("orders", 1): None}))  # expired: another case
    assert not at_start(not_at_end(run, {("orders", 0): 5, ("orders", 1): None}))  # another consumer moved it
    assert not_at_end(run, {("orders", 0): 22, ("orders", 1): 8}) == []  # it moved with the run
