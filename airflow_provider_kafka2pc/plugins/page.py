"""The exporters page: a FastAPI app the plugin mounts under ``/kafka2pc`` in Airflow's API server.

    GET  /kafka2pc/exporters?conn_id=C&prefix=P[&prefix=Q]   the page (HTML)
    GET  /kafka2pc/api/exporters?conn_id=C&prefix=P           the same reports as JSON
    POST /kafka2pc/exporters/acknowledge                      acknowledge a LOST run (a form)
    POST /kafka2pc/exporters/repair                           repair a LOST run: clear its export task (a form)

Every endpoint asks Airflow's auth manager, with the user of the request (the UI's ``_token``
cookie or an ``Authorization: Bearer`` JWT): no user is 401 (the page itself sends a browser to
Airflow's login page instead, and back after it); reading needs GET on DAG runs
(``is_authorized_dag``, ``DagAccessEntity.RUN``); acknowledging a loss needs, on top, PUT on the
connection the page reads Kafka with (``is_authorized_connection``: "can edit on Connections"), a
same-origin request, and the run id typed again; repairing one needs, on top of reading, PUT on the
run's task instances in its DAG (what Airflow's Clear needs), a same-origin request and the run id
typed again (``plugins/page_access.py``). The reports are ``txn.two_phase.survey``'s, the CLI's own;
the acknowledgement is ``txn.two_phase.recovery.acknowledge_loss``, the CLI's own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, FastAPI, Form, HTTPException, Query, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_kafka2pc.plugins.live_runs import live_dag_runs, mark_live
from airflow_provider_kafka2pc.plugins.page_access import (
    may_acknowledge,
    may_repair,
    require_read,
    require_same_origin,
)
from airflow_provider_kafka2pc.plugins.page_html import render_page
from airflow_provider_kafka2pc.plugins.urls import PAGE, page_query

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
    from airflow_provider_kafka2pc.plugins.page_repair import RepairTask
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0  # each Kafka request of one page load (connecting: the connection's connect timeout)
RECENT_RUNS = 25
KAFKA_CONN_TYPES = ("kafka2pc", "kafka")

router = APIRouter()


def create_app() -> FastAPI:
    app = FastAPI(title="kafka2pc exporters", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)
    app.add_exception_handler(StarletteHTTPException, _login_first)
    return app


async def _login_first(request: Request, exc: Exception) -> Response:
    """A browser opening the page without a session goes to Airflow's login page, and back here
    after it (as Airflow's own UI does); the JSON endpoint and the form keep their 401."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == status.HTTP_401_UNAUTHORIZED and request.method == "GET" and _is_page(request):
        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return RedirectResponse(login, status_code=status.HTTP_303_SEE_OTHER)
    return await http_exception_handler(request, exc)


def _is_page(request: Request) -> bool:
    """The page's own path, below wherever the app is mounted (``root_path``)."""
    path = request.url.path.removeprefix(str(request.scope.get("root_path", "")))
    return path.rstrip("/") == f"/{PAGE}"


# -- reading -----------------------------------------------------------------------------------


class PageError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _hook(conn_id: str) -> Kafka2PCHook:
    from airflow.models.connection import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        raise PageError(404, f"no Airflow connection {conn_id!r}") from None
    if conn.conn_type not in KAFKA_CONN_TYPES:
        raise PageError(400, f"connection {conn_id!r} is of type {conn.conn_type!r}, not kafka2pc or kafka")
    # The model has the fields the hook reads; a page load is told at once that Kafka refuses.
    return Kafka2PCHook(conn_id, connection=conn, patient=False)


def survey(conn_id: str, prefixes: Sequence[str]) -> dict[str, Any]:
    """Per prefix, ``txn.two_phase.survey``'s exporter and describe reports plus the runs table; and the
    prefixes the decision log knows (their claims). Read-only: a missing decision topic is not
    created."""
    from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
    from airflow_provider_kafka2pc.plugins.page_repair import RepairTask, repair_task
    from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
    from airflow_provider_kafka2pc.txn.protocol import naming
    from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
    from airflow_provider_kafka2pc.txn.two_phase import survey as reports

    for prefix in prefixes:
        try:
            naming.validate_prefix(prefix)
        except Kafka2PCError as e:
            raise PageError(400, str(e)) from None
    hook = _hook(conn_id)
    try:
        config, topic, connect_timeout_s = hook.get_config(), hook.decision_topic, hook.connect_timeout_s
    except Kafka2PCConfigError as e:
        raise PageError(400, f"connection {conn_id!r}: {e}") from None
    wire = None
    decision_log = None
    try:
        exists = KafkaClients(config, topic, TIMEOUT_S, connect_timeout_s=connect_timeout_s).decision_topic_exists()
        wanted = set(prefixes)
        state = LogState()
        if exists:
            decision_log = hook.decision_log()
            state = decision_log.read(
                keep_run=lambda p, _r, _raw: p in wanted, history="all" if wanted else frozenset()
            )
        exporters = []
        if prefixes:
            live = live_dag_runs()
            wire = hook.wire_client()
            inspector = TransactionInspector(wire, TIMEOUT_S)
            for prefix in prefixes:
                report = reports.exporter_report(inspector, inspector.describe_prefix(prefix), state, prefix)
                described = reports.describe_report(inspector, state, prefix)
                behind = reports.source_report(config, state, prefix)["source_behind"]
                mark_live(prefix, report["transactions"], state.queue(prefix), live, state.claims.get(prefix))
                for loss in report["losses"]:
                    rec = state.runs.get((prefix, loss["run"]))
                    task = repair_task(rec, state.claims.get(prefix)) if rec is not None else None
                    loss["repair_task"] = task.to_json() if isinstance(task, RepairTask) else None
                    loss["not_repairable"] = task if isinstance(task, str) else None
                exporters.append(
                    {
                        "prefix": prefix,
                        "transactions": report["transactions"],
                        "plan": report["plan"],
                        "losses": report["losses"],
                        "decisions": described["decisions"],
                        "runs": run_rows(described, report["losses"]),
                        "source_behind": behind,
                    }
                )
    except Kafka2PCError as e:
        raise PageError(502, str(e)) from None
    finally:
        if decision_log is not None:
            decision_log.close()
        if wire is not None:
            wire.close()
    return {
        "conn_id": conn_id,
        "decision_topic": topic,
        "decision_topic_exists": exists,
        "known_prefixes": dict(sorted(state.claims.items())),
        "exporters": exporters,
    }


def _repair_note(repair: Mapping[str, Any] | None) -> str:
    """What a run's repair did, for the runs table ("" for a run never repaired)."""
    if not repair:
        return ""
    return (
        f"repaired by {repair['actor']} at {repair['time']}: {repair['restored']:,} lost records exported again and "
        f"committed by decision {repair['decision']}; visible in two steps, not atomically"
    )


def run_rows(described: Mapping[str, Any], losses: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The prefix's recent runs, newest first, each with its state: a run record's (COMMITTED, LOST,
    ACKNOWLEDGED, DECIDED), else its decision's (ABORTED, COMMITTING, VOID); a loss the broker shows
    under a COMMIT in force makes the run LOST before any recovery recorded it."""
    rows: dict[str, dict[str, Any]] = {}
    for r in described["runs"]:
        rows[r["run"]] = {
            "run": r["run"],
            "state": r["status"],
            "transactions": r["transactions"],
            "records": r["records"],
            "at_ms": r["at_ms"],
            "time": r["time"],
            "note": r["note"] or _repair_note(r.get("repair")),
            "source": r.get("source_range") or "",
        }
    for d in described["decisions"]:
        row = rows.get(d["run"])
        if row is not None and row["state"] != "DECIDED":
            continue
        if d["void"]:
            state = "VOID"
        elif d["kind"] == "ABORT":
            state = "ABORTED"
        else:
            state = "COMMITTING"
        rows[d["run"]] = {
            "run": d["run"],
            "state": state,
            "transactions": d["transactions_of_prefix"],
            "records": d["records"],
            "at_ms": d["at_ms"],
            "time": d["time"],
            "note": f"{d['kind']} decision {d['decision_id']}" + (f", void: {d['void']}" if d["void"] else ""),
            "source": d.get("source_range") or "",
        }
    for loss in losses:
        row = rows.setdefault(loss["run"], {"run": loss["run"], "at_ms": 0, "time": "-"})
        row.update(
            state="LOST",
            transactions=loss["transactions"],
            records=loss["records"],
            note=loss["summary"] + ("" if loss["final"] else " (counted from the broker; no recovery ran yet)"),
        )
    return sorted(rows.values(), key=lambda r: (-int(r["at_ms"] or 0), r["run"]))[:RECENT_RUNS]


# -- endpoints ---------------------------------------------------------------------------------

ConnId = Annotated[str, Query(description="a kafka2pc (or kafka) Airflow connection")]
Prefixes = Annotated[list[str] | None, Query(alias="prefix", description="an exporter's transactional id prefix")]


@router.get("/api/exporters")
def api_exporters(user: GetUserDep, conn_id: ConnId = "kafka2pc_default", prefixes: Prefixes = None) -> Response:
    require_read(user)
    try:
        body = survey(conn_id, prefixes or [])
    except PageError as e:
        return JSONResponse({"detail": str(e)}, status_code=e.code)
    _mark_repairable(user, body)
    return JSONResponse(body | {"can_acknowledge": may_acknowledge(user, conn_id)})


@router.get(f"/{PAGE}", response_class=HTMLResponse)
def exporters_page(
    user: GetUserDep,
    conn_id: ConnId = "kafka2pc_default",
    prefixes: Prefixes = None,
    acknowledged: str | None = None,
    repairing: str | None = None,
    cleared: str | None = None,
) -> HTMLResponse:
    require_read(user)
    wanted = [p.strip() for given in prefixes or [] for p in given.split(",") if p.strip()]
    notice = None
    if acknowledged:
        notice = f"Run {acknowledged} acknowledged: recovery no longer fails on it; its lost records stay lost."
    elif repairing:
        notice = (
            f"Repair of run {repairing} started: Airflow cleared task(s) {cleared or 'none'} of the run, and its "
            "export task now exports the lost Spark partitions again, proves them the same records and commits them. "
            "Reload this page: the run shows REPAIRED once its commit has run."
        )
    try:
        data = survey(conn_id, wanted)
    except PageError as e:
        return HTMLResponse(render_page(conn_id, wanted, None, False, error=str(e)), status_code=e.code)
    _mark_repairable(user, data)
    return HTMLResponse(render_page(conn_id, wanted, data, may_acknowledge(user, conn_id), notice=notice))


def _mark_repairable(user: BaseUser, data: Mapping[str, Any]) -> None:
    """Each recorded loss an export task can repair says whether this user may clear that task."""
    allowed: dict[str, bool] = {}
    for exporter in data["exporters"]:
        for loss in exporter["losses"]:
            task = loss.get("repair_task")
            if task is not None and loss["final"]:
                dag_id = task["dag_id"]
                loss["can_repair"] = allowed.setdefault(dag_id, may_repair(user, dag_id))
            else:
                loss["can_repair"] = False


class RunForm(BaseModel):
    """A form about one run of one exporter, its run id typed again to confirm."""

    conn_id: str
    prefix: str
    run: str
    confirm_run: str = ""


class AcknowledgeForm(RunForm):
    note: str = ""


@router.post(f"/{PAGE}/acknowledge")
def acknowledge(request: Request, user: GetUserDep, form: Annotated[AcknowledgeForm, Form()]) -> Response:
    from airflow_provider_kafka2pc.txn.two_phase.recovery import acknowledge_loss

    conn_id, prefix, run, note = form.conn_id, form.prefix, form.run, form.note
    require_same_origin(request)
    if not may_acknowledge(user, conn_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"Forbidden: acknowledging a loss needs permission to edit connection {conn_id!r}",
        )
    if form.confirm_run.strip() != run:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"not acknowledged: type the run id {run!r} to confirm")
    who = f"acknowledged in the Airflow UI by {user.get_name()}"
    with _decision_log_of(conn_id) as decision_log:
        acknowledge_loss(decision_log, prefix, run, f"{note.strip()} ({who})" if note.strip() else who)
    log.warning("kafka2pc: run %s of %s acknowledged LOST by %s", run, prefix, user.get_name())
    query = page_query(conn_id, [prefix]) + "&" + _q("acknowledged", run)
    return RedirectResponse(f"../{PAGE}?{query}", status_code=status.HTTP_303_SEE_OTHER)


@router.post(f"/{PAGE}/repair")
def repair(request: Request, user: GetUserDep, form: Annotated[RunForm, Form()]) -> Response:
    """Repair a LOST run: clear its export task (``plugins/page_repair.py``), which repairs it."""
    from airflow_provider_kafka2pc.plugins.page_repair import clear_export_task

    conn_id, prefix, run = form.conn_id, form.prefix, form.run
    require_same_origin(request)
    require_read(user)
    if form.confirm_run.strip() != run:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"not repaired: type the run id {run!r} to confirm")
    task = _lost_run_task(conn_id, prefix, run)
    if not may_repair(user, task.dag_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"Forbidden: repairing run {run} needs permission to clear task instances of DAG {task.dag_id!r}",
        )
    cleared = clear_export_task(request, task)
    log.warning(
        "kafka2pc: repair of LOST run %s of %s started by %s: cleared %s", run, prefix, user.get_name(), cleared
    )
    query = page_query(conn_id, [prefix]) + "&" + _q("repairing", run) + "&" + _q("cleared", ", ".join(cleared))
    return RedirectResponse(f"../{PAGE}?{query}", status_code=status.HTTP_303_SEE_OTHER)


def _lost_run_task(conn_id: str, prefix: str, run: str) -> RepairTask:
    """The export task that repairs ``run``, read from the decision log: 409 unless the run is LOST
    and was an export task's."""
    from airflow_provider_kafka2pc.plugins.page_repair import repair_task
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus

    with _decision_log_of(conn_id) as decision_log:
        state = decision_log.read_for(prefix, run)
    rec = state.run_status(prefix, run)
    if rec is None or rec.status is not RunStatus.LOST:
        said = "has no run record" if rec is None else f"is {rec.status.value}"
        raise HTTPException(status.HTTP_409_CONFLICT, f"not repaired: run {run} of exporter {prefix} {said}, not LOST")
    task = repair_task(rec, state.claims.get(prefix))
    if isinstance(task, str):
        raise HTTPException(status.HTTP_409_CONFLICT, f"not repaired: run {run} of exporter {prefix} {task}")
    return task


@contextlib.contextmanager
def _decision_log_of(conn_id: str) -> Iterator[DecisionLog]:
    """The connection's decision log for one form's step; its failures as the HTTP answers they are."""
    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, NotLostError

    try:
        decision_log = _hook(conn_id).decision_log()
        try:
            yield decision_log
        finally:
            decision_log.close()
    except PageError as e:
        raise HTTPException(e.code, str(e)) from None
    except NotLostError as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    except Kafka2PCError as e:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, str(e)) from None


def _q(key: str, value: str) -> str:
    from urllib.parse import urlencode

    return urlencode({key: value})
