"""The transaction window's arithmetic (txn/protocol/window.py): headroom, write estimate, budget, refusal."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.protocol.errors import WindowRefusedError
from airflow_provider_kafka2pc.txn.protocol.window import (
    PartitionSize,
    WindowBudget,
    WriteEstimate,
    WriteRate,
    commit_headroom_ms,
)


@pytest.mark.parametrize(
    ("timeout_ms", "transactions", "expected"),
    [
        (30_000, 8, 7_500 + 250),  # a quarter of a 30 s cap, one EndTxn wave
        (10_000, 1, 5_000 + 250),  # the floor
        (900_000, 200, 90_000 + 13 * 250),  # the ceiling on a 15-minute cap, 13 waves of 16
        (120_000, 64, 30_000 + 4 * 250),
    ],
)
def test_the_commit_headroom_is_derived_from_the_timeout_and_the_run_size(
    timeout_ms: int, transactions: int, expected: int
) -> None:
    assert commit_headroom_ms(timeout_ms, transactions) == expected


def test_a_configured_headroom_wins_and_must_not_be_negative() -> None:
    assert commit_headroom_ms(30_000, 8, override_ms=2_000) == 2_000
    with pytest.raises(ValueError, match="commit_headroom_ms=-1"):
        commit_headroom_ms(30_000, 8, override_ms=-1)


RATE = WriteRate(50_000, 10_000_000, "stated: write_records_per_s=50000, write_bytes_per_s=10000000")


def test_the_write_estimate_takes_the_longest_partition_or_the_sum_over_the_slots() -> None:
    sizes = [PartitionSize(p, 2_000, 30_000) for p in range(8)] + [PartitionSize(8, 0, 0)]
    # Each partition: 1 s fixed + the longer of 2,000 / 50,000 s and 30,000 / 10 MB/s = 1.04 s; 8 on 2 slots.
    estimate = WriteEstimate.of(sizes, slots=2, rate=RATE)
    assert (estimate.records, estimate.bytes, estimate.partitions) == (16_000, 240_000, 8)
    assert estimate.expected_ms == 4_160
    skewed = WriteEstimate.of([PartitionSize(0, 1_000_000, 0), PartitionSize(1, 10, 0)], slots=8, rate=RATE)
    assert skewed.expected_ms == 21_000  # one big partition: no number of slots helps
    assert WriteEstimate.of([], slots=2, rate=RATE).expected_ms == 0
    by_bytes = WriteEstimate.of([PartitionSize(0, 10, 50_000_000)], slots=1, rate=RATE)
    assert by_bytes.expected_ms == 6_000  # its bytes take longer than its records
    assert "about 4.2 s at 50000 records/s and 10000000 bytes/s per slot (stated: " in estimate.describe()


def test_a_rate_shown_by_a_write_budgets_the_same_export_the_time_it_took_and_survives_an_xcom() -> None:
    # 8 equal partitions on 2 slots in 8 s: 4 waves, 4 s of fixed cost, 4 s moving records.
    sizes = [PartitionSize(p, 375_000, 40_000_000) for p in range(8)]
    shown = WriteRate.shown(sizes, 8.0, slots=2, source="shown by run r1")
    assert shown is not None
    assert (shown.records_per_s, shown.bytes_per_s) == (375_000, 40_000_000)
    assert WriteRate.from_json(shown.to_json()) == shown
    assert WriteEstimate.of(sizes, 2, shown).expected_ms == 8_000  # the same export: the time it took
    # Skewed: one partition holds nearly everything. The rate is the one that gives it its 100 s.
    skewed = [PartitionSize(0, 970_000, 0), *(PartitionSize(p, 10_000, 0) for p in range(1, 4))]
    rate = WriteRate.shown(skewed, 100.0, slots=4, source="x")
    assert rate is not None and WriteEstimate.of(skewed, 4, rate).expected_ms == 100_000
    # Faster than the estimate's fixed costs (4 waves of 1 s): the plain throughput, which budgets
    # the same export more than the 1.8 s it took, never less.
    fast = WriteRate.shown(sizes, 1.8, slots=2, source="x")
    assert fast is not None and fast.records_per_s == pytest.approx(3_000_000 / (2 * 1.8))
    assert 1_800 < WriteEstimate.of(sizes, 2, fast).expected_ms < 8_000
    assert WriteRate.shown(sizes, 0.9, slots=2, source="x") is None  # start-up would pass for a slow rate
    # Just above the fixed costs, inverting them would show many times what the job moved: never
    # more than twice the plain throughput.
    for seconds in (1.05, 1.1, 2.1, 4.1, 6.0, 8.0, 30.0):
        shown_at = WriteRate.shown(sizes, seconds, slots=2, source="x")
        assert shown_at is not None and shown_at.records_per_s is not None
        assert shown_at.records_per_s <= 2 * 3_000_000 / (2 * seconds), seconds
    assert WriteRate.shown([PartitionSize(0, 0, 0)], 10.0, slots=2, source="x") is None  # nothing written
    assert WriteRate.from_json({"records_per_s": -1, "bytes_per_s": None, "source": "x"}) is None
    assert WriteRate.from_json("garbage") is None and WriteRate.from_json(None) is None
    with pytest.raises(ValueError, match="needs records_per_s or bytes_per_s"):
        WriteRate(None, None, "x")


def test_a_budget_that_fits_and_one_that_does_not() -> None:
    estimate = WriteEstimate.of([PartitionSize(p, 2_000, 30_000) for p in range(8)], slots=2, rate=RATE)
    fits = WindowBudget(30_000, 7_750, 10_000, estimate)
    assert fits.write_ms == 12_250 and fits.fits
    assert "left for writing 12250 ms; expected write 16000 records" in fits.describe()
    slow_rate = WriteRate(100, None, "stated: write_records_per_s=100")
    slow = WriteEstimate.of([PartitionSize(p, 2_000, 30_000) for p in range(8)], slots=2, rate=slow_rate)
    refused = WindowBudget(30_000, 7_750, 10_000, slow)
    assert not refused.fits
    message = str(refused.refusal())
    assert message.startswith("the export was refused before any transaction opened: writing 16000 records")
    assert "at 100 records/s per slot (stated: write_records_per_s=100)" in message
    assert "more than the 12250 ms left for writing within transaction.timeout.ms=30000" in message
    assert "Nothing was written" in message and "more task slots" in message


def test_a_timeout_too_short_for_the_headroom_leaves_no_time_to_write() -> None:
    budget = WindowBudget(6_000, 5_250, 10_000, None)
    assert budget.write_ms < 0 and not budget.fits
    error = budget.refusal()
    assert isinstance(error, WindowRefusedError)
    assert "leave no time for writing within transaction.timeout.ms=6000" in str(error)


def test_without_materializing_the_budget_only_bounds_the_time() -> None:
    budget = WindowBudget(900_000, 90_250, 10_000, None)
    assert budget.fits
    assert (
        "expected write unknown (the data is not materialized first): nothing is refused up front, the write "
        "is stopped if it runs past 799750 ms" in budget.describe()
    )
    unknown_rate = WindowBudget(30_000, 7_750, 10_000, None, "no write rate stated, and none shown")
    assert unknown_rate.fits and "expected write unknown (no write rate stated" in unknown_rate.describe()


@pytest.mark.parametrize(("opened_ago_ms", "says"), [(25_000, "ms before"), (40_000, "ms after")])
def test_a_prepare_that_ends_too_close_to_its_deadline_aborts_and_fails(opened_ago_ms: int, says: str) -> None:
    """A write job that finished, but left the commit too little time: never a green prepare."""
    import time

    from airflow_provider_kafka2pc.spark.job import ExportResult
    from airflow_provider_kafka2pc.spark.write_job import check_window_left as _check_window_left
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.protocol.errors import WindowExceededError

    now = int(time.time() * 1000)
    c = Committable("orders-0", 7, 0, 10, first_write_ms=now - opened_ago_ms)
    result = ExportResult((c,), records=10, bytes=100, partitions=1)
    budget = WindowBudget(30_000, 7_750, 10_000, None)
    aborted: list[bool] = []

    def abort_opened() -> bool:
        aborted.append(True)
        return True

    with pytest.raises(WindowExceededError) as info:
        _check_window_left(result, budget, abort_opened, write_started_ms=now - opened_ago_ms + 100)
    assert aborted == [True]
    message = str(info.value)
    assert says in message and "the broker's deadline of its first transaction" in message
    assert (
        "It prepared 1 transaction(s) with 10 records, and every transaction it opened was aborted at once" in message
    )
    # With time to spare the prepare stays green and aborts nothing.
    _check_window_left(result, WindowBudget(900_000, 90_250, 10_000, None), abort_opened, now)
    assert aborted == [True]


class _KeptRate:
    """A task instance whose earlier run kept ``value`` as its write-rate XCom."""

    def __init__(self, value: object) -> None:
        self.value = value

    def xcom_pull(self, **kwargs: object) -> object:
        assert kwargs["key"] == "kafka2pc_write_rate" and kwargs["include_prior_dates"] is True
        return self.value


def test_the_export_budgets_with_a_rate_only_its_own_exporter_showed() -> None:
    from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
    from airflow_provider_kafka2pc.operators.write_rate import window_with_shown_rate

    op = Kafka2PCExportOperator(task_id="prepare", transactional_id_prefix="orders", topic="t", table="db.orders")
    kept = {"records_per_s": 877.0, "bytes_per_s": 17761.0, "source": "shown by run r1"}

    def rate(value: object, prefix: str = "orders") -> object:
        return window_with_shown_rate(op.window, _KeptRate(value), op.task_id, prefix, op.log).shown_rate

    assert rate({**kept, "exporter": "orders"}) == WriteRate(877.0, 17761.0, "shown by run r1")
    assert rate({**kept, "exporter": "orders"}, prefix="orders_v2") is None  # another exporter's rate
    assert rate(kept) == WriteRate(877.0, 17761.0, "shown by run r1")  # kept before the exporter was
    assert rate(None) is None
