"""The ``kafka2pc`` command line: its commands and options, the common ones accepted before and after
the command, defined once, and the exit codes and defaults they document."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from airflow_provider_kafka2pc import __version__
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S

EXIT_OK = 0
EXIT_OPEN = 1
EXIT_USAGE = 2  # what argparse uses too; also a missing or mistaken --conn-id
EXIT_FAILED = 3
EXIT_LOST = 4
EXIT_SOURCE_BEHIND = 5  # a committed run's output is visible, its source group did not move with it

ENV_BOOTSTRAP = "KAFKA2PC_BOOTSTRAP_SERVERS"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_WAIT_S = 10.0
DEFAULT_RUN = "kafka2pc-cli"
ACTOR = "cli"  # who the decisions this command appends name


class UsageError(Exception):
    """Bad input found after argument parsing; exits with EXIT_USAGE."""


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

    def add_repeatable(flag: str, metavar: str, help_text: str) -> None:
        dest = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(
            flag,
            action="append",
            dest=dest + _AFTER_COMMAND if after_command else dest,
            default=default([]),
            metavar=metavar,
            help=help_text,
        )

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
    add_repeatable(
        "--config", "KEY=VALUE", "a librdkafka setting such as security.protocol or sasl.mechanism (repeatable)"
    )
    add_repeatable(
        "--config-file",
        "PATH",
        "KEY=VALUE lines, read before --config; keeps secrets such as sasl.password off the command line",
    )
    parser.add_argument(
        "--decision-topic",
        default=default(None),
        help=f"the decision log topic (default: the connection's, else {DEFAULT_DECISION_TOPIC})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=default(None),
        metavar="SECONDS",
        help="connect and request timeout (default: the connection's connect timeout with --conn-id, "
        f"else {DEFAULT_CONNECT_TIMEOUT_S:g})",
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
            "Exit status: 0 nothing open and nothing lost (repair: REPAIRED), 1 transactions open, 2 bad usage "
            "(or acknowledge or repair of a run that is not LOST), 3 Kafka failing (or a repair's "
            "announcement), 4 a loss (a LOST run, lost "
            "transactions under a COMMIT, a repair refused)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kafka2pc {__version__}")
    _add_common_options(parser, after_command=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "list", parents=[common], help="open transactions of a prefix, what recovery would do, and the prefix's losses"
    )

    p = sub.add_parser(
        "describe", parents=[common], help="decisions touching a prefix (in force and void) and its run records"
    )

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

    p = sub.add_parser(
        "acknowledge",
        parents=[common],
        help="acknowledge a LOST run so that recovery stops failing on it (the lost records stay lost)",
    )
    p.add_argument("--run", required=True, help="the run whose loss to acknowledge, as its run record names it")
    p.add_argument("--note", default="", metavar="TEXT", help="why, by whom: kept on the run record")

    p = sub.add_parser(
        "repair",
        parents=[common],
        help="export a LOST run's lost Spark partitions again, prove them the same records, commit them",
    )
    p.add_argument("--run", required=True, help="the LOST run to repair, as its run record names it")
    p.add_argument(
        "--source",
        required=True,
        metavar="MODULE:NAME",
        help="the run's frame: a callable (spark) -> DataFrame, or the KafkaSource the export read",
    )
    p.add_argument("--topic", default=None, help="the export's default topic, for a frame without a topic column")
    p.add_argument("--spark-master", default="local[*]", metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    p.add_argument("--writer", default="auto", choices=("auto", "native", "python"), help="as the export's writer")
    for role in ("key", "value"):
        p.add_argument(
            f"--{role}-format",
            default=None,
            metavar="MODULE:NAME",
            help=f"the export's {role}_format (an AvroFormat or JsonSchemaFormat object), for a run framed for a "
            "schema registry",
        )
    p.add_argument(
        "--schema-registry-conn-id",
        default=None,
        metavar="ID",
        help="the formats' registry: the kafka2pc_schema_registry Airflow connection the export used",
    )
    p.add_argument("--schema-registry-url", default=None, metavar="URL", help="or the registry's URL")
    p.add_argument(
        "--schema-registry-config-file",
        default=None,
        metavar="PATH",
        help="the URL's credentials, one KEY=VALUE a line: basic.auth.user.info=USER:PASSWORD or "
        "bearer.auth.token=TOKEN; ssl.ca.location=PATH, timeout=SECONDS",
    )
    p.add_argument(
        "--airflow-api-url",
        default=None,
        metavar="URL",
        help="announce the repair to this Airflow: an asset event per restored topic, as a commit emits",
    )
    p.add_argument(
        "--airflow-api-token-file", default=None, metavar="PATH", help="a file holding the API's JWT (never argv)"
    )
    p.add_argument(
        "--openlineage",
        action="store_true",
        help="announce the repair in an OpenLineage event (the client as OPENLINEAGE_URL or openlineage.yml set it)",
    )
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
