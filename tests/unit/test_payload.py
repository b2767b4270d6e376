"""The export's XCom: compact (version 2), and version 1 still read."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest

from airflow_provider_kafka2pc.operators.payload import ExportPayload
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

RUN_KEY = naming.sanitize_run_key("scheduled__2026-11-23T00:00:00+00:00")


def prepared(prefix: str, slots: int, kafka_partitions: int, topics: tuple[str, ...], run_key: str | None) -> Any:
    """Committables as the writer returns them: every Kafka partition of every topic touched."""
    strategy = naming.NamingStrategy.INCREMENTING if run_key else naming.NamingStrategy.POOLING
    now = int(time.time() * 1000)
    out = []
    for slot in range(slots):
        per_topic = 2_500 // len(topics)
        out.append(
            Committable(
                transactional_id=naming.transactional_id(prefix, slot, strategy, run_key),
                producer_id=1_000_000 + slot,
                producer_epoch=slot % 7,
                records=per_topic * len(topics),
                bytes=per_topic * len(topics) * 100,
                topic_partitions=tuple((t, p) for t in topics for p in range(kafka_partitions)),
                first_write_ms=now + slot,
                transaction_timeout_ms=900_000,
                counts_by_topic=dict.fromkeys(topics, per_topic),
            )
        )
    return ExportPayload(
        "kafka2pc_default", prefix, strategy.value, run_key, "EXACTLY_ONCE", tuple(out), {"records": 5_000_000}
    )


def size(value: Any) -> int:
    """Bytes as Airflow stores an XCom value: JSON."""
    return len(json.dumps(value).encode())


def as_version_1(p: ExportPayload) -> dict[str, Any]:
    value = {k: v for k, v in p.to_xcom().items() if k != "transactions"}
    return {**value, "version": 1, "committables": [c.to_dict() for c in p.committables]}


@pytest.mark.parametrize(("topics", "run_key"), [(("orders",), None), (("orders.eu", "orders.us"), RUN_KEY)])
def test_a_2000_partition_export_fits_in_100_kb(topics: tuple[str, ...], run_key: str | None) -> None:
    p = prepared("warehouse.orders_daily", 2_000, 100, topics, run_key)
    xcom = p.to_xcom()
    v2, v1 = size(xcom), size(as_version_1(p))
    print(f"2,000 transactions x 100 partitions x {len(topics)} topic(s): version 1 {v1:,} B, version 2 {v2:,} B")
    assert v2 < 100_000
    assert v1 > 20 * v2  # what it was: every partition of every transaction

    again = ExportPayload.from_xcom(json.loads(json.dumps(xcom)), "prepare")
    assert [
        (c.transactional_id, c.producer_id, c.producer_epoch, c.records, dict(c.counts_by_topic))
        for c in again.committables
    ] == [
        (c.transactional_id, c.producer_id, c.producer_epoch, c.records, dict(c.counts_by_topic))
        for c in p.committables
    ]
    assert again.summary == p.summary


def test_version_1_is_still_read() -> None:
    p = prepared("orders", 3, 4, ("orders",), None)
    again = ExportPayload.from_xcom(json.loads(json.dumps(as_version_1(p))), "prepare")
    assert again == p  # everything version 1 carried, partitions included


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t.update(slots=t["slots"][:-1]),  # columns of different lengths
        lambda t: t.update(producer_ids=["1"] * len(t["slots"])),
        lambda t: t.update(slots=[True] * len(t["slots"])),
        lambda t: t.update(topics=["a", "b"]),  # two topics, no records per topic
        lambda t: t.pop("records"),
        lambda t: t.update(records=["5"] * len(t["slots"])),
    ],
)
def test_mangled_version_2_is_refused(mangle: Any) -> None:
    xcom = prepared("orders", 3, 4, ("orders",), None).to_xcom()
    mangle(xcom["transactions"])
    with pytest.raises(MalformedCommittableError):
        ExportPayload.from_xcom(xcom, "prepare")


def with_digests(p: ExportPayload) -> ExportPayload:
    """The payload's committables with the digests the Spark writer records (xxh64, one per transaction)."""
    digested = tuple(
        dataclasses.replace(c, digest=f"xxh64:{c.records}:{(0x9E3779B97F4A7C15 * (i + 1)) % 2**64:016x}")
        for i, c in enumerate(p.committables)
    )
    return dataclasses.replace(p, committables=digested)


@pytest.mark.parametrize(("topics", "run_key"), [(("orders",), None), (("orders.eu", "orders.us"), RUN_KEY)])
def test_digests_cost_12_bytes_per_transaction_and_round_trip(topics: tuple[str, ...], run_key: str | None) -> None:
    plain = prepared("warehouse.orders_daily", 2_000, 100, topics, run_key)
    p = with_digests(plain)
    xcom = p.to_xcom()
    extra = size(xcom) - size(plain.to_xcom())
    print(f"digests of 2,000 transactions: {extra:,} B")
    assert extra <= 12 * 2_000  # 8 bytes each in base64, not 27 characters of text
    back = ExportPayload.from_xcom(json.loads(json.dumps(xcom)), "prepare")
    assert [c.digest for c in back.committables] == [c.digest for c in p.committables]


def test_digests_of_mixed_schemes_or_counts_travel_as_text_and_a_short_column_is_refused() -> None:
    p = with_digests(prepared("orders", 3, 2, ("orders",), None))
    mixed = dataclasses.replace(
        p, committables=(p.committables[0], dataclasses.replace(p.committables[1], digest=None), p.committables[2])
    )
    xcom = mixed.to_xcom()
    assert isinstance(xcom["transactions"]["digests"], list)
    back = ExportPayload.from_xcom(xcom, "prepare")
    assert [c.digest for c in back.committables] == [c.digest for c in mixed.committables]
    packed = p.to_xcom()
    packed["transactions"]["digests"]["sums"] = packed["transactions"]["digests"]["sums"][:12]
    with pytest.raises(MalformedCommittableError, match="digests"):
        ExportPayload.from_xcom(packed, "prepare")
