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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.kafka.source_snapshot import KafkaSourceSpec
    from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange

Transform = Callable[[Any, "Context"], Any]  # (the source DataFrame, context) -> the DataFrame to export


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
