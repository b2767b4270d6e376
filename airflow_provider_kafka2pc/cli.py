"""``kafka2pc``: look at and resolve one exporter's transactions from a shell, without Airflow.

    kafka2pc list --prefix P        open transactions of P on the broker, each joined with its
                                    decision and the action recovery would take
    kafka2pc describe --prefix P    the decision log's latest record per transactional id of P
    kafka2pc resolve --prefix P     run recovery: commit what is decided, abort the rest
                                    (--dry-run: print the plan, change nothing)

Exit status: 0 done (resolve: nothing of the prefix is left open); 1 transactions of the prefix
are still open (resolve, and resolve --dry-run when there is something to do); 2 bad usage or an
invalid prefix; 3 Kafka unreachable or failing; 4 a transaction with a COMMIT decision was lost.

Only the transaction core is imported: no Airflow, and Kafka clients only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from airflow_provider_kafka2pc import __version__
from airflow_provider_kafka2pc.txn import naming
from airflow_provider_kafka2pc.txn.config import connection_only, redact
from airflow_provider_kafka2pc.txn.decision_log import (
    DEFAULT_DECISION_TOPIC,
    DecisionLog,
    DecisionRecord,
    DecisionSnapshot,
)
from airflow_provider_kafka2pc.txn.errors import BrokerUnavailableError, InvalidPrefixError, Kafka2PCError
from airflow_provider_kafka2pc.txn.inspect import TransactionInspector
from airflow_provider_kafka2pc.txn.outcome import Verdict
from airflow_provider_kafka2pc.txn.recovery import RecoveryPlan, RecoveryResult, plan_recovery, recover
from airflow_provider_kafka2pc.txn.resume import Resolution, ref_of
from airflow_provider_kafka2pc.txn.wire import TxnListing, TxnState, WireClient

EXIT_OK = 0
EXIT_OPEN = 1
EXIT_USAGE = 2  # what argparse uses too
EXIT_FAILED = 3
EXIT_LOST = 4

ENV_BOOTSTRAP = "KAFKA2PC_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WAIT_S = 10.0
DEFAULT_RUN = "kafka2pc-cli"
_POLL_S = 0.5
_LIBRDKAFKA_LOGGER = "kafka2pc.librdkafka"


class UsageError(Exception):
    """Bad input found after argument parsing; exits with EXIT_USAGE."""


class Connection:
    """The Kafka clients one command needs, built on first use, closed at the end."""

    def __init__(self, config: Mapping[str, Any], decision_topic: str, timeout_s: float) -> None:
        self.config = dict(config)
        self.decision_topic = decision_topic
        self.timeout_s = timeout_s
        self._wire: WireClient | None = None
        self._log: DecisionLog | None = None

    def wire(self) -> WireClient:
        if self._wire is None:
            ms = int(self.timeout_s * 1000)
            self._wire = WireClient(self.config, request_timeout_ms=ms, bootstrap_timeout_ms=ms)
        return self._wire

    def decision_log(self) -> DecisionLog:
        if self._log is None:
            self._log = DecisionLog(self.config, topic=self.decision_topic, timeout_s=self.timeout_s)
        return self._log

    def decision_topic_exists(self) -> bool:
        """Asked before reading, because DecisionLog.read() creates a missing topic."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # librdkafka logs every failed connect to stderr; we report the failure ourselves.
        conf: dict[str, Any] = {**connection_only(self.config), "logger": logging.getLogger(_LIBRDKAFKA_LOGGER)}
        admin = AdminClient(conf)
        try:
            # All topics, not just ours: a metadata request naming a missing topic may auto-create it.
            md = admin.list_topics(timeout=self.timeout_s)
        except KafkaException as e:
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {self.config.get('bootstrap.servers')} within {self.timeout_s:g} s: {e}"
            ) from e
        return self.decision_topic in md.topics

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
        if self._log is not None:
            self._log.close()


Connect = Callable[[Mapping[str, Any], str, float], Connection]


# -- arguments ------------------------------------------------------------------------------


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", required=True, help="the exporter's transactional id prefix")
    common.add_argument(
        "--bootstrap-servers",
        default=os.environ.get(ENV_BOOTSTRAP, DEFAULT_BOOTSTRAP),
        help=f"Kafka bootstrap servers (default: ${ENV_BOOTSTRAP}, else {DEFAULT_BOOTSTRAP})",
    )
    common.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting such as security.protocol or sasl.mechanism (repeatable)",
    )
    common.add_argument(
        "--config-file",
        action="append",
        default=[],
        metavar="PATH",
        help="KEY=VALUE lines, read before --config; keeps secrets such as sasl.password off the command line",
    )
    common.add_argument("--decision-topic", default=DEFAULT_DECISION_TOPIC, help="the decision log topic")
    common.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"connection and request timeout (default {DEFAULT_TIMEOUT_S:g})",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--debug", action="store_true", help="log more and show tracebacks (secrets stay hidden)")

    parser = argparse.ArgumentParser(
        prog="kafka2pc",
        description="Inspect and resolve the Kafka transactions of a kafka2pc exporter.",
        epilog="Exit status: 0 done, 1 transactions still open, 2 bad usage, 3 Kafka failing, 4 lost.",
    )
    parser.add_argument("--version", action="version", version=f"kafka2pc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", parents=[common], help="open transactions of a prefix and what recovery would do")
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("describe", parents=[common], help="the decision log's latest record per transactional id")
    p.set_defaults(handler=cmd_describe)

    p = sub.add_parser("resolve", parents=[common], help="commit what is decided, abort the rest")
    p.add_argument("--dry-run", action="store_true", help="print the plan only; change nothing")
    p.add_argument(
        "--wait",
        type=_non_negative_float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for transactions the broker is completing (Prepare*), default {DEFAULT_WAIT_S:g}",
    )
    p.add_argument("--run", default=DEFAULT_RUN, help=f"run name on the records written (default {DEFAULT_RUN})")
    p.add_argument(
        "--allow-missing-decision-topic",
        action="store_true",
        help="resolve even if the decision topic does not exist (every open transaction is then aborted)",
    )
    p.set_defaults(handler=cmd_resolve)
    return parser


def client_config(args: argparse.Namespace) -> dict[str, str]:
    config = {"bootstrap.servers": str(args.bootstrap_servers)}
    items: list[tuple[str, str]] = []
    for path in args.config_file:
        items += _read_properties(path)
    items += [(f"--config #{i + 1}", item) for i, item in enumerate(args.config)]
    for where, item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        # Never echo the item: a mistyped one may be a bare password.
        if not sep or not key:
            raise UsageError(f"{where}: expected KEY=VALUE")
        if key == "bootstrap.servers":
            raise UsageError(f"{where}: set bootstrap.servers with --bootstrap-servers")
        config[key] = value
    return config


def _read_properties(path: str) -> list[tuple[str, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read --config-file {path}: {e.strerror}") from None
    return [
        (f"{path}:{n}", line.strip())
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith(("#", "!"))
    ]


# -- list -----------------------------------------------------------------------------------


def _snapshot(conn: Connection) -> tuple[DecisionSnapshot, bool]:
    """The decision log without creating its topic: read-only commands must change nothing."""
    if not conn.decision_topic_exists():
        return DecisionSnapshot({}, {}), False
    return conn.decision_log().read(), True


def _plan_rows(
    states: Sequence[TxnState], snapshot: DecisionSnapshot, now_ms: int
) -> tuple[list[dict[str, Any]], RecoveryPlan]:
    plan = plan_recovery(states, snapshot)
    action = {r.transactional_id: "commit" for r in plan.commit}
    action.update({r.transactional_id: "abort" for r in plan.abort})
    action.update({tid: "wait" for tid in plan.wait})
    rows = []
    for s in sorted(states, key=lambda s: _id_order(s.transactional_id)):
        matching = snapshot.get(ref_of(s))
        latest = snapshot.latest.get(s.transactional_id)
        rows.append(
            {
                "transactional_id": s.transactional_id,
                "state": s.state,
                "producer_id": s.producer_id,
                "producer_epoch": s.producer_epoch,
                "partitions": [{"topic": t, "partition": p} for t, p in s.topic_partitions],
                "start_time_ms": s.start_time_ms if s.start_time_ms > 0 else None,
                "age_ms": now_ms - s.start_time_ms if s.start_time_ms > 0 else None,
                "timeout_ms": s.timeout_ms,
                # Only a record for the same (id, producer id, epoch) counts; the latest one of
                # any epoch is shown too, so a stale COMMIT explains itself.
                "decision": matching.decision.value if matching is not None else None,
                "latest_record": _record_json(latest) if latest is not None else None,
                "action": action[s.transactional_id],
            }
        )
    return rows, plan


def cmd_list(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    wire = conn.wire()  # first: the fastest way to find out that the broker is down
    states = TransactionInspector(wire, args.timeout).describe_prefix(args.prefix)
    snapshot, exists = _snapshot(conn)
    rows, plan = _plan_rows(states, snapshot, _now_ms())
    if args.json:
        _print_json(out, _header(args, exists) | {"transactions": rows, "plan": _plan_json(plan)})
    else:
        _print_open(out, args, rows, exists)
    return EXIT_OK


def _print_open(out: TextIO, args: argparse.Namespace, rows: Sequence[Mapping[str, Any]], exists: bool) -> None:
    out.write(f"prefix {args.prefix}: {len(rows)} open transaction(s)\n")
    if not exists:
        out.write(f"decision topic {args.decision_topic} does not exist: no decisions\n")
    if rows:
        out.write(
            _table(
                ["TRANSACTIONAL ID", "STATE", "PRODUCER ID", "EPOCH", "PARTITIONS", "AGE", "DECISION", "ACTION"],
                [
                    [
                        r["transactional_id"],
                        r["state"],
                        str(r["producer_id"]),
                        str(r["producer_epoch"]),
                        _partitions(r["partitions"]),
                        _duration(r["age_ms"]),
                        _decision_cell(r),
                        "wait (broker completing)" if r["action"] == "wait" else r["action"],
                    ]
                    for r in rows
                ],
            )
        )


def _decision_cell(row: Mapping[str, Any]) -> str:
    if row["decision"] is not None:
        return str(row["decision"])
    latest = row["latest_record"]
    if latest is None:
        return "none"
    return f"none (log: {latest['decision']} for producer {latest['producer_id']} epoch {latest['producer_epoch']})"


# -- describe -------------------------------------------------------------------------------


def cmd_describe(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    snapshot, exists = _snapshot(conn)
    records = sorted(
        (r for tid, r in snapshot.latest.items() if naming.belongs_to(tid, args.prefix)),
        key=lambda r: _id_order(r.transactional_id),
    )
    owner = snapshot.claims.get(args.prefix)
    runs = sorted((m for (p, _), m in snapshot.runs.items() if p == args.prefix), key=lambda m: m.at_ms)
    if args.json:
        body: dict[str, Any] = {"claim_owner": owner, "records": [_record_json(r) for r in records]}
        body["committed_runs"] = [
            {
                "run": m.run,
                "time": _iso(m.at_ms),
                "at_ms": m.at_ms,
                "transactions": m.transactions,
                "records": m.records,
            }
            for m in runs
        ]
        _print_json(out, _header(args, exists) | body)
        return EXIT_OK
    out.write(f"prefix {args.prefix}: {'claimed by ' + owner if owner else 'not claimed'}\n")
    if not exists:
        out.write(f"decision topic {args.decision_topic} does not exist: no decisions\n")
        return EXIT_OK
    out.write(f"{len(records)} transactional id(s) in decision log {args.decision_topic}\n")
    if records:
        out.write(
            _table(
                ["TRANSACTIONAL ID", "DECISION", "RUN", "PRODUCER ID", "EPOCH", "RECORDS", "TIME", "REASON"],
                [
                    [
                        r.transactional_id,
                        r.decision.value,
                        r.run,
                        str(r.producer_id),
                        str(r.producer_epoch),
                        str(r.records),
                        _iso(r.at_ms),
                        r.reason,
                    ]
                    for r in records
                ],
            )
        )
    if runs:  # the runs that reached their COMMIT decision; an export of them is never repeated
        out.write(f"{len(runs)} run(s) decided COMMIT:\n")
        out.write(
            _table(
                ["RUN", "TIME", "TRANSACTIONS", "RECORDS"],
                [[m.run, _iso(m.at_ms), str(m.transactions), str(m.records)] for m in runs],
            )
        )
    return EXIT_OK


# -- resolve --------------------------------------------------------------------------------


def cmd_resolve(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    wire = conn.wire()
    if args.dry_run:
        states = TransactionInspector(wire, args.timeout).describe_prefix(args.prefix)
        snapshot, exists = _snapshot(conn)
        rows, plan = _plan_rows(states, snapshot, _now_ms())
        if args.json:
            _print_json(out, _header(args, exists) | {"dry_run": True, "transactions": rows, "plan": _plan_json(plan)})
        else:
            out.write("dry run: nothing is changed\n")
            _print_open(out, args, rows, exists)
        return EXIT_OK if plan.empty else EXIT_OPEN

    if not conn.decision_topic_exists() and not args.allow_missing_decision_topic:
        # A mistyped topic name would otherwise abort transactions that have a COMMIT decision.
        raise UsageError(
            f"decision topic {args.decision_topic!r} does not exist, so every open transaction would be "
            "aborted; check --decision-topic, or pass --allow-missing-decision-topic"
        )
    passes = _recover_until_settled(wire, args, conn.decision_log())
    still_open = TransactionInspector(wire, args.timeout).list_prefix(args.prefix)
    report = _resolve_report(passes, still_open)
    if args.json:
        _print_json(out, _header(args, True) | {"dry_run": False} | report)
    else:
        _print_resolved(out, args, report)
    if report["lost"]:
        return EXIT_LOST
    return EXIT_OPEN if still_open else EXIT_OK


def _recover_until_settled(
    wire: WireClient, args: argparse.Namespace, decision_log: DecisionLog
) -> list[RecoveryResult]:
    """Recovery leaves Prepare* to the broker; look again until they are complete or --wait is up."""
    deadline = time.monotonic() + args.wait
    passes = [recover(wire, args.prefix, decision_log, run=args.run)]
    while not passes[-1].done and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        passes.append(recover(wire, args.prefix, decision_log, run=args.run))
    return passes


def _resolve_report(passes: Sequence[RecoveryResult], still_open: Sequence[TxnListing]) -> dict[str, Any]:
    intents: dict[str, str] = {}
    last: dict[str, Resolution] = {}  # a later pass may finish what an earlier one waited for
    settled: list[str] = []
    for p in passes:
        intents.update({r.transactional_id: "commit" for r in p.plan.commit})
        intents.update({r.transactional_id: "abort" for r in p.plan.abort})
        last.update({r.ref.transactional_id: r for r in p.resolutions})
        settled += [t for t in p.settled if t not in settled]
    resolutions = [
        {
            "transactional_id": r.ref.transactional_id,
            "producer_id": r.ref.producer_id,
            "producer_epoch": r.ref.producer_epoch,
            "action": intents[tid],
            "outcome": r.outcome.value,
            "observation": r.observation.value,
            "detail": r.detail,
            "end_txn_codes": list(r.end_txn_codes),
        }
        for tid, r in sorted(last.items(), key=lambda kv: _id_order(kv[0]))
    ]
    return {
        "plan": _plan_json(passes[0].plan),
        "passes": len(passes),
        "resolutions": resolutions,
        "settled": settled,
        "lost": [r["transactional_id"] for r in resolutions if r["outcome"] == Verdict.LOST.value],
        "still_open": [
            {"transactional_id": t.transactional_id, "state": t.state, "producer_id": t.producer_id}
            for t in sorted(still_open, key=lambda t: _id_order(t.transactional_id))
        ],
    }


def _print_resolved(out: TextIO, args: argparse.Namespace, report: Mapping[str, Any]) -> None:
    resolutions = report["resolutions"]
    counts = {v.value: sum(1 for r in resolutions if r["outcome"] == v.value) for v in _FINAL}
    out.write(
        f"prefix {args.prefix}: "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + f"; {len(report['still_open'])} still open\n"
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
    if report["settled"]:
        out.write(f"recorded COMMITTED for decided, already committed: {', '.join(report['settled'])}\n")
    for t in report["still_open"]:
        out.write(f"still open: {t['transactional_id']} ({t['state']})\n")
    if report["lost"]:
        out.write(f"LOST (had a COMMIT decision, can no longer commit): {', '.join(report['lost'])}\n")


_FINAL = (Verdict.COMMITTED, Verdict.ABORTED, Verdict.LOST)


# -- output helpers -------------------------------------------------------------------------


def _header(args: argparse.Namespace, decision_topic_exists: bool) -> dict[str, Any]:
    return {
        "prefix": args.prefix,
        "decision_topic": args.decision_topic,
        "decision_topic_exists": decision_topic_exists,
    }


def _plan_json(plan: RecoveryPlan) -> dict[str, list[str]]:
    return {
        "commit": [r.transactional_id for r in plan.commit],
        "abort": [r.transactional_id for r in plan.abort],
        "wait": list(plan.wait),
    }


def _record_json(r: DecisionRecord) -> dict[str, Any]:
    return {
        "transactional_id": r.transactional_id,
        "decision": r.decision.value,
        "run": r.run,
        "producer_id": r.producer_id,
        "producer_epoch": r.producer_epoch,
        "records": r.records,
        "reason": r.reason,
        "at_ms": r.at_ms,
        "time": _iso(r.at_ms),
    }


def _print_json(out: TextIO, obj: Mapping[str, Any]) -> None:
    out.write(json.dumps(obj, indent=2) + "\n")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines) + "\n"


def _id_order(tid: str) -> tuple[str, int, str]:
    """Slot 10 after slot 9, not after slot 1."""
    parsed = naming.parse_transactional_id(tid)
    return (parsed.run_key or "", parsed.slot, tid) if parsed is not None else ("", -1, tid)


def _partitions(parts: Iterable[Mapping[str, Any]]) -> str:
    by_topic: dict[str, list[int]] = {}
    for p in parts:
        by_topic.setdefault(str(p["topic"]), []).append(int(p["partition"]))
    return " ".join(f"{t}[{','.join(map(str, sorted(ps)))}]" for t, ps in sorted(by_topic.items())) or "-"


def _duration(ms: int | None) -> str:
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


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- secrets, logging, errors ---------------------------------------------------------------


def _secret_values(config: Mapping[str, Any]) -> list[str]:
    hidden = redact(config)
    return sorted({str(config[k]) for k in config if hidden[k] != config[k] and str(config[k])}, key=len, reverse=True)


def scrub(text: str, config: Mapping[str, Any]) -> str:
    """Whatever reaches the terminal passes here: a library may quote a setting in an error."""
    for secret in _secret_values(config):
        text = text.replace(secret, "***")
    return text


class _ScrubFilter(logging.Filter):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = config

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage(), self.config), None
        if record.exc_info:
            record.exc_text = scrub("".join(traceback.format_exception(*record.exc_info)), self.config)
            record.exc_info = None
        return True


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler main() installed, so a second main() in one process replaces it."""


def _setup_logging(debug: bool, config: Mapping[str, Any]) -> None:
    handler = _CliHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kafka2pc: %(levelname)s: %(name)s: %(message)s"))
    handler.addFilter(_ScrubFilter(config))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _CliHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("airflow_provider_kafka2pc").setLevel(logging.DEBUG if debug else logging.WARNING)
    # kafka-python reports every failed connect attempt, and at DEBUG it logs request bodies,
    # SASL ones included: never below INFO, and silent unless --debug (we report failures).
    for noisy in ("kafka", _LIBRDKAFKA_LOGGER):
        logging.getLogger(noisy).setLevel(logging.INFO if debug else logging.CRITICAL)


def _fail(code: int, message: str, config: Mapping[str, Any]) -> int:
    sys.stderr.write(f"kafka2pc: error: {scrub(message, config)}\n")
    return code


def main(argv: Sequence[str] | None = None, connect: Connect = Connection) -> int:
    args = build_parser().parse_args(argv)
    config: dict[str, str] = {}
    try:
        config = client_config(args)
        _setup_logging(args.debug, config)
        naming.validate_prefix(args.prefix)
        conn = connect(config, args.decision_topic, args.timeout)
        try:
            handler: Callable[[Connection, argparse.Namespace, TextIO], int] = args.handler
            return handler(conn, args, sys.stdout)
        finally:
            conn.close()
    except (UsageError, InvalidPrefixError) as e:
        return _fail(EXIT_USAGE, str(e), config)
    except KeyboardInterrupt:
        return _fail(130, "interrupted", config)
    except Exception as e:
        if args.debug:
            sys.stderr.write(scrub("".join(traceback.format_exception(e)), config))
        if isinstance(e, Kafka2PCError):  # ours: the message is written for the operator
            return _fail(EXIT_FAILED, str(e), config)
        hint = "" if args.debug else " (--debug shows the traceback)"
        return _fail(EXIT_FAILED, f"{type(e).__name__}: {e}{hint}", config)


if __name__ == "__main__":
    sys.exit(main())
