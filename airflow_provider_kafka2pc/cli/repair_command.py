"""``kafka2pc repair``: finish a run that lost transactions after its COMMIT, from a shell (DESIGN §6).

The CLI cannot know how the run's frame was built, so ``--source module:name`` names it, importable
where the command runs: a callable ``(spark) -> DataFrame`` giving the frame the export wrote, or
the ``KafkaSource`` the export read (the run's stored range is read again; its transform is called
with no Airflow context). Spark starts here, at ``--spark-master`` (``local[*]`` by default) with
``--spark-conf``; the lost Spark partitions are exported again, compared with what the run lost,
and committed by the transaction core (``txn/two_phase/repair.py``). A run exported with registry
formats is framed again with ``--key-format``/``--value-format`` (the export's objects, named the
same way) for the registry ``cli/registry_settings.py`` finds. Spark and the source are imported
only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, Any, TextIO

from airflow_provider_kafka2pc.cli import render
from airflow_provider_kafka2pc.cli.arguments import ACTOR, EXIT_FAILED, EXIT_LOST, EXIT_OK, UsageError
from airflow_provider_kafka2pc.cli.registry_settings import record_formats
from airflow_provider_kafka2pc.cli.repair_announcement import announce, check_announcement_args
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
from airflow_provider_kafka2pc.txn.protocol.errors import NotLostError
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase import survey
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.repair import abort_attempts, repair_lost_run
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.registry.formats import RegistryFormat

# The repair commits right after its write job, in this process: no scheduler hand-over to allow for.
_HANDOVER_MS = 2_000


def load_named(spec: str, option: str) -> Any:
    """The object ``module:name`` names; a UsageError saying what is wrong otherwise."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"{option} {spec!r}: give module:name, e.g. my_dags.orders:orders_frame")
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"{option} {spec!r} cannot be loaded ({type(e).__name__}: {e})") from None
    return found


def load_source(spec: str) -> Any:
    found = load_named(spec, "--source")
    if not callable(found) and not hasattr(found, "dataframe"):
        raise UsageError(f"--source {spec!r} is neither a callable (spark) -> DataFrame nor a KafkaSource")
    return found


def load_format(spec: str | None, option: str) -> RegistryFormat | None:
    from airflow_provider_kafka2pc.registry.formats import RegistryFormat

    if spec is None:
        return None
    found = load_named(spec, option)
    if not isinstance(found, RegistryFormat):
        raise UsageError(f"{option} {spec!r} is a {type(found).__name__}, not an AvroFormat or JsonSchemaFormat")
    return found


def cmd_repair(conn: KafkaClients, args: argparse.Namespace, out: TextIO) -> int:
    from airflow_provider_kafka2pc.spark.repair_export import repair_exporter
    from airflow_provider_kafka2pc.spark.session_builder import build_session, spark_conf
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    if not conn.decision_topic_exists():
        raise UsageError(f"decision topic {args.decision_topic!r} does not exist: run {args.run!r} has no record")
    airflow_api = check_announcement_args(args)
    source = load_source(args.source)
    formats = record_formats(
        args, load_format(args.key_format, "--key-format"), load_format(args.value_format, "--value-format")
    )
    conf = spark_conf(f"kafka2pc-repair-{args.prefix}")
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--spark-conf {item!r}: give KEY=VALUE")
        conf.set(key, value)
    avro = formats is not None and formats.uses_avro  # spark-avro's to_avro encodes
    sessions: list[Any] = []

    def frame(plan: RepairPlan) -> Any:
        read = plan.record.source
        kafka = hasattr(source, "dataframe")
        if kafka and read is None:
            raise UsageError(f"run {plan.run} of {plan.prefix} has no stored Kafka source range to read again")
        spark = build_session(conf, args.spark_master, kafka_source=kafka, avro=avro)
        sessions.append(spark)
        return source.dataframe(spark, conn.config, read, None) if kafka else source(spark)

    settings = ExportSettings(args.prefix, conn.config, topic=args.topic, writer=args.writer)
    export_again = repair_exporter(
        frame,
        settings,
        WindowSettings(handover_ms=_HANDOVER_MS),
        formats,
        abort_opened=lambda: abort_attempts(conn.wire(), conn.decision_log(), args.prefix, args.run, ACTOR),
    )
    try:
        report = repair_lost_run(
            conn.wire(), conn.decision_log(), args.prefix, args.run, export_again, actor=ACTOR,
            files_now=export_again.files_now,
        )  # fmt: skip
    except NotLostError as e:
        raise UsageError(str(e)) from None
    finally:
        for spark in sessions:
            spark.stop()
    bootstrap = str(conn.config["bootstrap.servers"])
    announced, failures = announce(report.record, bootstrap, airflow_api, args.openlineage)
    failed = [f"the run is REPAIRED, but its announcement failed: {f}" for f in failures]
    if args.json:
        body = {"prefix": args.prefix} | survey.run_json(report.record)
        extra = {"announced": announced} | ({"announcement_failed": failed} if failed else {})
        render.print_json(out, body | {"repaired_now": report.repaired_now, "outcome": report.note} | extra)
    else:
        out.write("".join(f"{line}\n" for line in (report.note, *announced, *failed)))
    if failed:
        return EXIT_FAILED
    return EXIT_OK if report.record.status is RunStatus.REPAIRED else EXIT_LOST


__all__ = ["cmd_repair", "load_format", "load_named", "load_source"]
