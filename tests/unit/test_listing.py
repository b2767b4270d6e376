"""The complete listing's arithmetic: which transaction-log partition an id lives in, as the broker
computes it, and one probe id per partition (``txn.kafka.listing``)."""

from __future__ import annotations

from airflow_provider_kafka2pc.txn.kafka.listing import java_partition, probe_ids
from airflow_provider_kafka2pc.txn.protocol import naming


def test_java_partition_is_javas_string_hash_as_kafka_takes_it() -> None:
    # Java: "hello".hashCode() == 99162322; "Aa" and "BB" collide (2112); the famous
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE, which Kafka's Utils.abs maps to 0.
    assert java_partition("hello", 50) == 99162322 % 50
    assert java_partition("Aa", 50) == java_partition("BB", 50) == 2112 % 50
    assert java_partition("polygenelubricants", 50) == 0
    assert java_partition("", 7) == 0
    # Negative hashes: "orders-probe" overflows; abs, then modulo (computed with Java's rules by hand).
    h = 0
    for ch in "orders-probe":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    assert java_partition("orders-probe", 50) == abs(signed) % 50
    # Outside the BMP Java hashes UTF-16 code units (a surrogate pair), not code points.
    assert java_partition("\U0001f600", 1 << 30) == (31 * 0xD83D + 0xDE00) % (1 << 30)


def test_one_probe_per_partition_under_the_prefix_and_never_an_exporters_id() -> None:
    probes = probe_ids("orders", 50)
    assert [java_partition(p, 50) for p in probes] == list(range(50))
    for p in probes:  # under the prefix's ACL (prefixed), and no exporter's id: recovery never lists one
        assert p.startswith("orders" + naming.DELIMITER) and not naming.belongs_to(p, "orders")
