"""``kafka2pc``: look at and resolve one exporter's transactions from a shell, without Airflow.

    kafka2pc list --prefix P          open transactions of P on the broker, each joined with the
                                      decision that rules it and the action recovery would take;
                                      and P's losses: LOST runs, COMMIT decisions with lost outcomes
    kafka2pc describe --prefix P      decisions in force and void ones touching P, and P's run records
    kafka2pc resolve --prefix P       run recovery: roll forward what a COMMIT rules, abort the rest
                                      (--dry-run: print the plan, change nothing)
    kafka2pc acknowledge --prefix P --run R [--note TEXT]
                                      mark the LOST run R of P as ACKNOWLEDGED: recovery stops
                                      failing on it (its lost records stay lost)

Exit status: 0 nothing of the prefix is open and nothing is lost (acknowledge: done); 1 transactions
of the prefix are open (list, resolve --dry-run: something to do; resolve: still open after
--wait); 2 bad usage, an invalid prefix, a missing or mistaken --conn-id, or acknowledge of a run
that is not LOST; 3 Kafka unreachable or failing; 4 a loss: a run of the prefix is LOST and not
acknowledged, or a COMMIT decision in force has transactions that can never become visible (takes
precedence over 1).

Only the transaction core is imported: no Airflow, and Kafka clients only when a command runs.
``--conn-id`` takes the settings from an Airflow connection instead, found where ``airflow
connections get`` finds it and mapped by the tasks' own hook (imported only then, so it needs
Airflow installed).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from airflow_provider_kafka2pc import __version__
from airflow_provider_kafka2pc.cli import render
from airflow_provider_kafka2pc.cli.log_setup import scrub, setup_logging
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients as Connection
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.errors import ClientConfigError
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnListing, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
from airflow_provider_kafka2pc.txn.protocol.errors import (
    InvalidPrefixError,
    Kafka2PCError,
    LostTransaction,
    NotLostError,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef, Verdict
from airflow_provider_kafka2pc.txn.two_phase import survey
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult, acknowledge_loss, recover
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution

EXIT_OK = 0
EXIT_OPEN = 1
EXIT_USAGE = 2  # what argparse uses too; also a missing or mistaken --conn-id
EXIT_FAILED = 3
EXIT_LOST = 4

ENV_BOOTSTRAP = "KAFKA2PC_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WAIT_S = 10.0
DEFAULT_RUN = "kafka2pc-cli"
ACTOR = "cli"  # who the decisions this command appends name
_POLL_S = 0.5


class UsageError(Exception):
    """Bad input found after argument parsing; exits with EXIT_USAGE."""


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


# The dest of a repeatable common option given after the command; parse_args appends it.
_AFTER_COMMAND = "_after_command"


def _add_common_options(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """The options every command takes, before or after its name (``kafka2pc --debug list`` and
    ``kafka2pc list --debug``): one definition, added to the top parser and to each command's.

    After the command they have no defaults: argparse copies all that a command's parser holds over
    what was parsed before the command, so a default there would reset ``--debug`` given before it.
    A repeatable option given after the command has its own dest, appended by ``parse_args``."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if after_command else value

    def repeatable(dest: str) -> str:
        return dest + _AFTER_COMMAND if after_command else dest

    # Required, but checked by parse_args: argparse checks it per parser, and it may come before the command.
    parser.add_argument("--prefix", default=default(None), help="the exporter's transactional id prefix (required)")
    parser.add_argument(
        "--conn-id",
        metavar="CONN_ID",
        default=default(None),
        help="an Airflow connection (kafka2pc or kafka) to take the client settings and decision topic from, "
        "looked up as `airflow connections get` does; needs Airflow installed",
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=default(None),
        help=f"Kafka bootstrap servers, without --conn-id (default: ${ENV_BOOTSTRAP}, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--config",
        action="append",
        dest=repeatable("config"),
        default=default([]),
        metavar="KEY=VALUE",
        help="a librdkafka setting such as security.protocol or sasl.mechanism (repeatable)",
    )
    parser.add_argument(
        "--config-file",
        action="append",
        dest=repeatable("config_file"),
        default=default([]),
        metavar="PATH",
        help="KEY=VALUE lines, read before --config; keeps secrets such as sasl.password off the command line",
    )
    parser.add_argument(
        "--decision-topic",
        default=default(None),
        help=f"the decision log topic (default: the connection's, else {DEFAULT_DECISION_TOPIC})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=default(DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"connection and request timeout (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="machine-readable output")
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="log more and show tracebacks (secrets stay hidden)",
    )


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_common_options(common, after_command=True)

    parser = argparse.ArgumentParser(
        prog="kafka2pc",
        description="Inspect and resolve the Kafka transactions of a kafka2pc exporter.",
        epilog=(
            "Exit status: 0 nothing open and nothing lost, 1 transactions open, 2 bad usage (or acknowledge of "
            "a run that is not LOST), 3 Kafka failing, 4 a loss (a LOST run, or lost transactions under a COMMIT)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kafka2pc {__version__}")
    _add_common_options(parser, after_command=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "list", parents=[common], help="open transactions of a prefix, what recovery would do, and the prefix's losses"
    )
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser(
        "describe", parents=[common], help="decisions touching a prefix (in force and void) and its run records"
    )
    p.set_defaults(handler=cmd_describe)

    p = sub.add_parser("resolve", parents=[common], help="roll forward what a COMMIT rules, abort the rest")
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

    p = sub.add_parser(
        "acknowledge",
        parents=[common],
        help="acknowledge a LOST run so that recovery stops failing on it (the lost records stay lost)",
    )
    p.add_argument("--run", required=True, help="the run whose loss to acknowledge, as its run record names it")
    p.add_argument("--note", default="", metavar="TEXT", help="why, by whom: kept on the run record")
    p.set_defaults(handler=cmd_acknowledge)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the common options given before and after the command merged: after
    wins, and repeatable ones add up (before first)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for key in [k for k in vars(args) if k.endswith(_AFTER_COMMAND)]:
        base = key.removesuffix(_AFTER_COMMAND)
        setattr(args, base, [*getattr(args, base), *vars(args).pop(key)])
    if args.prefix is None:
        parser.error(f"{args.command}: the following arguments are required: --prefix")
    return args


def client_config(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The client settings and decision topic: an Airflow connection's or the options', then --config."""
    config: dict[str, Any]
    if args.conn_id:
        if args.bootstrap_servers is not None:
            raise UsageError("give either --conn-id or --bootstrap-servers, not both")
        config, decision_topic = airflow_connection(args.conn_id)
    else:
        config = {"bootstrap.servers": str(args.bootstrap_servers or os.environ.get(ENV_BOOTSTRAP, DEFAULT_BOOTSTRAP))}
        decision_topic = DEFAULT_DECISION_TOPIC
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
            raise UsageError(f"{where}: set bootstrap.servers with --bootstrap-servers or the connection")
        config[key] = value
    return config, args.decision_topic or decision_topic


def airflow_connection(conn_id: str) -> tuple[dict[str, Any], str]:
    """An Airflow connection's client settings and decision topic, mapped by the tasks' own hook.

    Found where ``airflow connections get`` finds it (``_find_airflow_connection``). Imported here,
    not at the top: the CLI runs without Airflow, and only --conn-id needs it.
    """
    try:
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCConfigError, Kafka2PCHook
    except ImportError as e:
        raise UsageError(
            f"--conn-id needs Apache Airflow installed ({e}); give --bootstrap-servers and --config instead"
        ) from None
    try:
        hook = Kafka2PCHook(conn_id, connection=_find_airflow_connection(conn_id))
        return hook.get_config(), hook.decision_topic
    except AirflowNotFoundException:
        raise UsageError(f"no Airflow connection {conn_id!r}: {_looked_in(conn_id)}") from None
    except Kafka2PCConfigError as e:
        raise UsageError(f"connection {conn_id!r}: {e}") from None


def _find_airflow_connection(conn_id: str) -> Any:
    """The connection as ``airflow connections get`` finds it: the AIRFLOW_CONN_<ID> variable, the
    configured secrets backend, and, where Airflow is configured in this shell, its metadata
    database (``Connection.get_connection_from_secrets``, the call that command makes). Elsewhere the
    Task SDK's lookup, without the database: Airflow would otherwise read, and SQLite create, a
    database in its default home. Raises ``AirflowNotFoundException``. Either Connection class has
    the fields the hook reads, hence ``Any``."""
    from airflow.sdk import Connection

    if _airflow_home() is None or _airflow_core() is None:
        return Connection.get(conn_id)
    from airflow.models.connection import Connection as StoredConnection

    return StoredConnection.get_connection_from_secrets(conn_id)


def _airflow_home() -> str | None:
    """Where Airflow is configured in this shell: $AIRFLOW_HOME, or its default ~/airflow when that
    holds an airflow.cfg or the database is set in the environment; None when it is not."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    database_set = any(k.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") for k in os.environ)
    if os.environ.get("AIRFLOW_HOME") or database_set or os.path.isfile(os.path.join(home, "airflow.cfg")):
        return home
    return None


def _airflow_core() -> str | None:
    """apache-airflow-core's version where it is installed (the metadata database needs it; a worker
    may have only the Task SDK)."""
    from importlib import metadata

    try:
        return metadata.version("apache-airflow-core")
    except metadata.PackageNotFoundError:
        return None


def _looked_in(conn_id: str) -> str:
    """Where ``_find_airflow_connection`` looked, and why not in a database: the not-found message."""
    from airflow.sdk import conf

    backend = str(conf.get("secrets", "backend", fallback="") or "")
    places = [f"the environment variable AIRFLOW_CONN_{conn_id.upper()}"]
    if backend:
        places.append(f"the secrets backend {backend}")
    none = "" if backend else " (no secrets backend is configured)"
    home = _airflow_home()
    if home is not None and _airflow_core() is not None:
        places.append(f"the metadata database of AIRFLOW_HOME={home}")
        return f"looked where `airflow connections get {conn_id}` looks: {', '.join(places)}{none}"
    if home is None:
        why = "Airflow is not configured in this shell (set AIRFLOW_HOME to the home whose database holds it)"
    else:
        why = f"apache-airflow-core, which reads the metadata database of AIRFLOW_HOME={home}, is not installed"
    return f"looked in {' and '.join(places)}{none}; not in a metadata database: {why}"


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


# -- reading what there is -------------------------------------------------------------------


def _read(conn: Connection, read: Callable[[DecisionLog], LogState]) -> tuple[LogState, bool]:
    """The decision log without creating its topic: read-only commands must change nothing. A topic
    this principal may not see raises (``KafkaAuthorizationError``): never "no decisions"."""
    if not conn.decision_topic_exists():
        return LogState(), False
    return read(conn.decision_log()), True


def _survey(conn: Connection, args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """What ``list`` and ``resolve --dry-run`` report, and the exit status."""
    inspector = TransactionInspector(conn.wire(), args.timeout)  # first: the fastest way to find a broker down
    states = inspector.describe_prefix(args.prefix)
    state, exists = _read(conn, lambda log: log.read_for(args.prefix))
    report = _header(args, exists) | survey.exporter_report(inspector, states, state, args.prefix)
    if report["losses"]:
        return report, EXIT_LOST
    return report, EXIT_OK if not report["transactions"] else EXIT_OPEN


# -- list -----------------------------------------------------------------------------------


def cmd_list(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    report, code = _survey(conn, args)
    if args.json:
        render.print_json(out, report)
    else:
        render.open_transactions(out, report)
        render.losses(out, report)
    return code


# -- describe -------------------------------------------------------------------------------


def cmd_describe(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    prefix = args.prefix
    # Every run record of the prefix, the COMMITTED ones too: describe is where they are looked up.
    state, exists = _read(conn, lambda log: log.read(keep_run=lambda p, _r, _raw: p == prefix))
    inspector = TransactionInspector(conn.wire(), args.timeout)
    report = _header(args, exists) | survey.describe_report(inspector, state, prefix)
    if args.json:
        render.print_json(out, report)
    else:
        render.decisions_and_runs(out, report)
        render.losses(out, report)
    return EXIT_LOST if report["losses"] else EXIT_OK


# -- resolve --------------------------------------------------------------------------------


def cmd_resolve(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    if args.dry_run:
        report, code = _survey(conn, args)
        if args.json:
            render.print_json(out, report | {"dry_run": True})
        else:
            out.write("dry run: nothing is changed\n")
            render.open_transactions(out, report)
            render.losses(out, report)
        return code

    wire = conn.wire()
    if not conn.decision_topic_exists() and not args.allow_missing_decision_topic:
        # A mistyped topic name would otherwise abort transactions that have a COMMIT decision.
        raise UsageError(
            f"decision topic {args.decision_topic!r} does not exist, so every open transaction would be "
            "aborted; check --decision-topic, or pass --allow-missing-decision-topic"
        )
    decision_log = conn.decision_log()
    passes = _recover_until_settled(wire, args, decision_log)
    still_open = TransactionInspector(wire, args.timeout).list_prefix(args.prefix)
    report = _header(args, True) | {"dry_run": False} | _resolve_report(passes, still_open)
    # How much of each run with a loss is visible, and which runs to acknowledge.
    if report["lost"]:
        report |= survey.losses_report(
            TransactionInspector(wire, args.timeout), decision_log.read_for(args.prefix), args.prefix
        )
    else:
        report |= {"losses": [], "lost_runs": [], "lost_decisions": []}
    if args.json:
        render.print_json(out, report)
    else:
        render.resolved(out, report)
    if report["lost"]:
        return EXIT_LOST
    return EXIT_OPEN if still_open else EXIT_OK


def _recover_until_settled(
    wire: WireClient, args: argparse.Namespace, decision_log: DecisionLog
) -> list[RecoveryResult]:
    """Recovery leaves Prepare* to the broker; look again until they are complete or --wait is up.

    A loss does not end by waiting: it is reported at once (the broker finishes Prepare* anyway).
    """

    def once() -> RecoveryResult:
        return recover(wire, args.prefix, decision_log, run=args.run, actor=ACTOR, raise_on_loss=False)

    deadline = time.monotonic() + args.wait
    passes = [once()]
    while passes[-1].plan.wait and not passes[-1].lost and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        passes.append(once())
    return passes


def _resolve_report(passes: Sequence[RecoveryResult], still_open: Sequence[TxnListing]) -> dict[str, Any]:
    # By (id, producer id, epoch), not by id: one id may end twice in a pass, e.g. its open epoch
    # aborted and a COMMIT for another epoch of it found lost.
    intents: dict[TxnRef, str] = {}
    last: dict[TxnRef, Resolution] = {}  # a later pass may finish what an earlier one waited for
    lost: dict[TxnRef, LostTransaction] = {}
    for p in passes:
        intents.update({r: survey.ACTIONS["commit"] for r in p.plan.commit})
        intents.update({r: survey.ACTIONS["abort"] for r in p.plan.abort})
        last.update({r.ref: r for r in p.resolutions})
        lost.update({TxnRef(t.transactional_id, t.producer_id, t.producer_epoch): t for t in p.lost})
    resolutions = [
        {
            "transactional_id": r.ref.transactional_id,
            "producer_id": r.ref.producer_id,
            "producer_epoch": r.ref.producer_epoch,
            "action": _action(intents.get(r.ref), r.outcome),
            "outcome": r.outcome.value,
            "observation": r.observation.value,
            "detail": r.detail,
            "end_txn_codes": list(r.end_txn_codes),
        }
        for _, r in sorted(last.items(), key=lambda kv: survey.ref_order(kv[0]))
    ]
    return {
        "plan": survey.plan_json(passes[0].plan),
        "passes": len(passes),
        "resolutions": resolutions,
        "lost": [
            survey.lost_json(
                t.transactional_id, t.producer_id, t.producer_epoch, t.records, t.topic_partitions, t.reason
            )
            for _, t in sorted(lost.items(), key=lambda kv: survey.ref_order(kv[0]))
        ],
        "still_open": [
            {"transactional_id": t.transactional_id, "state": t.state, "producer_id": t.producer_id}
            for t in sorted(still_open, key=lambda t: survey.id_order(t.transactional_id))
        ],
    }


def _action(intent: str | None, outcome: Verdict) -> str:
    """What was done, never contradicting the outcome: an abort that found the transaction committed
    (committed data cannot be taken back) did nothing. ``intent`` is None for what was not open when
    listed (a decision finished by this call): its outcome shows the action."""
    if outcome is Verdict.COMMITTED and intent == survey.ACTIONS["abort"]:
        return "none (already committed)"
    if outcome is Verdict.ABORTED:
        return survey.ACTIONS["abort"]
    return intent or survey.ACTIONS["commit"]


# -- acknowledge ----------------------------------------------------------------------------


def cmd_acknowledge(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    prefix, run = args.prefix, args.run
    if not conn.decision_topic_exists():
        raise UsageError(
            f"decision topic {args.decision_topic!r} does not exist: run {run!r} of {prefix!r} has no record"
        )
    try:
        rec, acked, position = acknowledge_loss(conn.decision_log(), prefix, run, args.note)
    except NotLostError as e:
        raise UsageError(str(e)) from None
    lost_records = sum(t.covered.records for t in acked.lost)
    if args.json:
        body = {"previous_status": rec.status.value, "offset": position} | survey.run_json(acked)
        render.print_json(out, _header(args, True) | body)
    else:
        out.write(
            f"run {run} of {prefix}: LOST acknowledged ({len(acked.lost)} lost transaction(s), {lost_records} "
            f"record(s) that stay lost); recovery no longer fails on it\n"
        )
    return EXIT_OK


# -- output helpers -------------------------------------------------------------------------


def _header(args: argparse.Namespace, decision_topic_exists: bool) -> dict[str, Any]:
    return {
        "prefix": args.prefix,
        "decision_topic": args.decision_topic,
        "decision_topic_exists": decision_topic_exists,
    }


# -- secrets, logging, errors ---------------------------------------------------------------


def _fail(code: int, message: str, config: Mapping[str, Any]) -> int:
    sys.stderr.write(f"kafka2pc: error: {scrub(message, config)}\n")
    return code


def main(argv: Sequence[str] | None = None, connect: Connect = Connection) -> int:
    args = parse_args(argv)
    config: dict[str, Any] = {}
    try:
        naming.validate_prefix(args.prefix)
        config, args.decision_topic = client_config(args)  # the commands print the topic they read
        setup_logging(args.debug, config)
        conn = connect(config, args.decision_topic, args.timeout)
        try:
            conn.check()
            handler: Callable[[Connection, argparse.Namespace, TextIO], int] = args.handler
            return handler(conn, args, sys.stdout)
        finally:
            conn.close()
    except (UsageError, InvalidPrefixError, ClientConfigError) as e:  # a mistake of ours to fix, not Kafka's
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
