"""What an export task hands to the commit and abort tasks through XCom (JSON, no secrets)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.errors import MalformedCommittableError

if TYPE_CHECKING:
    from airflow.sdk import Context

PAYLOAD_VERSION = 1
# Pushed by an export that skipped itself (its run is already decided): not a failure to abort.
SKIPPED_KEY = "kafka2pc_skipped"


def decision_run(context: Context) -> str:
    """The run as the decision log names it: one DAG run, whichever task writes."""
    return f"{context['dag'].dag_id}/{context['run_id']}"


@dataclass(frozen=True)
class ExportPayload:
    conn_id: str
    prefix: str
    naming_strategy: str
    run_key: str | None
    delivery_guarantee: str
    committables: tuple[Committable, ...] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)

    def to_xcom(self) -> dict[str, Any]:
        return {
            "version": PAYLOAD_VERSION,
            "conn_id": self.conn_id,
            "prefix": self.prefix,
            "naming_strategy": self.naming_strategy,
            "run_key": self.run_key,
            "delivery_guarantee": self.delivery_guarantee,
            "committables": [c.to_dict() for c in self.committables],
            "summary": dict(self.summary),
        }

    @classmethod
    def from_xcom(cls, value: Any, task_id: str) -> ExportPayload:
        if not isinstance(value, Mapping) or value.get("version") != PAYLOAD_VERSION:
            raise MalformedCommittableError(
                f"XCom of export task {task_id!r} is not a kafka2pc export result (version {PAYLOAD_VERSION}): "
                f"{str(value)[:200]}"
            )
        try:
            return cls(
                conn_id=str(value["conn_id"]),
                prefix=str(value["prefix"]),
                naming_strategy=str(value["naming_strategy"]),
                run_key=value.get("run_key"),
                delivery_guarantee=str(value["delivery_guarantee"]),
                committables=tuple(Committable.from_dict(c) for c in value["committables"]),
                summary=dict(value.get("summary") or {}),
            )
        except (KeyError, TypeError) as e:
            raise MalformedCommittableError(f"XCom of export task {task_id!r} lacks {e}") from e


def pull_exports(context: Context, task_ids: Sequence[str]) -> dict[str, ExportPayload | None]:
    """The payload of each export task of this run; None where the task pushed nothing (failed, skipped)."""
    ti = context["ti"]
    out: dict[str, ExportPayload | None] = {}
    for task_id in task_ids:
        value = ti.xcom_pull(task_ids=task_id, key="return_value")
        out[task_id] = None if value is None else ExportPayload.from_xcom(value, task_id)
    return out
