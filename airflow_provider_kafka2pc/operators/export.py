"""Kafka2PCExportOperator: the prepare phase, a Spark job that leaves one open transaction per partition."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.exceptions import KafkaSourceNeedsOneActiveRunError, PoolingNeedsOneActiveRunError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.failure_lines import prepare_failure_line
from airflow_provider_kafka2pc.operators.kafka_source import KafkaSource, open_offsets_writer, take_snapshot
from airflow_provider_kafka2pc.operators.links import Kafka2PCExportersLink
from airflow_provider_kafka2pc.operators.payload import ExportPayload
from airflow_provider_kafka2pc.operators.spark_session import spark_session
from airflow_provider_kafka2pc.operators.write_rate import keep_shown_rate, window_with_shown_rate
from airflow_provider_kafka2pc.txn.kafka.config import redact
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, MissingTopicError  # noqa: F401  (re-exported: its old home)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.registry.formats import RegistryFormat
    from airflow_provider_kafka2pc.spark.progress import Progress
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from airflow_provider_kafka2pc.spark.sources import SourceTable
    from airflow_provider_kafka2pc.txn.kafka.offsets_writer import OffsetsWriter
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord
    from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

SourceCallable = Callable[[Any, "Context"], Any]  # (SparkSession, context) -> DataFrame


def check_pooling_dag(naming_strategy: naming.NamingStrategy, dag: Any, prefix: str) -> None:
    if naming_strategy is naming.NamingStrategy.POOLING and getattr(dag, "max_active_runs", None) != 1:
        raise PoolingNeedsOneActiveRunError(
            f"exporter {prefix!r} uses POOLING transactional ids, which every run of DAG "
            f"{getattr(dag, 'dag_id', '?')!r} reuses; set max_active_runs=1 on the DAG "
            f"(it is {getattr(dag, 'max_active_runs', None)}), or use naming_strategy='INCREMENTING'"
        )


class Kafka2PCExportOperator(BaseOperator):
    """Prepare: export a DataFrame into one open Kafka transaction per non-empty Spark partition.

    The committables go to XCom (``return_value``, JSON); ``Kafka2PCCommitOperator`` makes them
    visible, ``Kafka2PCAbortOperator`` rolls them back. A re-run of an export whose run already
    reached its COMMIT decision is skipped, so clearing a finished run never duplicates it.

    :param transactional_id_prefix: names this exporter's transactional ids; letters, digits,
        ``.`` and ``_``; one exporter per prefix (claimed in the decision log).
    :param topic: default topic for rows without a ``topic`` column.
    :param source: ``(spark, context) -> DataFrame``, or a ``KafkaSource`` (its consumer group's offsets
        commit with the run); or give ``sql`` or ``table``.
    :param spark_conn_id: a ``spark`` or ``spark_connect`` connection; ``local[*]`` when unset.
    :param spark_conf: Spark settings on top of the connection's (like ``config_kwargs``).
    :param naming_strategy: ``POOLING`` (default; needs ``max_active_runs=1``) or ``INCREMENTING``.
    :param delivery_guarantee: ``EXACTLY_ONCE`` (default), ``AT_LEAST_ONCE`` or ``NONE``.
    :param producer_config: librdkafka producer settings on top of the connection's.
    :param transaction_timeout_ms: defaults to the broker's ``transaction.max.timeout.ms``.
    :param writer: ``auto`` (default: the native writer where it can write the frame, else the Python
        loop), ``native`` (fail where it cannot) or ``python``.
    :param materialize: compute and store the DataFrame before any transaction opens (default), so
        the transaction window covers writing and committing only; False computes it inside the window.
    :param store: where the computed frame waits for the write: ``auto`` (default) stages it in Arrow
        files on the executors' host when the driver and the executors share one, else a checkpoint;
        ``arrow`` or ``checkpoint`` force one.
    :param checkpoint_dir: store the computed frame there (a reliable checkpoint, which survives a lost
        executor; deleted after the export) instead of on the executors (a local checkpoint).
    :param commit_headroom_ms: what the commit keeps before the broker deadline (decision write and
        EndTxn); derived from the timeout and the run's size when None. Give the commit the same value.
    :param handover_ms: time allowed between this task's end and the commit's first EndTxn (gate
        tasks between them run inside the window: add their time).
    :param write_records_per_s: records per second and task slot this cluster writes, stated for the
        window budget; unset, the budget uses the rate the exporter's previous run showed, and with
        none refuses nothing up front (the deadline watch still stops a write that overruns).
    :param write_bytes_per_s: likewise in bytes per second.
    :param key_format: encode the ``key`` column for a schema registry (``AvroFormat``,
        ``JsonSchemaFormat``; ``airflow_provider_kafka2pc.registry.formats``), framed with the schema id.
    :param value_format: likewise the ``value`` column.
    :param schema_registry_conn_id: the ``kafka2pc_schema_registry`` connection the formats use.
    :param repair_lost: a clear of this task in a run that lost transactions after its COMMIT (LOST)
        repairs the run (default): it exports again exactly the lost Spark partitions, proves them the
        same records by their digest and commits them (DESIGN §6). False: the task fails on the loss.
    :param repairable: record a digest of each transaction's keys and values (default), which a repair
        proves its re-computation with; it costs one hash per record in Spark's JVM (docs/design.md).
        False: a LOST run of this export cannot be repaired, only acknowledged.
    """

    operator_extra_links = (Kafka2PCExportersLink(),)
    template_fields: Sequence[str] = (
        "transactional_id_prefix",
        "topic",
        "sql",
        "table",
        "spark_conn_id",
        "spark_conf",
        "producer_config",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "sql": "sql",
        "spark_conf": "json",
        "producer_config": "json",
    }
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        transactional_id_prefix: str,
        topic: str | None = None,
        source: SourceCallable | KafkaSource | None = None,
        sql: str | None = None,
        table: str | None = None,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        spark_conn_id: str | None = None,
        spark_conf: Mapping[str, Any] | None = None,
        naming_strategy: str | naming.NamingStrategy = naming.NamingStrategy.POOLING,
        delivery_guarantee: str = "EXACTLY_ONCE",
        producer_config: Mapping[str, Any] | None = None,
        transaction_timeout_ms: int | None = None,
        writer: str = "auto",
        materialize: bool = True,
        store: str = "auto",
        checkpoint_dir: str | None = None,
        commit_headroom_ms: int | None = None,
        handover_ms: int | None = None,
        write_records_per_s: int | None = None,
        write_bytes_per_s: int | None = None,
        key_format: RegistryFormat | None = None,
        value_format: RegistryFormat | None = None,
        schema_registry_conn_id: str | None = None,
        repair_lost: bool = True,
        repairable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if sum(x is not None for x in (source, sql, table)) != 1:
            raise ValueError("give exactly one of source (a callable), sql or table")
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee

        if isinstance(source, KafkaSource) and delivery_guarantee.upper() != DeliveryGuarantee.EXACTLY_ONCE.value:
            raise ValueError("a KafkaSource commits its group's offsets in the run's transactions: use EXACTLY_ONCE")
        self.transactional_id_prefix = transactional_id_prefix
        self.topic = topic
        self.source = source
        self.sql = sql
        self.table = table
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.naming_strategy = naming.NamingStrategy(str(naming_strategy).upper())
        self.delivery_guarantee = DeliveryGuarantee(str(delivery_guarantee).upper())
        self.producer_config = dict(producer_config or {})
        self.transaction_timeout_ms = transaction_timeout_ms
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import validate_writer

        self.writer = validate_writer(writer)
        from airflow_provider_kafka2pc.spark.window import WindowSettings

        self.window = WindowSettings(
            materialize=materialize,
            store=store,
            checkpoint_dir=checkpoint_dir,
            commit_headroom_ms=commit_headroom_ms,
            write_records_per_s=write_records_per_s,
            write_bytes_per_s=write_bytes_per_s,
        )
        if handover_ms is not None:
            self.window = dataclasses.replace(self.window, handover_ms=handover_ms)
        if (key_format or value_format) and not schema_registry_conn_id:
            raise ValueError("key_format and value_format need a schema_registry_conn_id")
        self.key_format = key_format
        self.value_format = value_format
        self.schema_registry_conn_id = schema_registry_conn_id
        self.repair_lost = repair_lost
        self.repairable = repairable
        self._written: tuple[str, tuple[str, ...]] = ("", ())  # (bootstrap, topics), for lineage
        self._read: tuple[SourceTable, ...] = ()  # the source tables, for lineage

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage outputs: the topics this export wrote its (prepared, not yet visible) records to."""
        from airflow_provider_kafka2pc.operators.lineage import topics_lineage

        return topics_lineage(*self._written, self._read)

    def _source_tables(self, spark: Any) -> tuple[SourceTable, ...]:
        """The tables this export reads, looked up while Spark runs; lineage never fails an export."""
        from airflow_provider_kafka2pc.operators.lineage import lineage_enabled, source_table_names
        from airflow_provider_kafka2pc.spark.sources import source_tables

        if not lineage_enabled():
            return ()
        try:
            return tuple(source_tables(spark, source_table_names(self.table, self.sql)))
        except Exception as e:
            self.log.info("lineage: the source tables are unknown (%s: %s)", type(e).__name__, e)
            return ()

    def _dataframe(self, spark: Any, context: Context, config: Mapping[str, Any], read: SourceRange | None) -> Any:
        if isinstance(self.source, KafkaSource):
            assert read is not None
            return self.source.dataframe(spark, config, read, context)
        if self.source is not None:
            return self.source(spark, context)
        if self.sql is not None:
            return spark.sql(self.sql)
        return spark.table(self.table)

    def _skip_or_fail(self, context: Context, prefix: str, run: str, status: RunRecord) -> None:
        from airflow_provider_kafka2pc.operators.decided_run import skip_or_fail

        skip_or_fail(context, prefix, run, status, self.log)

    def _skip_if_decided(self, session: PrepareSession, context: Context, status: RunRecord | None) -> None:
        """A run whose record is final (COMMITTED, REPAIRED, ACKNOWLEDGED; LOST fails) skips before
        anything else. A run only DECIDED (its COMMIT in force, EndTxns missing) goes on to the
        recovery pass below, which rolls it forward; the status check after it then skips."""
        from airflow_provider_kafka2pc.txn.protocol.records import RunStatus

        if status is not None and status.status is not RunStatus.DECIDED:
            self._skip_or_fail(context, session.prefix, session.run, status)

    def _stand_down_if_decided_meanwhile(
        self, session: PrepareSession, context: Context, committables: Sequence[Committable]
    ) -> None:
        """The run may have reached its decision while Spark wrote (this export was cleared while the
        run's commit went on): then these transactions are a second export of a decided run. They are
        aborted (ABORT appended first) before the task stands down, not left open for the next run."""
        if not committables:
            return
        status = session.run_status()
        if status is None:
            return
        self.log.warning(
            "run %s was decided while this export wrote: aborting its %d transaction(s)", session.run, len(committables)
        )
        session.abort(committables)
        self._skip_or_fail(context, session.prefix, session.run, status)

    def _abort_opened(self, session: PrepareSession, settings: ExportSettings) -> bool:
        """The write job failed or overran: end what it opened now (ABORT decided first, as recovery
        does), instead of leaving it open, stalling read_committed readers, until the abort task.
        True when nothing of the exporter is left open. A try that a newer one superseded leaves the
        ids to it: its pass would abort the newer try's prepared transactions."""
        from airflow_provider_kafka2pc.txn.protocol.errors import SupersededExportError

        try:
            done, result = session.abort_opened(settings)
        except SupersededExportError as e:
            self.log.warning("kafka2pc left the write job's transactions to the newer try: %s", e)
            return False
        except Exception as e:  # best effort: the abort task (and the next recovery) remain
            self.log.warning(
                "kafka2pc could not abort the write job's transactions now (%s: %s); the abort task will",
                type(e).__name__,
                e,
            )
            return False
        if done:
            self.log.info(
                "kafka2pc aborted the write job's open transactions of %s: %s", session.prefix, result.describe()
            )
        else:
            self.log.warning(
                "kafka2pc: transactions of %s still open after 30 s (%s); the abort task will end them",
                session.prefix,
                result.describe(),
            )
        return done

    def _open_offsets(self, writer: OffsetsWriter, read: SourceRange, abort_now: Callable[[], bool]) -> Committable:
        from airflow_provider_kafka2pc.operators.kafka_source import send_offsets

        return send_offsets(writer, read, abort_now)

    def _formats(self) -> RecordFormats | None:
        """The key and value formats with the registry connection's settings (its secret stays in them)."""
        if self.schema_registry_conn_id is None or not (self.key_format or self.value_format):
            return None
        from airflow_provider_kafka2pc.hooks.schema_registry import SchemaRegistryHook
        from airflow_provider_kafka2pc.spark.record_formats import RecordFormats

        registry = SchemaRegistryHook(self.schema_registry_conn_id).settings()
        return RecordFormats(registry, key=self.key_format, value=self.value_format)

    def _spark_session(self, purpose: str, kafka_source: bool, formats: RecordFormats | None) -> Any:
        """The job's SparkSession (``purpose`` names a repair's in the application name)."""
        return spark_session(
            self.spark_conn_id,
            self.spark_conf,
            "-".join(p for p in (self.dag_id, self.task_id, purpose) if p),
            kafka_source=kafka_source,
            avro=formats is not None and formats.uses_avro,
        )

    def _repair(
        self, hook: Kafka2PCHook, session: PrepareSession, context: Context, seen: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Repair the run (``operators/export_repair.py``). Returns no XCom: the commit answers from
        the run's record."""
        from airflow_provider_kafka2pc.operators.export_repair import repair_in_task
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

        settings = ExportSettings(
            transactional_id_prefix=session.prefix,
            producer_config=hook.producer_config(self.producer_config),
            topic=self.topic,
            transaction_timeout_ms=self.transaction_timeout_ms,
            writer=self.writer,
        )
        formats = self._formats()

        def frame_of(read: SourceRange | None) -> tuple[Any, Any]:
            spark = self._spark_session("repair", read is not None, formats)
            return spark, self._dataframe(spark, context, settings.producer_config, read)

        actor = f"{self.dag_id}.{self.task_id} (try {getattr(context['ti'], 'try_number', '?')})"
        kafka = isinstance(self.source, KafkaSource)
        repair_in_task(session, settings, self.window, formats, frame_of, kafka, actor, context["ti"], self.log, seen)
        return None

    def execute(self, context: Context) -> dict[str, Any] | None:
        prefix = self.transactional_id_prefix
        naming.validate_prefix(prefix)
        check_pooling_dag(self.naming_strategy, context["dag"], prefix)
        if isinstance(self.source, KafkaSource) and getattr(context["dag"], "max_active_runs", None) != 1:
            raise KafkaSourceNeedsOneActiveRunError(
                f"exporter {prefix!r} reads a Kafka source: two runs at once would both read from consumer group "
                f"{self.source.group_id!r}'s offsets and export the same records twice; set max_active_runs=1 on "
                f"DAG {context['dag'].dag_id!r}"
            )
        run_key = (
            naming.sanitize_run_key(context["run_id"])
            if self.naming_strategy is naming.NamingStrategy.INCREMENTING
            else None
        )
        hook = Kafka2PCHook(self.kafka2pc_conn_id)
        # One wire client and one decision log for every Kafka step of this prepare.
        seen: dict[str, Any] = {}  # whether the write job started, its last progress, whether it was aborted
        try:
            with hook.prepare_session(prefix, decision_run(context), run_key) as session:
                return self._prepare(hook, session, context, seen)
        except AirflowSkipException:
            raise
        except BaseException as e:
            # Last, so that it is the line a user reads first: how far the prepare got, what is open.
            self.log.error("kafka2pc: %s", prepare_failure_line(decision_run(context), prefix, e, seen))
            raise

    def _prepare(
        self, hook: Kafka2PCHook, session: PrepareSession, context: Context, seen: dict[str, Any]
    ) -> dict[str, Any] | None:
        from airflow_provider_kafka2pc.hooks.kafka2pc import take_turn
        from airflow_provider_kafka2pc.spark.job import export_run
        from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings

        prefix, run = session.prefix, session.run
        # Fail in seconds on the driver, before anything is written, not after every task's
        # delivery timeout or with transactions left open: the topic, then every ACL we can ask about.
        session.check_export_access(self.topic)
        exactly_once = self.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
        # The try id first, before every check: a try that is paused after it and comes back once
        # another try took a number ends nothing and takes no number (txn/two_phase/export_try.py).
        members = naming.Members(prefix, self.naming_strategy, session.run_key)
        try_seen = session.see_try(members) if exactly_once else None
        # A clear of a run that already reached its decision: say so first, and touch nothing; or
        # repair it, if it lost transactions after its COMMIT.
        status = session.run_status()
        if status is not None and status.status is RunStatus.LOST and self.repair_lost and exactly_once:
            return self._repair(hook, session, context, seen)
        self._skip_if_decided(session, context, status)
        if self.naming_strategy is naming.NamingStrategy.POOLING:
            holder = take_turn(session, self.dag_id, context["run_id"])
            if holder is not None:  # the recovery sensor waits for its turn; a bare export refuses
                raise PoolingNeedsOneActiveRunError(
                    f"exporter {prefix!r} uses POOLING transactional ids and DAG run {holder.run_id} is still using "
                    "them; put a Kafka2PCRecoverySensor before this task (kafka2pc_export_group does) so runs take "
                    "turns, or use naming_strategy='INCREMENTING'"
                )
        session.recover_first("retry this task in a few seconds, or put a Kafka2PCRecoverySensor before it", try_seen)
        session.claim(owner=f"{self.dag_id}.{self.task_id}")
        status = session.run_status()
        if status is not None:
            self._skip_or_fail(context, prefix, run, status)
        # Last of the checks: from here a newer try or run supersedes this one, and its writers stand down.
        producer_config = hook.producer_config(self.producer_config)
        taken = session.begin_try(try_seen, producer_config) if try_seen is not None else None
        settings = ExportSettings(
            transactional_id_prefix=prefix,
            producer_config=producer_config,
            topic=self.topic,
            naming_strategy=self.naming_strategy,
            run_key=session.run_key,
            delivery_guarantee=self.delivery_guarantee,
            transaction_timeout_ms=self.transaction_timeout_ms,
            writer=self.writer,
            repairable=self.repairable,
            export_try=taken.as_tuple() if taken is not None else None,
        )
        self.log.info(
            "prepare %s: %s, %s ids, producer config %s",
            prefix,
            self.delivery_guarantee.value,
            self.naming_strategy.value,
            redact(settings.producer_config),
        )
        read, offsets_writer = None, None
        if isinstance(self.source, KafkaSource):
            read = take_snapshot(self.source, settings.producer_config, session, self.topic)
            offsets_writer = open_offsets_writer(settings, read, self.transaction_timeout_ms)
        # Idle through a long Spark job, a connection may be dropped by the network on the way: the
        # steps after the job (an abort now, the stand-down) connect afresh.
        session.clients.close()
        formats = self._formats()
        spark = self._spark_session("", read is not None, formats)

        def progress(p: Progress) -> None:
            seen["progress"], seen["progress_at"] = p, time.monotonic()
            self.log.info("%s", p.describe())

        def abort_now() -> bool:
            seen["aborted"] = self._abort_opened(session, settings)
            return bool(seen["aborted"])

        window = window_with_shown_rate(self.window, context["ti"], self.task_id, prefix, self.log)
        try:
            df = self._dataframe(spark, context, settings.producer_config, read)
            result = export_run(
                session, df, settings, window=window, abort_opened=abort_now, on_progress=progress, formats=formats,
                writing=lambda: seen.update(writing=True),
            )  # fmt: skip
            self._read = self._source_tables(spark)
        except BaseException:
            if offsets_writer is not None:
                offsets_writer.abandon()
            raise
        finally:
            spark.stop()
        if offsets_writer is not None and read is not None:
            offsets = self._open_offsets(offsets_writer, read, abort_now)
            result = dataclasses.replace(result, committables=(offsets, *result.committables))
        self._stand_down_if_decided_meanwhile(session, context, result.committables)
        keep_shown_rate(context["ti"], result.write_rate, context["run_id"], prefix)  # for the next run's budget
        summary = result.summary()
        self._written = (str(settings.producer_config.get("bootstrap.servers", "")), tuple(result.counts_by_topic))
        self.log.info(
            "prepared %d transaction(s) of %s: %d records, %d bytes, %d partition(s), per topic %s, %.1f s "
            "(materializing %.1f s, writing %.1f s), %.0f records/s%s",
            summary["transactions"],
            prefix,
            result.records,
            result.bytes,
            result.partitions,
            summary["counts_by_topic"],
            result.duration_s,
            result.materialize_s,
            result.write_s,
            result.records / result.duration_s if result.duration_s > 0 else 0.0,
            f", retried partitions {list(result.retried)}" if result.retried else "",
        )
        return ExportPayload(
            conn_id=self.kafka2pc_conn_id,
            prefix=prefix,
            naming_strategy=self.naming_strategy.value,
            run_key=settings.run_key,
            delivery_guarantee=self.delivery_guarantee.value,
            committables=result.committables,
            summary=summary,
            source=read,
        ).to_xcom()
