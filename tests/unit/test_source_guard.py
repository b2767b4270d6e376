"""The commit's look at a Kafka source group after its EndTxns (``txn/two_phase/source_guard.py``):
behind the run's ends is said, with the commands that move it; past them is not behind (DESIGN §15)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.protocol.errors import OffsetsNotMovedError
from airflow_provider_kafka2pc.txn.protocol.source_range import PartitionRange, SourceRange
from airflow_provider_kafka2pc.txn.two_phase import source_guard
from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard
from tests.unit.fakes import committable

READ = SourceRange("g", (PartitionRange("orders", 0, 10, 25, 10), PartitionRange("orders", 1, 3, 8, 3)))
OFFSETS = committable("orders-offsets")


def _group_at(monkeypatch: pytest.MonkeyPatch, offsets: dict[tuple[str, int], int | None]) -> None:
    def settled(config: Any, group: str, partitions: Any, timeout_s: float = 30.0) -> dict[tuple[str, int], int | None]:
        assert group == "g"
        return offsets

    monkeypatch.setattr(source_guard, "settled_group_offsets", settled)


def test_a_group_past_the_runs_ends_is_not_behind_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _group_at(monkeypatch, {("orders", 0): 40, ("orders", 1): 8})  # a later run moved partition 0 on
    SourceGuard({"bootstrap.servers": "b:9092"}, [(READ, OFFSETS)]).after_commit("r1", ["orders-offsets"])


@pytest.mark.parametrize("at", [10, 24, None])
def test_a_group_behind_the_runs_ends_is_said_with_the_commands(
    monkeypatch: pytest.MonkeyPatch, at: int | None
) -> None:
    _group_at(monkeypatch, {("orders", 0): at, ("orders", 1): 8})
    guard = SourceGuard({"bootstrap.servers": "b:9092"}, [(READ, OFFSETS)])
    with pytest.raises(OffsetsNotMovedError, match=r"--topic orders:0 --to-offset 25"):
        guard.after_commit("r1", ["orders-offsets"])
