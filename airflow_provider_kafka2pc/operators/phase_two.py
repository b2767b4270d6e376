"""What the commit and the abort operators share: the run's export payloads, checked, and the Kafka
clients' connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_kafka2pc.exceptions import ConnectionMismatchError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.links import Kafka2PCExportersLink
from airflow_provider_kafka2pc.operators.payload import ExportPayload, pull_exports
from airflow_provider_kafka2pc.txn.protocol import naming

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.two_phase.ruling import CommitReport


def task_ids_of(export_task_ids: str | Sequence[str]) -> list[str]:
    return [export_task_ids] if isinstance(export_task_ids, str) else list(export_task_ids)


class PhaseTwoOperator(BaseOperator):
    """What commit and abort share: the export payloads of this run and the Kafka clients."""

    operator_extra_links = (Kafka2PCExportersLink(),)
    template_fields: Sequence[str] = ("export_task_ids",)
    ui_color = "#fdf3e1"

    def __init__(
        self,
        *,
        export_task_ids: str | Sequence[str],
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        max_workers: int = 16,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.export_task_ids = export_task_ids
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self.max_workers = max_workers

    def payloads(self, context: Context) -> dict[str, ExportPayload | None]:
        payloads = pull_exports(context, task_ids_of(self.export_task_ids))
        for task_id, p in payloads.items():
            if p is None:
                continue
            if p.conn_id != self.kafka2pc_conn_id:
                raise ConnectionMismatchError(
                    f"export task {task_id!r} prepared on connection {p.conn_id!r}, but {self.task_id!r} uses "
                    f"{self.kafka2pc_conn_id!r}: one decision needs one Kafka cluster and one decision log"
                )
            # Early, before connecting; the core checks the same again before it decides anything.
            naming.check_members((c.transactional_id for c in p.committables), [members_of(p, context)])
        return payloads

    @staticmethod
    def counts(report: CommitReport) -> dict[str, Any]:
        """The task's XCom: how many ended committed, aborted, lost. The log has them already: the
        core's summary line per decision (``txn.two_phase.ruling.log_resolutions``)."""
        from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict

        return {v.name.lower(): report.count(v) for v in (Verdict.COMMITTED, Verdict.ABORTED, Verdict.LOST)}


def members_of(payload: ExportPayload, context: Context) -> naming.Members:
    """The ids the payload's exporter writes for this run, by its naming strategy."""
    strategy = naming.NamingStrategy(payload.naming_strategy)
    incrementing = strategy is naming.NamingStrategy.INCREMENTING
    return naming.Members(
        payload.prefix, strategy, naming.sanitize_run_key(context["run_id"]) if incrementing else None
    )
