"""The soak checker's judgement, on keys given to it (the soak itself proves it on Kafka)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from tests.soak import checker


def judge(monkeypatch: pytest.MonkeyPatch, keys: dict[str, int], status: str, faults: Sequence[str] = ()) -> list[str]:
    monkeypatch.setattr(checker, "committed_keys", lambda bootstrap, topic: Counter(keys))
    run = {"run": "soak/run-0", "tag": "r0", "expected": 4, "records": 2, "status": status, "faults": list(faults)}
    violations, _ = checker.judge("b", "t", "soak", [run], lambda args: "", [], open_checks=False)
    return [v.what for v in violations]


def test_a_whole_run_reported_success_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert judge(monkeypatch, {"r0/0/0": 1, "r0/0/1": 1, "r0/1/2": 1, "r0/1/3": 1}, "success") == []


def test_a_lost_transaction_after_a_timeout_passes_only_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = ["timeout:after-decision"]
    assert judge(monkeypatch, {"r0/0/0": 1, "r0/0/1": 1}, "lost", lost) == []
    assert judge(monkeypatch, {"r0/0/0": 1, "r0/0/1": 1, "r0/1/2": 1}, "lost", lost) == [
        "transaction 1 of r0: 1 of 2 records visible"
    ]


@pytest.mark.parametrize(
    ("keys", "status", "what"),
    [
        ({"r0/0/0": 1, "r0/0/1": 1}, "success", "2 of 4 records visible, reported success"),
        ({}, "success", "nothing is visible, but the run success"),
        ({"r0/0/0": 1, "r0/0/1": 1, "r0/1/2": 1, "r0/1/3": 1}, "failed", "all 4 records visible but reported failed"),
    ],
)
def test_what_a_tool_reported_must_match_what_is_visible(
    monkeypatch: pytest.MonkeyPatch, keys: dict[str, int], status: str, what: str
) -> None:
    assert what in judge(monkeypatch, keys, status)


def test_a_duplicate_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    found = judge(monkeypatch, {"r0/0/0": 2, "r0/0/1": 1, "r0/1/2": 1, "r0/1/3": 1}, "success")
    assert "key r0/0/0 visible 2 times" in found
