"""What Airflow already recorded for a topic's asset: the one place a task reads asset events.

A repaired run is announced once (DESIGN §6): the commit that answers a repaired run emits the
"repaired" events only if no event of the topic's asset carries that repair's decision already. A
clear of the commit alone runs it again with the export's XCom unchanged, so the task's own state
cannot tell; Airflow's record of the events can. The Task SDK reads an asset's events for a task
through ``InletEventsAccessor`` (``airflow.sdk.execution_time.context``). Its public face,
``context["inlet_events"]``, serves only assets declared as inlets when the DAG is parsed, and a
topic reached through the asset alias is known only at run time. The accessor sits here alone, and
``tests/unit/test_asset_history.py`` checks its surface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_kafka2pc.txn.protocol.repair_announcement import announced_decisions

if TYPE_CHECKING:
    from airflow.sdk import Asset


def announced_repairs(asset: Asset, repaired_at_ms: int) -> set[str]:
    """The repair decisions among the events Airflow holds for ``asset`` since the repair (an hour
    before it, for the clocks of the repairing host and Airflow's). By name and URI both: by URI
    alone, Airflow finds only assets a parsed DAG names, and a topic reached through the alias may
    be named by none. Raises what the Task SDK raises when it cannot ask."""
    import datetime

    from airflow.sdk.execution_time.context import InletEventsAccessor

    since = datetime.datetime.fromtimestamp(repaired_at_ms / 1000 - 3600, datetime.UTC)
    events = InletEventsAccessor(asset_name=asset.name, asset_uri=asset.uri).after(since.isoformat())
    return announced_decisions(getattr(e, "extra", None) for e in events)


__all__ = ["announced_repairs"]
