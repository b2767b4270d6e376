"""The exporters page as HTML: one self-contained page (no script, inline style) built from the
survey's reports, every value escaped. The app (``plugins/page.py``) decides what to show and to whom.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.plugins.urls import PAGE, page_query

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
.Ongoing{background:#a16207}.LIVE{background:#0e7490}
.box{border:1px solid #e2e8f0;border-radius:8px;padding:10px 14px;margin:8px 0}
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
    if x.get("source_behind"):  # output visible, source group not moved: the commands that fix it
        parts.append(f'<div class="loss source-behind"><b>Source group behind.</b> {e(x["source_behind"])}</div>')
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
                        (_badge("LIVE") + f" DAG run <code>{e(t['live_run'])}</code>: " if t.get("live_run") else "")
                        + e(t["action"]),
                    ]
                    for t in open_txns
                ),
                f"{anchor}-open",
            )
        )
        if any(t["decision"] is None and not t.get("live_run") for t in open_txns):
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
                        e(r["note"]) + (f"<div class=muted>read {e(r['source'])}</div>" if r.get("source") else ""),
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
    else:
        parts.append(_repair(conn_id, loss))
    if loss["final"] and can_acknowledge:
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
    elif loss["final"]:
        parts.append(
            '<div class="muted">Acknowledging this loss needs permission to edit connection '
            f"<code>{e(conn_id)}</code>; or run <code>{e(loss['acknowledge'])}</code>.</div>"
        )
    parts.append("</div>")
    return "".join(parts)


def _repair(conn_id: str, loss: Mapping[str, Any]) -> str:
    """How to repair a recorded loss: the button that clears the run's export task (for a user who may
    clear it), else the ways to do it by hand."""
    run, prefix, task = loss["run"], loss["prefix"], loss.get("repair_task")
    shell = f"From a shell: <code>{e(loss['repair'])}</code>. Acknowledge only if the source changed."
    if task is None:
        why = (
            loss.get("not_repairable")
            or f"was not exported by an export task; repair it from a shell: {loss['repair']}"
        )
        return f'<div class="muted"><b>No clear repairs this run</b>: it {e(why)}.</div>'
    what = (
        f"clears task <code>{e(task['task_id'])}</code> of DAG run <code>{e(task['run_id'])}</code> (and the tasks "
        "after it) in Airflow; that export task exports exactly the lost Spark partitions again, proves them the "
        "same records and commits them"
    )
    if not loss.get("can_repair"):
        return (
            f'<div class="muted"><b>Repair it</b>: a clear of the export task {what}; it needs permission to clear '
            f"task instances of DAG <code>{e(task['dag_id'])}</code>. {shell}</div>"
        )
    return (
        f'<form class="inline repair" method="post" action="{PAGE}/repair">'
        f'<input type="hidden" name="conn_id" value="{e(conn_id)}">'
        f'<input type="hidden" name="prefix" value="{e(prefix)}">'
        f'<input type="hidden" name="run" value="{e(run)}">'
        '<label>Type the run id to confirm<input name="confirm_run" autocomplete="off" size="30" required></label>'
        '<button type="submit">Repair run</button></form>'
        f'<div class="muted"><b>Repair it</b>: the button {what}. {shell}</div>'
    )
