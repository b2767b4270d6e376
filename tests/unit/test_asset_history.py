"""The asset-event reader (``operators/asset_history.py``): what it finds in events, and the surface of
the Task SDK accessor it stands on (one private import, checked here against the pinned Airflow).
The real Airflow's answer, a clear of the commit alone announcing a repair no second time, is in
``tests/e2e/test_airflow_rest.py``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_kafka2pc.operators.asset_history import announced_repairs
from airflow_provider_kafka2pc.txn.protocol.repair_announcement import announced_decisions


def test_only_repaired_extras_with_a_decision_count() -> None:
    extras = [
        {"run": "r1", "records": 3},
        {"repaired": {"decision": "d-1", "restored": 3}},
        {"repaired": {"decision": 7}},
        {"repaired": "yes"},
        None,
    ]
    assert announced_decisions(extras) == {"d-1"}


def test_the_accessor_asks_the_supervisor_by_name_and_uri_and_yields_the_extras(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.api.datamodels._generated import AssetEventResponse, AssetResponse
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import AssetEventsResult, GetAssetEventByAsset

    asset = Asset("kafka://broker:9092/orders")
    sent: list[Any] = []

    def event(i: int, extra: dict[str, Any]) -> AssetEventResponse:
        return AssetEventResponse(
            id=i,
            timestamp=datetime(2026, 12, 6, tzinfo=UTC),
            extra=extra,
            asset=AssetResponse(name=asset.name, uri=asset.uri, group="asset"),
            created_dagruns=[],
        )

    class Comms:
        def send(self, msg: Any) -> AssetEventsResult:
            sent.append(msg)
            found: Sequence[AssetEventResponse] = [event(1, {"run": "r"}), event(2, {"repaired": {"decision": "d-9"}})]
            return AssetEventsResult(asset_events=list(found))

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)
    repaired_at = datetime(2026, 12, 6, 12, tzinfo=UTC)
    assert announced_repairs(asset, int(repaired_at.timestamp() * 1000)) == {"d-9"}
    [msg] = sent
    assert isinstance(msg, GetAssetEventByAsset)
    assert (msg.name, msg.uri) == (asset.name, asset.uri)
    assert msg.after == repaired_at - timedelta(hours=1)  # only what can follow the repair
