"""The Kafka source snapshot's retry of transient broker answers, without a broker."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.source_snapshot import _retrying


class _Error:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


def _failing(names: list[str], answer: Any) -> Any:
    calls: list[str] = []

    def call() -> Any:
        if len(calls) < len(names):
            calls.append(names[len(calls)])
            raise RuntimeError(_Error(calls[-1]))
        return answer

    return call, calls


def test_a_leader_moving_under_list_offsets_is_asked_again() -> None:
    """A restarted broker's leadership settling answers ListOffsets with the leader epoch family."""
    names = ["FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "NOT_LEADER_OR_FOLLOWER", "OFFSET_NOT_AVAILABLE"]
    call, calls = _failing(names, {("t", 0): 7})
    assert _retrying(call, timeout_s=10) == {("t", 0): 7}
    assert calls == names


def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    call, calls = _failing(["TOPIC_AUTHORIZATION_FAILED", "FENCED_LEADER_EPOCH"], "never")
    with pytest.raises(RuntimeError):
        _retrying(call, timeout_s=10)
    assert calls == ["TOPIC_AUTHORIZATION_FAILED"]
