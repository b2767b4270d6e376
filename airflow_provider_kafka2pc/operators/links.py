"""The task instance's link to its exporters' page in the Airflow UI (Airflow 3.1+)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class Kafka2PCExportersLink(BaseOperatorLink):
    """The "Kafka exporters" link: the exporters page of the task's prefixes on the task's connection.

    The export names its own prefix; the commit and the abort name the prefixes of the export tasks
    they finish (and the abort its ``transactional_id_prefixes``). Computed by the worker when the
    task ends, failed or not, and kept in XCom as every Airflow 3 extra link is."""

    name = "Kafka exporters"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk import conf

        from airflow_provider_kafka2pc.plugins.urls import has_page, page_url

        if not has_page():
            return ""
        base_url = conf.get("api", "base_url", fallback="/") or "/"
        conn_id = str(getattr(operator, "kafka2pc_conn_id", "kafka2pc_default"))
        return page_url(base_url, conn_id, prefixes_of(operator))


def prefixes_of(operator: Any) -> list[str]:
    found: list[str] = []
    own = getattr(operator, "transactional_id_prefix", None)
    if isinstance(own, str):
        found.append(own)
    dag = getattr(operator, "dag", None)
    for task_id in _names(getattr(operator, "export_task_ids", ())):
        export = dag.task_dict.get(task_id) if dag is not None else None
        prefix = getattr(export, "transactional_id_prefix", None)
        if isinstance(prefix, str) and "{{" not in prefix:  # an unrendered template names no exporter
            found.append(prefix)
    found += _names(getattr(operator, "transactional_id_prefixes", ()))
    return list(dict.fromkeys(found))


def _names(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
