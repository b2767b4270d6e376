"""The partition writer: one Spark partition's Arrow batches into one Kafka transaction (DESIGN §3.2).

The body of a prepare task, callable without Spark (tests, other engines): it opens a writer lazily
(an empty partition opens nothing and leaves no transaction), produces every batch, flushes, and
yields one row: the committable as JSON (EXACTLY_ONCE) or just its counts. The native path hands
Arrow buffers to librdkafka's batch API; the Python loop serves what it cannot write.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.protocol.record_digest import RecordDigest
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings, validate_writer

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.kafka.writer import DeliveryWriter

log = logging.getLogger(__name__)

# An int64 hash of each row's key and value that Spark computed beside it (``spark/digest_column.py``):
# summed into the transaction's digest, dropped before the batch is produced.
DIGEST_COLUMN = "__kafka2pc_digest"


def result_schema() -> Any:
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
    """A string or binary column as Python bytes (None for null); strings are UTF-8 already.

    Casting string to binary only relabels the buffers, so no per-row ``str.encode()``."""
    import pyarrow as pa

    if pa.types.is_string(col.type):
        col = col.cast(pa.binary())
    elif pa.types.is_large_string(col.type):
        col = col.cast(pa.large_binary())
    return col.to_pylist()  # type: ignore[no-any-return]


def _byte_count(*cols: Any) -> int:
    """Bytes of keys plus values (nulls count 0), computed by Arrow instead of per record."""
    import pyarrow.compute as pc

    return sum(int(pc.sum(pc.binary_length(c)).as_py() or 0) for c in cols if c is not None)


def _headers_column(col: Any) -> list[list[tuple[str, bytes | None]] | None]:
    """Each row's headers as (key, value bytes) pairs; None for a null or empty list."""
    import pyarrow.compute as pc

    flat = col.flatten()  # the header structs of all rows, this slice only
    names = pc.struct_field(flat, "key").to_pylist()
    values = _encode_column(pc.struct_field(flat, "value"))
    out: list[list[tuple[str, bytes | None]] | None] = []
    start = 0
    for n in pc.list_value_length(col).fill_null(0).to_pylist():
        out.append(list(zip(names[start : start + n], values[start : start + n], strict=True)) if n else None)
        start += n
    return out


_told: set[str] = set()


def choose_writer(settings: ExportSettings, columns: list[str]) -> tuple[bool, str]:
    """(use the native path?, why), for a frame with these columns; raises when ``writer="native"``
    cannot be honoured."""
    if validate_writer(settings.writer) == "python":
        return False, "writer='python'"
    from airflow_provider_kafka2pc.txn.kafka import native

    why_not = (
        "the frame has a headers column, which rd_kafka_produce_batch cannot carry"
        if "headers" in columns
        else native.unavailable_reason() or native.unsupported_setting(settings.producer_config)
    )
    if why_not is None:
        return True, "Arrow batches into librdkafka's batch API (confluent-kafka's librdkafka through ctypes)"
    if settings.writer == "native":
        raise native.NativeUnsupportedError(f"writer='native' cannot be used: {why_not}")
    return False, f"the Python loop, because {why_not}"


def _tell_once(native_path: bool, why: str) -> None:
    """One INFO line per process for each choice made, the first time it is made."""
    if why not in _told:
        _told.add(why)
        log.info("kafka2pc writer: %s: %s", "native" if native_path else "python", why)


def _open_writer(settings: ExportSettings, slot: int, native_path: bool = False) -> DeliveryWriter:
    from airflow_provider_kafka2pc.txn.kafka.writer import DeliveryWriter, TransactionalWriter

    if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        from airflow_provider_kafka2pc.txn.two_phase.export_try import check_try_current

        check_try_current(settings)
    if native_path:
        from airflow_provider_kafka2pc.txn.kafka.native_writer import NativeDeliveryWriter, NativeTransactionalWriter

        DeliveryWriter, TransactionalWriter = NativeDeliveryWriter, NativeTransactionalWriter  # type: ignore[misc]
    if settings.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        return TransactionalWriter(
            settings.producer_config,
            settings.transactional_id(slot),
            settings.transaction_timeout_ms,
            id_prefix=settings.transactional_id_prefix,
        ).open()
    extra = (
        {"enable.idempotence": True, "acks": "all"}
        if settings.delivery_guarantee is DeliveryGuarantee.AT_LEAST_ONCE
        else {"enable.idempotence": False, "acks": 1}
    )
    return DeliveryWriter({**settings.producer_config, **extra}, f"partition {slot}").open()


def _write_batch_native(writer: Any, batch: Any, default_topic: str | None, slot: int) -> None:
    """One Arrow batch into librdkafka's batch API: per topic (a topic column is grouped, order
    within each topic kept), explicit partitions per record, no headers (``choose_writer``)."""
    import pyarrow.compute as pc

    names = batch.schema.names

    def column(name: str) -> Any:
        return batch.column(names.index(name)) if name in names else None

    if "topic" not in names:
        if default_topic is None:
            raise Kafka2PCError(f"partition {slot} has no topic column and there is no default topic")
        values, keys = column("value"), column("key")
        writer.produce_arrow(default_topic, values, keys, column("partition"), _byte_count(values, keys))
        return
    topics = column("topic")
    unset = pc.fill_null(pc.equal(topics, ""), True)  # as the Python loop: null or "" is the default topic
    if default_topic is not None:
        topics = pc.if_else(unset, default_topic, topics)
    elif pc.any(unset).as_py():
        row = pc.index(unset, True).as_py()
        raise Kafka2PCError(f"row {row} of partition {slot} has no topic and there is no default topic")
    for topic in pc.unique(topics).to_pylist():
        part = batch.filter(pc.equal(topics, topic))
        values = part.column(names.index("value"))
        keys = part.column(names.index("key")) if "key" in names else None
        partitions = part.column(names.index("partition")) if "partition" in names else None
        writer.produce_arrow(topic, values, keys, partitions, _byte_count(values, keys))


def _write_batch(writer: DeliveryWriter, batch: Any, default_topic: str | None, slot: int) -> None:
    """One Arrow batch through the writer: a tight loop when every record goes to the default
    topic through librdkafka's partitioner without headers (Spark's usual key/value frame), the
    general loop when there is a topic, partition or headers column."""
    import pyarrow.compute as pc

    n = batch.num_rows
    names = batch.schema.names
    value_col = batch.column(names.index("value"))
    key_col = batch.column(names.index("key")) if "key" in names else None
    values = _encode_column(value_col)
    keys = _encode_column(key_col) if key_col is not None else None
    nbytes = _byte_count(value_col, key_col)
    if not {"topic", "partition", "headers"} & set(names):
        if default_topic is None:
            raise Kafka2PCError(f"partition {slot} has no topic column and there is no default topic")
        writer.produce_batch(default_topic, values, keys, nbytes)
        return
    topics: list[Any] = (
        [t or default_topic for t in batch.column(names.index("topic")).to_pylist()]
        if "topic" in names
        else [default_topic] * n
    )
    if None in topics:
        raise Kafka2PCError(f"row {topics.index(None)} of partition {slot} has no topic and there is no default topic")
    # -1 (null or negative, as before) lets librdkafka's partitioner choose.
    partitions = (
        pc.max_element_wise(batch.column(names.index("partition")), -1).to_pylist()
        if "partition" in names
        else [-1] * n
    )
    headers = _headers_column(batch.column(names.index("headers"))) if "headers" in names else [None] * n
    writer.produce_rows(topics, values, keys if keys is not None else [None] * n, partitions, headers, nbytes)


def _take_digest(batch: Any, digest: RecordDigest) -> Any:
    """Adds the batch's digest column to ``digest`` (sum modulo 2**64, as unsigned) and returns the
    batch without it."""
    import numpy as np

    i = batch.schema.get_field_index(DIGEST_COLUMN)
    if i < 0:
        return batch
    hashes = batch.column(i).to_numpy(zero_copy_only=False).view(np.uint64)
    digest.add_hashes(batch.num_rows, int(hashes.sum(dtype=np.uint64)))
    return batch.remove_column(i)


def write_partition(settings: ExportSettings, slot: int, attempt: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one Spark task; also callable without Spark (tests, other engines)."""
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter

    writer: DeliveryWriter | None = None
    digest = RecordDigest(scheme=settings.digest_scheme)
    write = _write_batch
    fail_after = (
        settings.fail_first_attempt[1]
        if settings.fail_first_attempt and settings.fail_first_attempt[0] == slot and attempt == 0
        else None
    )
    for batch in batches:
        if batch.num_rows == 0:
            continue
        batch = _take_digest(batch, digest)
        if writer is None:
            native_path, why = choose_writer(settings, batch.schema.names)
            _tell_once(native_path, why)
            write = _write_batch_native if native_path else _write_batch
            writer = _open_writer(settings, slot, native_path)
        if fail_after is not None and writer.records + batch.num_rows >= fail_after:
            write(writer, batch.slice(0, fail_after - writer.records), settings.topic, slot)
            writer.flush_and_verify()  # the records reach the broker inside the open transaction
            raise RuntimeError(f"injected failure in partition {slot}, attempt {attempt}")
        try:
            write(writer, batch, settings.topic, slot)
        except BaseException:
            writer.abandon()  # a failed write can never be prepared: its transaction ends now
            raise
    if writer is None:
        return
    committable_json: str | None = None
    if isinstance(writer, TransactionalWriter):
        c = writer.prepare()
        if c is not None and digest.count:
            if digest.count != c.records:  # the writer's own count rules; a mismatch is a bug here
                raise Kafka2PCError(f"partition {slot}: {digest.count} rows hashed, {c.records} records written")
            c = replace(c, digest=digest.text())
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
    yield pa.RecordBatch.from_pylist([row], schema=result_schema())


__all__ = ["DIGEST_COLUMN", "choose_writer", "result_schema", "write_partition"]
