"""The exporters page's repair of a LOST run: the run's export task cleared through Airflow.

A repair exports the lost Spark partitions again with the run's own frame and Spark settings, which
only the export task knows (DESIGN §6): so the page does not repair, it clears that task (and what
follows it, the commit) in the run, as the UI's Clear does, and the scheduler runs it. The clear
goes through Airflow's public REST API (``clearTaskInstances``) with the request's own credentials:
Airflow checks the user's right to clear and writes its audit log as for any clear, and the page
depends on no internals of Airflow's. The request goes to the server that received the page's form,
at the address it received it on, so no URL is configured.

The task is known from the decision log: the run is named ``{dag_id}/{run_id}`` and the exporter's
claim names its task ``{dag_id}.{task_id}``. A run exported by a Spark application (its ids carry
a driver attempt's tag) is repaired with ``kafka2pc repair``: clearing the submit task would only
submit it again.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request, status

from airflow_provider_kafka2pc.plugins.urls import URL_PREFIX
from airflow_provider_kafka2pc.txn.protocol import naming

CLEAR_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RepairTask:
    """The task whose clear repairs a LOST run."""

    dag_id: str
    run_id: str
    task_id: str

    def to_json(self) -> dict[str, str]:
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id}


def repair_task(run: str, owner: str | None, lost_ids: Iterable[str]) -> RepairTask | None:
    """The export task of ``run`` by the exporter's claim (``owner``); None when the run was not an
    export task's: another DAG's, or a Spark application's."""
    dag_id, sep, run_id = run.partition("/")
    if not (sep and dag_id and run_id and owner and owner.startswith(f"{dag_id}.")):
        return None
    if any((p := naming.parse_transactional_id(t)) is not None and p.attempt is not None for t in lost_ids):
        return None
    return RepairTask(dag_id, run_id, owner[len(dag_id) + 1 :])


def clear_export_task(request: Request, task: RepairTask) -> list[str]:
    """Clear ``task`` and its downstream tasks in its run as the request's user; the ids cleared."""
    import httpx

    body = {
        "dry_run": False,
        "dag_run_id": task.run_id,
        "task_ids": [task.task_id],
        "include_downstream": True,
        "only_failed": False,
        "reset_dag_runs": True,
    }
    path = f"/api/v2/dags/{quote(task.dag_id, safe='')}/clearTaskInstances"
    try:
        # verify=False: the request goes to this very server's socket by its address, which no
        # certificate names; the credentials are the ones the browser just sent it.
        with httpx.Client(base_url=_own_api_root(request), timeout=CLEAR_TIMEOUT_S, verify=False) as client:
            answer = client.post(path, json=body, headers=_credentials(request))
    except httpx.HTTPError as e:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"Airflow's API did not answer the clear: {e}") from None
    if answer.status_code != status.HTTP_200_OK:
        code = answer.status_code if answer.status_code in (401, 403, 404, 409) else status.HTTP_502_BAD_GATEWAY
        raise HTTPException(
            code,
            f"Airflow refused to clear task {task.task_id} of DAG run {task.run_id} of DAG {task.dag_id}: "
            f"{_detail(answer)}",
        )
    return sorted({str(ti["task_id"]) for ti in answer.json().get("task_instances", [])})


def _own_api_root(request: Request) -> str:
    """This server, at the address and scheme it received the request on, below its root path."""
    host, port = request.scope["server"]
    if ":" in host and _is_ip(host):
        host = f"[{host}]"
    root = str(request.scope.get("root_path", ""))
    return f"{request.scope.get('scheme', 'http')}://{host}:{port}{root.removesuffix(URL_PREFIX)}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _credentials(request: Request) -> dict[str, str]:
    """The user's token as Airflow's API takes it: the request's bearer header, or the UI's cookie."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    given = request.headers.get("authorization")
    if given:
        return {"Authorization": given}
    token = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _detail(answer: Any) -> str:
    try:
        detail = answer.json().get("detail")
    except ValueError:
        detail = None
    return str(detail or f"HTTP {answer.status_code}")


__all__ = ["RepairTask", "clear_export_task", "repair_task"]
