"""How the ``kafka2pc`` commands print their reports as text; ``--json`` prints the same reports whole.

Every function here takes a report the commands built and only formats it: what is true is decided
in ``commands`` (and in ``txn``), never while printing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO


def print_json(out: TextIO, report: Mapping[str, Any]) -> None:
    out.write(json.dumps(report, indent=2) + "\n")


def open_transactions(out: TextIO, report: Mapping[str, Any]) -> None:
    rows = report["transactions"]
    out.write(f"prefix {report['prefix']}: {len(rows)} open transaction(s)\n")
    if not report["decision_topic_exists"]:
        out.write(f"decision topic {report['decision_topic']} does not exist: no decisions\n")
    if rows:
        out.write(
            _table(
                [
                    "TRANSACTIONAL ID",
                    "STATE",
                    "PRODUCER ID",
                    "EPOCH",
                    "PARTITIONS",
                    "AGE",
                    "DECISION",
                    "RUN",
                    "ACTOR",
                    "ACTION",
                ],
                [
                    [
                        r["transactional_id"],
                        r["state"],
                        str(r["producer_id"]),
                        str(r["producer_epoch"]),
                        _partitions(r["partitions"]),
                        duration(r["age_ms"]),
                        _decision_cell(r),
                        r["decision"]["run"] if r["decision"] else "-",
                        r["decision"]["actor"] if r["decision"] else "-",
                        "wait (broker completing)" if r["action"] == "wait" else r["action"],
                    ]
                    for r in rows
                ],
            )
        )


def _decision_cell(row: Mapping[str, Any]) -> str:
    d = row["decision"]
    if d is not None:
        return f"{d['kind']} {_short(d['decision_id'])}"
    other = row["other_decision"]
    if other is None:
        return "none"
    what = (
        f"void: {other['void']}"
        if other["void"]
        and (other["producer_id"], other["producer_epoch"]) == (row["producer_id"], row["producer_epoch"])
        else f"for producer {other['producer_id']} epoch {other['producer_epoch']}"
    )
    return f"none (log: {other['kind']} {_short(other['decision_id'])} {what})"


def losses(out: TextIO, report: Mapping[str, Any]) -> None:
    """Every run with a loss: how much of it is visible, what is lost, and the command that follows."""
    for f in report["losses"]:
        where = "its run record" if f["final"] else f"COMMIT {f['decision_id']}, counted on the broker"
        state = "PARTLY VISIBLE" if f["partly_visible"] else "LOST"
        out.write(f"{state}: {f['summary']} ({where})\n")
        out.write(_lost_table(f["lost"]))
        if f["pending_transactions"]:
            out.write(
                f"  {f['pending_transactions']} transaction(s) of it are still open under the COMMIT: "
                f"`kafka2pc resolve --prefix {f['prefix']}` commits them\n"
            )
        out.write(
            f"  repair it: clear the run's export task, or `{f['repair']}`; if its source changed, re-export the "
            f"missing part another way, then: {f['acknowledge']}\n"
        )


def source_behind(out: TextIO, report: Mapping[str, Any]) -> None:
    """A Kafka source group a visible run did not move (``survey.source_report``), with its commands."""
    if report.get("source_behind"):
        out.write(f"SOURCE GROUP BEHIND: {report['source_behind']}\n")
    elif report.get("source_unread"):
        out.write(f"note: {report['source_unread']}\n")


def _lost_table(lost: Sequence[Mapping[str, Any]]) -> str:
    return _indent(
        _table(
            ["TRANSACTIONAL ID", "PRODUCER ID", "EPOCH", "RECORDS", "PARTITIONS", "REASON"],
            [
                [
                    t["transactional_id"],
                    str(t["producer_id"]),
                    str(t["producer_epoch"]),
                    str(t["records"]),
                    ",".join(t["partitions"]) or "-",
                    t["reason"],
                ]
                for t in lost
            ],
        )
    )


def decisions_and_runs(out: TextIO, report: Mapping[str, Any]) -> None:
    prefix, owner, open_now = report["prefix"], report["claim_owner"], report["open_transactions"]
    # The claim says which export task owns the prefix (so that no other exporter uses it), not
    # that anything is in flight: that is what the open transactions say.
    owned = f"owned by export task {owner}" if owner else "no export task has claimed it yet"
    in_flight = f"{open_now} open transaction(s)" if open_now else "nothing in flight (no open transaction)"
    out.write(f"prefix {prefix}: {owned}; {in_flight}\n")
    if not report["decision_topic_exists"]:
        out.write(f"decision topic {report['decision_topic']} does not exist: no decisions\n")
        return
    decisions = report["decisions"]
    ruling = sum(1 for d in decisions if d["in_force"] and d["rules"])
    void = sum(1 for d in decisions if not d["in_force"])
    out.write(
        f"{ruling} decision(s) in force, {len(decisions) - ruling - void} kept that rule nothing any more and "
        f"{void} void touching {prefix} in decision log {report['decision_topic']}\n"
    )
    if decisions:
        out.write(
            _table(
                [
                    "KIND",
                    "DECISION ID",
                    "RUN",
                    "ACTOR",
                    "TIME",
                    "TXNS",
                    "COMMITTED",
                    "ABORTED",
                    "LOST",
                    "PENDING",
                    "STATUS",
                ],
                [
                    [
                        d["kind"],
                        d["decision_id"],
                        d["run"],
                        d["actor"],
                        d["time"],
                        str(d["transactions"]),
                        str(d["outcome"]["committed"]),
                        str(d["outcome"]["aborted"]),
                        str(d["outcome"]["lost"]),
                        str(d["outcome"]["pending"]),
                        _status(d),
                    ]
                    for d in decisions
                ],
            )
        )
    for d in decisions:
        if d.get("source_range"):
            out.write(f"{d['kind']} {d['decision_id']} of run {d['run']} reads {d['source_range']}\n")
    position = report.get("source_position")
    if position:
        out.write(f"Kafka source of {prefix}: last moved by run {position['run']}: {position['source_range']}\n")
    runs = report["runs"]
    if runs:
        out.write(f"{len(runs)} run record(s) of {prefix}:\n")
        out.write(
            _table(
                ["RUN", "STATUS", "TRANSACTIONS", "RECORDS", "TIME", "NOTE"],
                [
                    [r["run"], r["status"], str(r["transactions"]), str(r["records"]), r["time"], r["note"] or "-"]
                    for r in runs
                ],
            )
        )
        for r in runs:
            if r.get("source_range"):
                out.write(f"run {r['run']} read {r['source_range']}\n")
            if r.get("repair"):
                rep = r["repair"]
                out.write(
                    f"run {r['run']}: repair decision {rep['decision']} ({rep['actor']}, {rep['time']}) exported "
                    f"{rep['records']} records again in {rep['txns']} transaction(s), restoring {rep['restored']} lost "
                    "records: the run became visible in two steps, not atomically\n"
                )
            if r["lost"] and r["status"] != "LOST":  # a LOST one is shown with the losses below
                out.write(f"run {r['run']}: {len(r['lost'])} lost transaction(s) ({r['status']}):\n")
                out.write(_lost_table(r["lost"]))


def _status(d: Mapping[str, Any]) -> str:
    if not d["in_force"]:
        return f"void: {d['void']}"
    if d["rules"]:
        return f"in force (rules {d['rules']})"
    return "kept, rules nothing (an earlier decision rules its transactions)"


def resolved(out: TextIO, report: Mapping[str, Any]) -> None:
    resolutions = report["resolutions"]
    counts = {v: sum(1 for r in resolutions if r["outcome"] == v) for v in ("committed", "aborted")}
    out.write(
        f"prefix {report['prefix']}: "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + f", {len(report['lost'])} lost; {len(report['still_open'])} still open\n"
    )
    if resolutions:
        out.write(
            _table(
                ["TRANSACTIONAL ID", "PRODUCER ID", "EPOCH", "ACTION", "OUTCOME", "DETAIL"],
                [
                    [
                        r["transactional_id"],
                        str(r["producer_id"]),
                        str(r["producer_epoch"]),
                        r["action"],
                        r["outcome"],
                        r["detail"],
                    ]
                    for r in resolutions
                ],
            )
        )
    repairing = {t["transactional_id"]: t["run"] for t in report.get("left_to_repair", ())}
    for t in report["still_open"]:
        run = repairing.get(t["transactional_id"])
        held = f": left to the live repair of run {run}, which commits or aborts it" if run is not None else ""
        out.write(f"still open: {t['transactional_id']} ({t['state']}){held}\n")
    if report["lost"] and not report["losses"]:  # lost in this call, and retired from the log since
        out.write(f"LOST: {len(report['lost'])} transaction(s) decided COMMIT can never become visible:\n")
        out.write(_lost_table(report["lost"]))
    losses(out, report)


def _short(decision_id: str) -> str:
    """A uuid decision id cut like a git hash; JSON output has it whole."""
    return decision_id[:12] if len(decision_id) == 32 else decision_id


def _indent(text: str, by: str = "  ") -> str:
    return "".join(by + line for line in text.splitlines(keepends=True))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines) + "\n"


def _partitions(parts: Iterable[Mapping[str, Any]]) -> str:
    by_topic: dict[str, list[int]] = {}
    for p in parts:
        by_topic.setdefault(str(p["topic"]), []).append(int(p["partition"]))
    return " ".join(f"{t}[{','.join(map(str, sorted(ps)))}]" for t, ps in sorted(by_topic.items())) or "-"


def duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
