"""The exporters page: a FastAPI app the plugin mounts under ``/kafka2pc`` in Airflow's API server.

    GET  /kafka2pc/exporters?conn_id=C&prefix=P[&prefix=Q]   the page (HTML)
    GET  /kafka2pc/api/exporters?conn_id=C&prefix=P           the same reports as JSON
    POST /kafka2pc/exporters/acknowledge                      acknowledge a LOST run (a form)

Every endpoint asks Airflow's auth manager, with the user of the request (the UI's ``_token``
cookie or an ``Authorization: Bearer`` JWT): no user is 401; reading needs GET on DAG runs
(``is_authorized_dag``, ``DagAccessEntity.RUN``); acknowledging a loss needs, on top, PUT on the
connection the page reads Kafka with (``is_authorized_connection``: "can edit on Connections"), a
same-origin request, and the run id typed again. The reports are ``txn.two_phase.survey``'s, the CLI's own;
the acknowledgement is ``txn.two_phase.recovery.acknowledge_loss``, the CLI's own.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails, DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, FastAPI, Form, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from airflow_provider_kafka2pc.plugins.urls import PAGE, page_query

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0  # each Kafka request of one page load
RECENT_RUNS = 25
KAFKA_CONN_TYPES = ("kafka2pc", "kafka")

router = APIRouter()


def create_app() -> FastAPI:
    app = FastAPI(title="kafka2pc exporters", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)
    return app


# -- who may do what ---------------------------------------------------------------------------


def may_read(user: BaseUser) -> bool:
    """Reading an exporter's state: what reading DAG runs allows (Viewer and up)."""
    return bool(get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user))


def may_acknowledge(user: BaseUser, conn_id: str) -> bool:
    """Acknowledging a loss writes to the decision log with the connection's credentials: it needs
    what editing that connection needs ("can edit on Connections"; Op and Admin)."""
    return may_read(user) and bool(
        get_auth_manager().is_authorized_connection(
            method="PUT", details=ConnectionDetails(conn_id=conn_id, team_name=_team_of(conn_id)), user=user
        )
    )


def _team_of(conn_id: str) -> str | None:
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.connection import Connection

    team: str | None = Connection.get_team_name(conn_id)
    return team


def _require_read(user: BaseUser) -> None:
    if not may_read(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: reading exporters needs read access to DAG runs")


def _same_origin(request: Request) -> bool:
    """A browser names where a form was sent from; refuse one sent from another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin in (None, "null"):
        return True  # a sandboxed frame sends "null"; the cookie is SameSite=Lax anyway
    return urlsplit(origin).netloc == request.headers.get("host", "")


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
    return Kafka2PCHook(conn_id, connection=conn)  # the model has the fields the hook reads


def survey(conn_id: str, prefixes: Sequence[str]) -> dict[str, Any]:
    """Per prefix, ``txn.two_phase.survey``'s exporter and describe reports plus the runs table; and the
    prefixes the decision log knows (their claims). Read-only: a missing decision topic is not
    created."""
    from airflow_provider_kafka2pc.cli.commands import Connection as Clients
    from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCConfigError
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
        config, topic = hook.get_config(), hook.decision_topic
    except Kafka2PCConfigError as e:
        raise PageError(400, f"connection {conn_id!r}: {e}") from None
    wire = None
    decision_log = None
    try:
        exists = Clients(config, topic, TIMEOUT_S).decision_topic_exists()
        wanted = set(prefixes)
        state = LogState()
        if exists:
            decision_log = hook.decision_log()
            state = decision_log.read(
                keep_run=lambda p, _r, _raw: p in wanted, history="all" if wanted else frozenset()
            )
        exporters = []
        if prefixes:
            wire = hook.wire_client(bootstrap_timeout_ms=int(TIMEOUT_S * 1000))
            inspector = TransactionInspector(wire, TIMEOUT_S)
            for prefix in prefixes:
                report = reports.exporter_report(inspector, inspector.describe_prefix(prefix), state, prefix)
                described = reports.describe_report(inspector, state, prefix)
                exporters.append(
                    {
                        "prefix": prefix,
                        "transactions": report["transactions"],
                        "plan": report["plan"],
                        "losses": report["losses"],
                        "decisions": described["decisions"],
                        "runs": run_rows(described, report["losses"]),
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
            "note": r["note"] or "",
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
    _require_read(user)
    try:
        body = survey(conn_id, prefixes or [])
    except PageError as e:
        return JSONResponse({"detail": str(e)}, status_code=e.code)
    return JSONResponse(body | {"can_acknowledge": may_acknowledge(user, conn_id)})


@router.get(f"/{PAGE}", response_class=HTMLResponse)
def exporters_page(
    user: GetUserDep,
    conn_id: ConnId = "kafka2pc_default",
    prefixes: Prefixes = None,
    acknowledged: str | None = None,
) -> HTMLResponse:
    _require_read(user)
    wanted = [p.strip() for given in prefixes or [] for p in given.split(",") if p.strip()]
    notice = (
        f"Run {acknowledged} acknowledged: recovery no longer fails on it; its lost records stay lost."
        if acknowledged
        else None
    )
    try:
        data = survey(conn_id, wanted)
    except PageError as e:
        return HTMLResponse(render_page(conn_id, wanted, None, False, error=str(e)), status_code=e.code)
    return HTMLResponse(render_page(conn_id, wanted, data, may_acknowledge(user, conn_id), notice=notice))


@router.post(f"/{PAGE}/acknowledge")
def acknowledge(
    request: Request,
    user: GetUserDep,
    conn_id: Annotated[str, Form()],
    prefix: Annotated[str, Form()],
    run: Annotated[str, Form()],
    confirm_run: Annotated[str, Form()] = "",
    note: Annotated[str, Form()] = "",
) -> Response:
    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
    from airflow_provider_kafka2pc.txn.two_phase.recovery import NotLostError, acknowledge_loss

    if not _same_origin(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: the form was sent from another site")
    if not may_acknowledge(user, conn_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"Forbidden: acknowledging a loss needs permission to edit connection {conn_id!r}",
        )
    if confirm_run.strip() != run:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"not acknowledged: type the run id {run!r} to confirm")
    who = f"acknowledged in the Airflow UI by {user.get_name()}"
    try:
        hook = _hook(conn_id)
        decision_log = hook.decision_log()
        try:
            acknowledge_loss(decision_log, prefix, run, f"{note.strip()} ({who})" if note.strip() else who)
        finally:
            decision_log.close()
    except PageError as e:
        raise HTTPException(e.code, str(e)) from None
    except NotLostError as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e)) from None
    except Kafka2PCError as e:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, str(e)) from None
    log.warning("kafka2pc: run %s of %s acknowledged LOST by %s", run, prefix, user.get_name())
    query = page_query(conn_id, [prefix]) + "&" + _q("acknowledged", run)
    return RedirectResponse(f"../{PAGE}?{query}", status_code=status.HTTP_303_SEE_OTHER)


def _q(key: str, value: str) -> str:
    from urllib.parse import urlencode

    return urlencode({key: value})


# -- HTML ----------------------------------------------------------------------------------------

e = html.escape

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:20px 28px;color:#1a202c;
 background:#fff;font-size:14px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;padding-top:12px;border-top:1px solid #e2e8f0}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#64748b}code{font-family:ui-monospace,monospace;font-size:13px}
table{border-collapse:collapse;width:100%;margin:4px 0 8px}th,td{text-align:left;padding:6px 10px;
 border-bottom:1px solid #e2e8f0;vertical-align:top}th{background:#f8fafc;font-weight:600;font-size:13px}
td code{white-space:nowrap}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
 background:#64748b}.COMMITTED{background:#15803d}.LOST{background:#b91c1c}.ACKNOWLEDGED{background:#7c3aed}
.ABORTED,.ABORT{background:#c2410c}.COMMITTING,.DECIDED,.COMMIT{background:#0369a1}.VOID{background:#94a3b8}
.Ongoing{background:#a16207}.box{border:1px solid #e2e8f0;border-radius:8px;padding:10px 14px;margin:8px 0}
.loss{border-color:#fca5a5;background:#fef2f2}.error{border-color:#fca5a5;background:#fef2f2;color:#991b1b}
.notice{border-color:#86efac;background:#f0fdf4}form.inline{display:flex;gap:8px;flex-wrap:wrap;align-items:end}
label{display:flex;flex-direction:column;font-size:12px;color:#475569;gap:2px}
input{padding:5px 8px;border:1px solid #cbd5e1;border-radius:6px;font-size:14px}
button{padding:6px 14px;border:0;border-radius:6px;background:#0f172a;color:#fff;font-size:14px;cursor:pointer}
button.danger{background:#b91c1c}.counts b{font-size:16px}
"""


def render_page(
    conn_id: str,
    prefixes: Sequence[str],
    data: Mapping[str, Any] | None,
    can_acknowledge: bool,
    error: str | None = None,
    notice: str | None = None,
) -> str:
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Kafka exporters (kafka2pc)</title>',
        f"<style>{STYLE}</style></head><body>",
        "<h1>Kafka exporters</h1>",
        '<div class="muted">kafka2pc: per exporter prefix, its open transactions and the decisions that rule '
        "them, its recent runs and any loss, read from Kafka and the decision log as "
        "<code>kafka2pc list/describe</code> read them.</div>",
        _selector(conn_id, prefixes),
    ]
    if notice:
        parts.append(f'<div class="box notice" id="notice">{e(notice)}</div>')
    if error:
        parts.append(f'<div class="box error" id="error">{e(error)}</div>')
    if data is not None:
        parts.append(_known_prefixes(conn_id, data))
        for exporter in data["exporters"]:
            parts.append(_exporter(conn_id, exporter, can_acknowledge))
    parts.append("</body></html>")
    return "".join(parts)


def _link(conn_id: str, prefixes: Sequence[str], text: str) -> str:
    return f'<a href="{e(PAGE)}?{e(page_query(conn_id, prefixes))}">{e(text)}</a>'


def _selector(conn_id: str, prefixes: Sequence[str]) -> str:
    return (
        f'<form class="inline box" method="get" action="{PAGE}">'
        f'<label>Connection<input name="conn_id" value="{e(conn_id)}" size="20"></label>'
        f'<label>Exporter prefix<input name="prefix" value="{e(", ".join(prefixes))}" size="36"></label>'
        "<button type=submit>Show</button></form>"
    )


def _known_prefixes(conn_id: str, data: Mapping[str, Any]) -> str:
    topic = data["decision_topic"]
    if not data["decision_topic_exists"]:
        return f'<div class="box">Decision topic <code>{e(topic)}</code> does not exist yet: nothing was decided.</div>'
    known: Mapping[str, str] = data["known_prefixes"]
    if not known:
        return f'<div class="box muted">No exporter has claimed a prefix in <code>{e(topic)}</code>.</div>'
    links = ", ".join(f"{_link(conn_id, [p], p)} <span class=muted>({e(owner)})</span>" for p, owner in known.items())
    return f'<div class="box">Exporters in decision topic <code>{e(topic)}</code>: {links}</div>'


def _badge(state: str) -> str:
    return f'<span class="badge {e(state)}">{e(state)}</span>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], table_id: str) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _when(ms: int | None) -> str:
    from airflow_provider_kafka2pc.txn.two_phase.survey import iso

    return iso(ms) if ms else "-"


def _exporter(conn_id: str, x: Mapping[str, Any], can_acknowledge: bool) -> str:
    prefix = x["prefix"]
    anchor = "exporter-" + "".join(c if c.isalnum() else "-" for c in prefix)
    open_txns, losses = x["transactions"], x["losses"]
    parts = [
        f'<section id="{e(anchor)}" data-prefix="{e(prefix)}"><h2>Exporter <code>{e(prefix)}</code></h2>',
        f'<div class="counts"><b>{len(open_txns)}</b> open transaction(s) · <b>{len(losses)}</b> loss(es) '
        "not acknowledged</div>",
    ]
    for loss in losses:
        parts.append(_loss(conn_id, loss, can_acknowledge))
    parts.append("<h3>Open transactions</h3>")
    if open_txns:
        parts.append(
            _table(
                [
                    "transactional id",
                    "state",
                    "producer id / epoch",
                    "partitions",
                    "started",
                    "deadline",
                    "ruled by",
                    "kafka2pc resolve would",
                ],
                (
                    [
                        f"<code>{e(t['transactional_id'])}</code>",
                        _badge(t["state"]),
                        f"{t['producer_id']} / {t['producer_epoch']}",
                        e(", ".join(f"{p['topic']}-{p['partition']}" for p in t["partitions"])),
                        e(_when(t["start_time_ms"])),
                        e(_when(t["start_time_ms"] + t["timeout_ms"]) if t["start_time_ms"] else "-"),
                        _ruling(t),
                        e(t["action"]),
                    ]
                    for t in open_txns
                ),
                f"{anchor}-open",
            )
        )
        if any(t["decision"] is None for t in open_txns):
            # An undecided transaction is most often a run still between its prepare and its commit:
            # the action column is what a prefix-wide resolve would do now, not the next sensor.
            parts.append(
                '<div class="muted">A transaction without a decision belongs to a run still exporting or '
                "awaiting its commit, or to one that died. A run's own recovery sensor never aborts "
                "another live run's transactions; <code>kafka2pc resolve</code> for the whole prefix "
                "would, so run it only once those runs have ended.</div>"
            )
    else:
        parts.append('<div class="muted">None: nothing of this exporter is open on the broker.</div>')
    parts.append("<h3>Recent runs</h3>")
    if x["runs"]:
        parts.append(
            _table(
                ["run", "state", "transactions", "records", "time", "note"],
                (
                    [
                        f"<code>{e(r['run'])}</code>",
                        _badge(r["state"]),
                        e(str(r.get("transactions", "-"))),
                        e(f"{r['records']:,}" if isinstance(r.get("records"), int) else "-"),
                        e(r["time"]),
                        e(r["note"]),
                    ]
                    for r in x["runs"]
                ),
                f"{anchor}-runs",
            )
        )
    else:
        parts.append('<div class="muted">No run of this exporter is recorded in the decision log.</div>')
    parts.append("</section>")
    return "".join(parts)


def _ruling(t: Mapping[str, Any]) -> str:
    d = t["decision"]
    if d is None:
        other = t.get("other_decision")
        note = f" (a {other['kind']} of run {other['run']} names another epoch)" if other else ""
        return f'<span class="muted">no decision{e(note)}</span>'
    return f"{_badge(d['kind'])} run <code>{e(d['run'])}</code> <span class=muted>{e(d['decision_id'])}</span>"


def _loss(conn_id: str, loss: Mapping[str, Any], can_acknowledge: bool) -> str:
    run, prefix = loss["run"], loss["prefix"]
    lost_rows = _table(
        ["lost transaction", "producer id / epoch", "records", "partitions", "why"],
        (
            [
                f"<code>{e(t['transactional_id'])}</code>",
                f"{t['producer_id']} / {t['producer_epoch']}",
                e(f"{t['records']:,}"),
                e(", ".join(t["partitions"])),
                e(t["reason"]),
            ]
            for t in loss["lost"]
        ),
        f"loss-{run}",
    )
    counts = (
        f"<b>{loss['visible_transactions']}</b> of {loss['transactions']} transactions visible "
        f"({loss['visible_records']:,} of {loss['records']:,} records), "
        f"<b>{loss['lost_transactions']}</b> lost ({loss['lost_records']:,} records)"
        + (f", {loss['pending_transactions']} pending" if loss["pending_transactions"] else "")
    )
    parts = [
        f'<div class="box loss" data-run="{e(run)}">{_badge("LOST")} run <code>{e(run)}</code>: {counts}',
        lost_rows,
    ]
    if not loss["final"]:
        parts.append(
            '<div class="muted">Counted from the broker: no recovery has recorded this run yet. The next recovery '
            f"pass (the recovery sensor, or <code>kafka2pc resolve --prefix {e(prefix)}</code>) records it LOST; "
            "then it can be acknowledged here.</div>"
        )
    elif can_acknowledge:
        parts.append(
            f'<form class="inline" method="post" action="{PAGE}/acknowledge">'
            f'<input type="hidden" name="conn_id" value="{e(conn_id)}">'
            f'<input type="hidden" name="prefix" value="{e(prefix)}">'
            f'<input type="hidden" name="run" value="{e(run)}">'
            f'<label>Type the run id to confirm<input name="confirm_run" autocomplete="off" size="30" required></label>'
            '<label>Note (who, why)<input name="note" size="30"></label>'
            '<button class="danger" type="submit">Acknowledge loss</button></form>'
            '<div class="muted">Acknowledging tells recovery to stop failing on this run; its lost records stay '
            f"lost. Same as <code>{e(loss['acknowledge'])}</code>.</div>"
        )
    else:
        parts.append(
            '<div class="muted">Acknowledging this loss needs permission to edit connection '
            f"<code>{e(conn_id)}</code>; or run <code>{e(loss['acknowledge'])}</code>.</div>"
        )
    parts.append("</div>")
    return "".join(parts)
