"""The prepare job: every Spark partition writes one Kafka transaction and reports its committable.

Runs ``mapInArrow`` over the DataFrame. Each task opens a writer lazily (an empty partition opens
nothing and leaves no transaction), produces its rows, flushes, and yields one row: the
committable as JSON (EXACTLY_ONCE) or just its counts. The driver collects those rows, checks
that they are exactly one per non-empty partition, and returns them with a summary.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from airflow_provider_kafka2pc.spark.contract import validate_schema
from airflow_provider_kafka2pc.txn import naming
from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.errors import Kafka2PCError

log = logging.getLogger(__name__)


class DeliveryGuarantee(StrEnum):
    EXACTLY_ONCE = "EXACTLY_ONCE"  # one transaction per partition, committed by the coordinator
    AT_LEAST_ONCE = "AT_LEAST_ONCE"  # idempotent producer, flushed; a retried task may duplicate
    NONE = "NONE"  # acks=1, no idempotence


class SpeculationError(Kafka2PCError):
    """Speculative execution would let a late task attempt fence a finished one."""


class CollectError(Kafka2PCError):
    """The collected set is not exactly one committable per non-empty partition."""


@dataclass(frozen=True)
class ExportSettings:
    transactional_id_prefix: str
    producer_config: Mapping[str, Any]
    topic: str | None = None
    naming_strategy: naming.NamingStrategy = naming.NamingStrategy.POOLING
    run_key: str | None = None
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    transaction_timeout_ms: int | None = None
    # Testing aid: the first attempt of this partition raises after writing N records.
    fail_first_attempt: tuple[int, int] | None = None

    def to_json(self) -> str:
        d = asdict(self)
        d["producer_config"] = dict(self.producer_config)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ExportSettings:
        d = json.loads(text)
        d["naming_strategy"] = naming.NamingStrategy(d["naming_strategy"])
        d["delivery_guarantee"] = DeliveryGuarantee(d["delivery_guarantee"])
        if d.get("fail_first_attempt") is not None:
            d["fail_first_attempt"] = tuple(d["fail_first_attempt"])
        return cls(**d)

    def transactional_id(self, slot: int) -> str:
        return naming.transactional_id(self.transactional_id_prefix, slot, self.naming_strategy, self.run_key)


@dataclass(frozen=True)
class ExportResult:
    committables: tuple[Committable, ...]
    records: int
    bytes: int
    partitions: int  # non-empty Spark partitions written
    counts_by_topic: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    retried: tuple[int, ...] = ()  # partitions whose successful attempt was a retry

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "bytes": self.bytes,
            "partitions": self.partitions,
            "transactions": len(self.committables),
            "counts_by_topic": dict(self.counts_by_topic),
            "duration_s": round(self.duration_s, 3),
            "retried_partitions": list(self.retried),
        }


def _out_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("slot", pa.int32()),
            ("attempt", pa.int32()),
            ("records", pa.int64()),
            ("bytes", pa.int64()),
            ("counts", pa.string()),
            ("committable", pa.string()),
        ]
    )


def _encode_column(col: Any) -> list[bytes | None]:
    import pyarrow as pa

    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return [None if v is None else v.encode() for v in col.to_pylist()]
    return col.to_pylist()  # type: ignore[no-any-return]


def write_partition(settings: ExportSettings, slot: int, attempt: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one Spark task; also callable without Spark (tests, other engines)."""
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.writer import DeliveryWriter, TransactionalWriter

    writer: DeliveryWriter | None = None
    fail_after = (
        settings.fail_first_attempt[1]
        if settings.fail_first_attempt and settings.fail_first_attempt[0] == slot and attempt == 0
        else None
    )
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        if writer is None:
            if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
                writer = TransactionalWriter(
                    settings.producer_config, settings.transactional_id(slot), settings.transaction_timeout_ms
                ).open()
            else:
                extra = (
                    {"enable.idempotence": True, "acks": "all"}
                    if settings.delivery_guarantee is DeliveryGuarantee.AT_LEAST_ONCE
                    else {"enable.idempotence": False, "acks": 1}
                )
                writer = DeliveryWriter({**settings.producer_config, **extra}, f"partition {slot}").open()
        names = batch.schema.names
        values = _encode_column(batch.column(names.index("value")))
        keys = _encode_column(batch.column(names.index("key"))) if "key" in names else [None] * n
        topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else None
        parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else None
        headers = batch.column(names.index("headers")).to_pylist() if "headers" in names else None
        produce = writer.produce
        default_topic = settings.topic
        for i in range(n):
            topic = (topics[i] if topics is not None else None) or default_topic
            if topic is None:
                raise Kafka2PCError(f"row {i} of partition {slot} has no topic and there is no default topic")
            hdrs = None
            if headers is not None and headers[i]:
                hdrs = [
                    (h["key"], h["value"].encode() if isinstance(h["value"], str) else h["value"]) for h in headers[i]
                ]
            produce(topic, values[i], keys[i], parts[i] if parts is not None else None, hdrs)
            if fail_after is not None and writer.records >= fail_after:
                writer.flush_and_verify()  # the records reach the broker inside the open transaction
                raise RuntimeError(f"injected failure in partition {slot}, attempt {attempt}")
    if writer is None:
        return
    committable_json: str | None = None
    if isinstance(writer, TransactionalWriter):
        c = writer.prepare()
        committable_json = c.to_json() if c is not None else None
    else:
        writer.finish()
    row = {
        "slot": slot,
        "attempt": attempt,
        "records": writer.records,
        "bytes": writer.bytes,
        "counts": json.dumps(writer.counts_by_topic),
        "committable": committable_json,
    }
    yield pa.RecordBatch.from_pylist([row], schema=_out_arrow_schema())


def check_session(spark: Any) -> None:
    if str(spark.conf.get("spark.speculation", "false")).lower() == "true":
        raise SpeculationError(
            "spark.speculation=true: a speculative task attempt would re-initialise a transactional id "
            "and fence the attempt that already finished; run the export in a session with speculation off"
        )


def export_dataframe(df: Any, settings: ExportSettings) -> ExportResult:
    """Run the prepare job; returns committables (EXACTLY_ONCE) and the summary."""
    started = time.monotonic()
    naming.validate_prefix(settings.transactional_id_prefix)
    validate_schema(df.schema, settings.topic)
    check_session(df.sparkSession)
    if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE and settings.transaction_timeout_ms is None:
        from airflow_provider_kafka2pc.txn.writer import broker_max_transaction_timeout_ms

        # Read the broker's cap once on the driver instead of once per task.
        settings = replace(settings, transaction_timeout_ms=broker_max_transaction_timeout_ms(settings.producer_config))
    payload = settings.to_json()

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        yield from write_partition(ExportSettings.from_json(payload), ctx.partitionId(), ctx.attemptNumber(), batches)

    from pyspark.sql.pandas.types import from_arrow_schema

    rows = df.mapInArrow(run, from_arrow_schema(_out_arrow_schema())).collect()
    return _collect(rows, settings, time.monotonic() - started)


def _collect(rows: list[Any], settings: ExportSettings, duration_s: float) -> ExportResult:
    slots = [r["slot"] for r in rows]
    if len(set(slots)) != len(slots):
        raise CollectError(f"more than one result for a partition: {sorted(slots)}")
    committables: list[Committable] = []
    counts: dict[str, int] = {}
    for r in rows:
        for topic, n in json.loads(r["counts"]).items():
            counts[topic] = counts.get(topic, 0) + n
        if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            if r["committable"] is None or r["records"] <= 0:
                raise CollectError(f"partition {r['slot']} reported no committable for {r['records']} records")
            c = Committable.from_json(r["committable"])
            if c.transactional_id != settings.transactional_id(r["slot"]) or c.records != r["records"]:
                raise CollectError(f"partition {r['slot']} reported a committable that is not its own: {c}")
            committables.append(c)
    return ExportResult(
        committables=tuple(sorted(committables, key=lambda c: c.transactional_id)),
        records=sum(r["records"] for r in rows),
        bytes=sum(r["bytes"] for r in rows),
        partitions=len(rows),
        counts_by_topic=counts,
        duration_s=duration_s,
        retried=tuple(sorted(r["slot"] for r in rows if r["attempt"] > 0)),
    )
