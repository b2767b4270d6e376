"""The files a run read, recorded and compared (``txn/protocol/source_files.py``): the sentences a
repair's refusal carries, the record's round trip and cap, and replay passing over the records."""

from __future__ import annotations

from airflow_provider_kafka2pc.txn.protocol.decisions import replay
from airflow_provider_kafka2pc.txn.protocol.records import Entry
from airflow_provider_kafka2pc.txn.protocol.source_files import (
    MAX_SPLITS,
    Dealing,
    FileSplit,
    decode_dealt,
    decode_splits,
    encode_dealt,
    encode_splits,
    explain_changes,
    parse_source_files_key,
    source_files_key,
)

DAY_MS = 1_796_000_000_000


def _file(
    name: str, size: int = 1000, modified_ms: int = DAY_MS, start: int = 0, length: int | None = None
) -> FileSplit:
    return FileSplit(f"file:///data/orders/{name}", start, size if length is None else length, size, modified_ms)


RUN = {0: (_file("a"),), 1: (_file("b"),), 2: (_file("c"), _file("d"))}


def test_unchanged_files_explain_nothing_and_nothing_recorded_explains_nothing() -> None:
    assert explain_changes(RUN, dict(RUN), [0, 1, 2]) == []
    assert explain_changes(None, RUN, [1]) == [] and explain_changes(RUN, None, [1]) == []


def test_a_changed_file_is_named_with_its_size_and_time_then_and_now() -> None:
    now = {**RUN, 1: (_file("b", size=1040, modified_ms=DAY_MS + 60_000),)}
    (said,) = explain_changes(RUN, now, [1, 2])
    assert said == (
        "Spark partition 1: file:///data/orders/b changed (1000 -> 1040 bytes, modified 2026-11-30T00:53:20Z -> "
        "2026-11-30T00:54:20Z)"
    )


def test_removed_and_added_files_are_named_per_lost_partition() -> None:
    now = {0: (_file("a"),), 1: (_file("b2"),), 2: (_file("c"), _file("d"))}
    assert explain_changes(RUN, now, [0, 1]) == [
        "Spark partition 1: file:///data/orders/b was removed; file:///data/orders/b2 was added"
    ]


def test_the_same_files_packed_into_other_partitions_is_told_apart_from_a_data_change() -> None:
    now = {0: (_file("a"), _file("b")), 1: (_file("c"), _file("d"))}
    said = explain_changes(RUN, now, [1, 2])
    assert said == [
        "Spark partition 1: the same files are packed differently: it read b[0+1000] then, c[0+1000], d[0+1000] now "
        "(another spark.sql.files.maxPartitionBytes or openCostInBytes, parallelism or cluster size)",
        "Spark partition 2: the same files are packed differently: it read c[0+1000], d[0+1000] then, nothing now "
        "(another spark.sql.files.maxPartitionBytes or openCostInBytes, parallelism or cluster size)",
    ]


def test_a_large_file_read_in_splits_is_named_once() -> None:
    run = {0: (_file("big", size=300, length=100), _file("big", size=300, start=100, length=100))}
    now = {0: (_file("big", size=310, length=100), _file("big", size=310, start=100, length=100))}
    (said,) = explain_changes(run, now, [0])
    assert said.count("big changed (300 -> 310 bytes") == 1


def test_the_record_round_trips_under_a_key_whose_run_holds_colons_and_a_large_one_is_not_made() -> None:
    key = source_files_key("orders", "etl/manual__2026-12-06T08:00:00+00:00")
    assert parse_source_files_key(key) == ("orders", "etl/manual__2026-12-06T08:00:00+00:00")
    value = encode_splits(RUN)
    assert value is not None and decode_splits(value) == RUN
    assert decode_splits(b'{"v": 9, "slots": {}}') is None and decode_splits(b"not json") is None
    assert encode_splits({i: (_file(str(i)),) for i in range(MAX_SPLITS + 1)}) is None


def test_replay_passes_over_the_records_and_their_tombstones() -> None:
    key = source_files_key("orders", "etl/r1")
    state = replay([Entry(0, DAY_MS, key, encode_splits(RUN)), Entry(1, DAY_MS, key, None)])
    assert state.end_offset == 1 and state.runs == {} and state.handoffs == {}


def test_a_dealt_frame_records_its_slots_under_the_same_key_and_the_shapes_never_mix() -> None:
    dealt = encode_dealt(Dealing(6, 4))
    assert decode_dealt(dealt) == Dealing(6, 4) and decode_splits(dealt) is None
    assert decode_dealt(encode_dealt(Dealing(2))) == Dealing(2, None)
    splits = encode_splits(RUN)
    assert splits is not None and decode_dealt(splits) is None
    for odd in (
        b'{"v":1,"dealt":0}',
        b'{"v":1,"dealt":true}',
        b'{"v":1,"dealt":"6"}',
        b'{"v":2,"dealt":6}',
        b'{"v":1,"dealt":6,"inputs":0}',
        b'{"v":1,"dealt":6,"inputs":"4"}',
        b"[]",
        b"{",
    ):
        assert decode_dealt(odd) is None, odd
