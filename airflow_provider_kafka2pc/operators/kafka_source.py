"""KafkaSource: an export that reads Kafka and commits its consumer group's offsets with the run.

Give it as the export's ``source``. On the driver, after the exporter's recovery, the prepare takes
the run's range (``txn/kafka/source_snapshot.py``), hands the user's ``transform`` exactly that
range read by Spark's Kafka source (``read_committed``), writes the output, and then opens the
run's offsets participant (``{prefix}-offsets``) with the range's end offsets. The commit checks
that the group did not move meanwhile and commits the output and the offsets together; an abort
ends both. The source topics live on the export's own Kafka connection (KIP-447 needs the group's
offsets and the output in one cluster).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.kafka.offsets_writer import OffsetsWriter
    from airflow_provider_kafka2pc.txn.kafka.source_snapshot import KafkaSourceSpec
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession

log = logging.getLogger(__name__)
Transform = Callable[[Any, "Context"], Any]  # (the source DataFrame, context) -> the DataFrame to export
# Options of Spark's Kafka source (case-insensitive there) that would make it read something else
# than the range whose end the run commits.
_RANGE_OPTIONS = frozenset(
    {
        "assign",
        "subscribe",
        "subscribepattern",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "startingoffsetsbytimestamp",
        "endingoffsetsbytimestamp",
        "failondataloss",
        "kafka.isolation.level",
        "kafka.bootstrap.servers",
    }
)


@dataclass(frozen=True)
class KafkaSource:
    """An export's Kafka source.

    :param topics: the source topic(s); or give ``pattern``.
    :param group_id: the consumer group whose offsets move with each committed run. Give the export
        a group of its own: a group with live members is refused.
    :param pattern: a regex over topic names (a full match), instead of ``topics``.
    :param transform: ``(df, context) -> DataFrame``: ``df`` has Spark's Kafka source columns (key,
        value, topic, partition, offset, timestamp, timestampType, headers) and holds exactly this
        run's records. Without it the records are exported as they are (key, value, headers).
    :param starting_offsets: where a partition the group has no offset for starts: ``earliest``
        (default) or ``latest``.
    :param max_offsets_per_run: at most this many source offsets per run, shared over the partitions;
        the next run goes on from there.
    :param accept_gap: go on from the oldest records left when retention deleted records the group
        had not read (refused by default, naming how many offsets are gone).
    :param options: more options for Spark's Kafka source (the Java client's words, ``kafka.*``).
    """

    topics: str | Sequence[str] = ()
    group_id: str = ""
    pattern: str | None = None
    transform: Transform | None = None
    starting_offsets: str = "earliest"
    max_offsets_per_run: int | None = None
    accept_gap: bool = False
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spec()  # refuse a bad source when the DAG is parsed, not when it runs
        fixed = sorted(k for k in self.options if k.lower() in _RANGE_OPTIONS)
        if fixed:
            raise ValueError(
                f"KafkaSource(options=) may not set {fixed}: the run reads exactly the range whose end it commits "
                "as the group's offsets (assign, startingOffsets, endingOffsets, read_committed, failing on lost "
                "data) on the export's own connection"
            )

    def spec(self) -> KafkaSourceSpec:
        from airflow_provider_kafka2pc.txn.kafka.source_snapshot import KafkaSourceSpec

        topics = (self.topics,) if isinstance(self.topics, str) else tuple(self.topics)
        return KafkaSourceSpec(
            self.group_id, topics, self.pattern, self.starting_offsets, self.max_offsets_per_run, self.accept_gap
        )

    def dataframe(self, spark: Any, config: Mapping[str, Any], source: SourceRange, context: Context) -> Any:
        """The run's records as the user's transform makes them (exactly ``source``'s range)."""
        from airflow_provider_kafka2pc.spark.kafka_source import read_range

        df = read_range(spark, config, source, self.options)
        if self.transform is not None:
            return self.transform(df, context)
        return df.select("key", "value", "headers")


def take_snapshot(
    source: KafkaSource, config: Mapping[str, Any], session: PrepareSession, output: str | None
) -> SourceRange:
    """This run's range, read after the exporter's recovery resolved the earlier runs: the group is
    claimed for the exporter, and must stand where its last committed run left it."""
    from airflow_provider_kafka2pc.txn.kafka.source_snapshot import snapshot_source

    spec = source.spec()
    session.claim_group(spec.group_id)
    read = snapshot_source(config, spec, previous=session.last_source())
    if output in read.topics:
        raise ValueError(
            f"the Kafka source of exporter {session.prefix!r} reads {output!r}, the topic it writes: each run would "
            "read the previous run's output again. Read another topic"
        )
    log.info("kafka2pc source: this run reads %s", read.describe())
    return read


def open_offsets_writer(
    settings: ExportSettings, read: SourceRange, transaction_timeout_ms: int | None
) -> OffsetsWriter | None:
    """The run's offsets participant, its id initialised (an older holder fenced) before the write
    job, so that a second export of the run fences it early, like its writers do theirs; its
    transaction's timer starts when the offsets are sent, after the output is prepared. None when
    the run does not move the group."""
    if not read.moves:
        return None
    from airflow_provider_kafka2pc.txn.kafka.offsets_writer import OffsetsWriter
    from airflow_provider_kafka2pc.txn.protocol import naming
    from airflow_provider_kafka2pc.txn.two_phase.export_try import check_try_current

    tid = settings.transactional_id(naming.OFFSETS_SLOT)
    check_try_current(settings)  # a paused try must not fence a newer one's offsets participant
    return OffsetsWriter(
        settings.producer_config, tid, transaction_timeout_ms, id_prefix=settings.transactional_id_prefix
    ).open()


def send_offsets(writer: OffsetsWriter, read: SourceRange, abort_now: Callable[[], bool]) -> Committable:
    """The group's offsets sent into the offsets participant, left open; when that fails, what the
    write job opened is aborted at once."""
    try:
        writer.send_offsets(read)
        c = writer.prepare_offsets()
    except BaseException:
        writer.abandon()
        abort_now()
        raise
    log.info("kafka2pc source: %s holds group %r's offsets for the run", c.transactional_id, read.group_id)
    return c
