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
submit it again; a run whose lost transactions carry no digest cannot be repaired at all. The clear
is refused while the task is queued or running (a repair already), and reported as refused when
the run has no such task (the DAG changed since).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request, status

from airflow_provider_kafka2pc.plugins.urls import URL_PREFIX
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import acknowledge_command, repair_command
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord

CLEAR_TIMEOUT_S = 30.0
# A task instance in these states is being run, or about to be: a clear would kill or requeue it.
BUSY_STATES = frozenset(
    {"queued", "scheduled", "running", "up_for_retry", "up_for_reschedule", "restarting", "deferred"}
)


@dataclass(frozen=True)
class RepairTask:
    """The task whose clear repairs a LOST run."""

    dag_id: str
    run_id: str
    task_id: str

    def to_json(self) -> dict[str, str]:
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id}

    def describe(self) -> str:
        return f"task {self.task_id} of DAG run {self.run_id} of DAG {self.dag_id}"


def repair_task(rec: RunRecord, owner: str | None) -> RepairTask | str:
    """The export task whose clear repairs the LOST run ``rec`` by the exporter's claim (``owner``),
    or why no clear does (a sentence that follows "run R of exporter P")."""
    if any(t.covered.digest is None for t in rec.lost):
        return (
            "lost transactions that carry no digest of their records (the export had repairable=False, wrote a "
            "frame stored already, or ran a version before 0.2.0): no repair can prove a re-export the same. "
            f"Re-export the missing part in a run of its own and acknowledge the loss: "
            f"{acknowledge_command(rec.prefix, rec.run)}"
        )
    dag_id, sep, run_id = rec.run.partition("/")
    ids = (t.covered.transactional_id for t in rec.lost)
    if any((p := naming.parse_transactional_id(t)) is not None and p.attempt is not None for t in ids):
        why = (
            "was exported by a Spark application (its ids carry a driver attempt's tag), whose submit task a "
            "clear would only run again"
        )
    elif not (sep and dag_id and run_id and owner and owner.startswith(f"{dag_id}.")):
        why = f"was not exported by an export task of its DAG (the exporter is claimed by {owner or 'nobody'})"
    else:
        return RepairTask(dag_id, run_id, owner[len(dag_id) + 1 :])
    return f"{why}; repair it from a shell: {repair_command(rec.prefix, rec.run)}"


def clear_export_task(request: Request, task: RepairTask) -> list[str]:
    """Clear ``task`` and its downstream tasks in its run as the request's user; the ids cleared.
    Refused (409) while the task is queued or running, a repair most likely (a second click), and
    when the run has no such task (the DAG changed since): nothing is cleared then."""
    import httpx

    body = {
        "dry_run": False,
        "dag_run_id": task.run_id,
        "task_ids": [task.task_id],
        "include_downstream": True,
        "only_failed": False,
        "reset_dag_runs": True,
    }
    dag, run, what = quote(task.dag_id, safe=""), quote(task.run_id, safe=""), task.describe()
    instance = f"/api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{quote(task.task_id, safe='')}"
    try:
        # verify=False: the request goes to this very server's socket by its address, which no
        # certificate names; the credentials are the ones the browser just sent it.
        with httpx.Client(base_url=_own_api_root(request), timeout=CLEAR_TIMEOUT_S, verify=False) as client:
            headers = _credentials(request)
            now = client.get(instance, headers=headers)
            _check(now, f"Airflow cannot show {what}")
            state = now.json().get("state")
            if state in BUSY_STATES:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    f"not repaired: {what} is {state} (a repair started already?): wait for it",
                )
            answer = client.post(f"/api/v2/dags/{dag}/clearTaskInstances", json=body, headers=headers)
    except httpx.HTTPError as e:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"Airflow's API did not answer the clear: {e}") from None
    _check(answer, f"Airflow refused to clear {what}")
    cleared = sorted({str(ti["task_id"]) for ti in answer.json().get("task_instances", [])})
    if task.task_id not in cleared:
        raise HTTPException(status.HTTP_409_CONFLICT, f"not repaired: Airflow cleared no {what} (cleared: {cleared})")
    return cleared


def _check(answer: Any, doing: str) -> None:
    if answer.status_code != status.HTTP_200_OK:
        code = answer.status_code if answer.status_code in (401, 403, 404, 409) else status.HTTP_502_BAD_GATEWAY
        raise HTTPException(code, f"{doing}: {_detail(answer)}")


def _own_api_root(request: Request) -> str:
    """This server, at the address and scheme it received the request on, below its root path."""
    server = request.scope.get("server")
    if not server:  # a unix socket: no address to call back
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the API server listens on no address the page can call")
    host, port = server
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
