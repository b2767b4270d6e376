"""Unit-test fixtures: no broker, no network, no real back-off."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.kafka import retries
from airflow_provider_kafka2pc.txn.two_phase import resolver
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Back-off and waits of the retry loops advance a fake clock instead of sleeping."""
    fake = FakeClock()
    monkeypatch.setattr(retries, "time", fake)
    monkeypatch.setattr(resolver, "time", fake)
    return fake


@pytest.fixture
def events() -> list[str]:
    """One ordered list that the broker and the decision log both append to."""
    return []


@pytest.fixture
def broker(events: list[str]) -> FakeBroker:
    return FakeBroker(events)


@pytest.fixture
def decision_log(events: list[str]) -> MemoryDecisionLog:
    return MemoryDecisionLog(events)
