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
    kafka2pc repair --prefix P --run R --source MODULE:NAME [--topic T] [--value-format MODULE:NAME ...]
                                      export the LOST run R's lost Spark partitions again from the
                                      source, prove them the same records, commit them: REPAIRED

Exit status: 0 nothing of the prefix is open and nothing is lost (acknowledge: done); 1 transactions
of the prefix are open (list, resolve --dry-run: something to do; resolve: still open after
--wait); 2 bad usage, an invalid prefix, a missing or mistaken --conn-id, or acknowledge or repair
of a run that is not LOST; 3 Kafka unreachable or failing; 4 a loss: a run of the prefix is LOST and not
acknowledged, or a COMMIT decision in force has transactions that can never become visible, or a
repair was refused and the run stays LOST (takes precedence over 1).

Only the transaction core is imported: no Airflow, and Kafka clients only when a command runs.
``--conn-id`` takes the settings from an Airflow connection instead, found where ``airflow
connections get`` finds it and mapped by the tasks' own hook (imported only then, so it needs
Airflow installed).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from airflow_provider_kafka2pc.cli import render
from airflow_provider_kafka2pc.cli.arguments import (
    ACTOR,
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_OPEN,
    EXIT_SOURCE_BEHIND,
    EXIT_USAGE,
    UsageError,
    parse_args,
)
from airflow_provider_kafka2pc.cli.client_settings import client_config
from airflow_provider_kafka2pc.cli.log_setup import scrub, setup_logging
from airflow_provider_kafka2pc.cli.repair_command import cmd_repair
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients as Connection
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
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
    RepairRefusedError,
)
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef, Verdict
from airflow_provider_kafka2pc.txn.two_phase import survey
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult, acknowledge_loss, recover
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution

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
    report |= survey.source_report(conn.config, state, args.prefix)
    return report, _exit_status(report, EXIT_OPEN if report["transactions"] else EXIT_OK)


def _exit_status(report: Mapping[str, Any], otherwise: int) -> int:
    """A loss first, then a source group left behind by a visible run, then ``otherwise``."""
    if report["losses"]:
        return EXIT_LOST
    return EXIT_SOURCE_BEHIND if report.get("source_behind") else otherwise


# -- list -----------------------------------------------------------------------------------


def cmd_list(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    report, code = _survey(conn, args)
    if args.json:
        render.print_json(out, report)
    else:
        render.open_transactions(out, report)
        render.losses(out, report)
        render.source_behind(out, report)
    return code


# -- describe -------------------------------------------------------------------------------


def cmd_describe(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    prefix = args.prefix
    # Every run record of the prefix, the COMMITTED ones too: describe is where they are looked up.
    state, exists = _read(conn, lambda log: log.read(keep_run=lambda p, _r, _raw: p == prefix))
    inspector = TransactionInspector(conn.wire(), args.timeout)
    report = _header(args, exists) | survey.describe_report(inspector, state, prefix)
    report |= survey.source_report(conn.config, state, prefix)
    if args.json:
        render.print_json(out, report)
    else:
        render.decisions_and_runs(out, report)
        render.losses(out, report)
        render.source_behind(out, report)
    return _exit_status(report, EXIT_OK)


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
            render.source_behind(out, report)
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
        # Open, undecided, of a repair whose lease is live: left to it (it commits or aborts them).
        "left_to_repair": [{"transactional_id": tid, "run": run} for tid, run in passes[-1].left_to_repair],
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


_POLL_S = 0.5  # how often resolve --wait asks again

Connect = Callable[[Mapping[str, Any], str, float], Connection]
Command = Callable[[Connection, argparse.Namespace, TextIO], int]
COMMANDS: dict[str, Command] = {
    "list": cmd_list,
    "describe": cmd_describe,
    "resolve": cmd_resolve,
    "acknowledge": cmd_acknowledge,
    "repair": cmd_repair,
}


def main(argv: Sequence[str] | None = None, connect: Connect = Connection) -> int:
    args = parse_args(argv)
    config: dict[str, Any] = {}
    try:
        naming.validate_prefix(args.prefix)
        config, args.decision_topic, connect_timeout_s = client_config(args)  # the commands print the topic
        if args.timeout is None:  # as the Test button and the tasks wait for this connection
            args.timeout = connect_timeout_s
        setup_logging(args.debug, config)
        conn = connect(config, args.decision_topic, args.timeout)
        try:
            conn.check()
            return COMMANDS[args.command](conn, args, sys.stdout)
        finally:
            conn.close()
    except (UsageError, InvalidPrefixError, ClientConfigError) as e:  # a mistake of ours to fix, not Kafka's
        return _fail(EXIT_USAGE, str(e), config)
    except KeyboardInterrupt:
        return _fail(130, "interrupted", config)
    except Exception as e:
        if args.debug:
            sys.stderr.write(scrub("".join(traceback.format_exception(e)), config))
        if isinstance(e, RepairRefusedError):  # the run stays LOST: a loss, as list says
            return _fail(EXIT_LOST, str(e), config)
        if isinstance(e, Kafka2PCError):  # ours: the message is written for the operator
            return _fail(EXIT_FAILED, str(e), config)
        hint = "" if args.debug else " (--debug shows the traceback)"
        return _fail(EXIT_FAILED, f"{type(e).__name__}: {e}{hint}", config)


if __name__ == "__main__":
    sys.exit(main())
