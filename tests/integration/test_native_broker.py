"""The native path (txn/kafka/native.py) against the real broker, judged by a read_committed consumer.

``write_partition`` is called as a Spark task would call it (without Spark: the writers are the
subject here), once per path, and the records are compared per partition, in order.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.native_writer import NativeTransactionalWriter
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import RunAbortedError
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.partition_writer import write_partition
from tests.helpers.kafka import KafkaEnv, Record

pytestmark = pytest.mark.kafka
HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def _settings(env: KafkaEnv, topic: str | None, writer: str, **kw: Any) -> ExportSettings:
    return ExportSettings(
        f"n{uuid.uuid4().hex[:8]}", env.config, topic, transaction_timeout_ms=300_000, writer=writer, **kw
    )


def _prepare(settings: ExportSettings, batches: list[pa.RecordBatch], slot: int = 0) -> Committable:
    rows = [r for out in write_partition(settings, slot, 0, iter(batches)) for r in out.to_pylist()]
    assert len(rows) == 1 and rows[0]["committable"] is not None
    return Committable.from_json(rows[0]["committable"])


def _by_partition(records: list[Record]) -> dict[int, list[tuple[Any, ...]]]:
    out: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for r in records:
        out[r.partition].append((r.key, r.value, r.headers))
    return dict(out)


def _frame(n: int, offset: int = 0) -> pa.RecordBatch:
    """Keyed records (murmur2 decides their partition the same way on both paths), string keys and
    binary values with nulls (tombstones) and empty ones, sliced out of a bigger batch."""
    keys = [f"order-{(i * 7) % 301}" for i in range(n + offset)]
    values = [
        None if i % 97 == 0 else b"" if i % 89 == 0 else f"value-{i}".encode() * (1 + i % 5) for i in range(n + offset)
    ]
    return pa.record_batch([pa.array(keys), pa.array(values, pa.binary())], names=["key", "value"]).slice(offset, n)


def test_both_paths_write_the_same_records_in_the_same_order_per_partition(kafka: KafkaEnv) -> None:
    batches = [_frame(30_000, 17), _frame(25_000, 3), _frame(1, 0)]
    # Null keys with an explicit partition column (a null or negative partition is the partitioner's
    # choice, random for a null key: those are compared as sets below).
    explicit = pa.record_batch(
        [
            pa.array([None if i % 3 else f"k{i}" for i in range(5_000)]),
            pa.array([f"p{i}" for i in range(5_000)], pa.binary()),
            pa.array([i % 4 for i in range(5_000)], pa.int32()),
        ],
        names=["key", "value", "partition"],
    )
    results: dict[str, dict[int, list[tuple[Any, ...]]]] = {}
    for writer in ("python", "native"):
        topic, topic2 = kafka.topic(4), kafka.topic(4)
        c1 = _prepare(_settings(kafka, topic, writer), batches)
        c2 = _prepare(_settings(kafka, topic2, writer), [explicit])
        assert (c1.records, c2.records) == (55_001, 5_000)
        commit_prepared([c1, c2], kafka.wire, _log(kafka), run=f"same-{writer}")
        results[writer] = _by_partition(kafka.read_committed(topic))
        results[writer + "-explicit"] = _by_partition(kafka.read_committed(topic2))
    assert sum(len(v) for v in results["native"].values()) == 55_001
    assert len(results["native"]) == 4
    assert results["native"] == results["python"]
    assert results["native-explicit"] == results["python-explicit"]


def test_native_prepare_stays_open_commits_once_aborts_to_nothing_and_is_fenced(kafka: KafkaEnv) -> None:
    prefix = f"n{uuid.uuid4().hex[:8]}"
    topic = kafka.topic(3)
    settings = ExportSettings(prefix, kafka.config, topic, transaction_timeout_ms=300_000, writer="native")
    kept = _prepare(settings, [_frame(20_000)], slot=0)
    dropped = _prepare(settings, [_frame(5_000)], slot=1)
    states = kafka.describe(kept.transactional_id, dropped.transactional_id)
    for c in (kept, dropped):
        s = states[c.transactional_id]
        # The writer destroyed its librdkafka handle; the transaction outlives it, as prepared.
        assert s is not None and s.state == "Ongoing"
        assert (s.producer_id, s.producer_epoch) == (c.producer_id, c.producer_epoch)
        assert sorted(s.topic_partitions) == sorted(c.topic_partitions)
    assert kafka.read_committed(topic) == []

    abort_prepared([dropped], kafka.wire, _log(kafka), run="native-abort")
    assert kafka.read_committed(topic) == []
    commit_prepared([kept], kafka.wire, _log(kafka), run="native-commit")
    seen = kafka.read_committed(topic)
    assert len(seen) == 20_000
    assert sorted(r.value or b"" for r in seen) == sorted(v or b"" for v in _frame(20_000).column(1).to_pylist())

    # A second native writer of the same id bumps the epoch: the first one's committable is fenced.
    tid = f"{prefix}-7"
    first = NativeTransactionalWriter(kafka.config, tid, 300_000).open()
    first.produce_arrow(topic, pa.array([b"first"]))
    first_c = first.prepare()
    second = NativeTransactionalWriter(kafka.config, tid, 300_000).open()
    second.produce_arrow(topic, pa.array([b"second"]))
    second_c = second.prepare()
    assert first_c is not None and second_c is not None
    assert (second_c.producer_id, second_c.producer_epoch) != (first_c.producer_id, first_c.producer_epoch)
    with pytest.raises(RunAbortedError, match="fenced"):
        commit_prepared([first_c], kafka.wire, _log(kafka), run="native-fenced")
    commit_prepared([second_c], kafka.wire, _log(kafka), run="native-fencer")
    assert [r.value for r in kafka.read_committed(topic) if r.value in (b"first", b"second")] == [b"second"]


def test_a_headers_column_falls_back_to_the_python_loop_with_identical_records(
    kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    n = 2_000
    batch = pa.record_batch(
        [
            pa.array([f"h{i}" for i in range(n)]),
            pa.array([f"v{i}".encode() for i in range(n)], pa.binary()),
            pa.array(
                [[{"key": "trace", "value": f"t{i}".encode()}] if i % 2 else None for i in range(n)], pa.list_(HEADER)
            ),
        ],
        names=["key", "value", "headers"],
    )
    got = {}
    for writer in ("auto", "python"):
        topic = kafka.topic(3)
        with caplog.at_level(logging.INFO, logger="airflow_provider_kafka2pc.spark.job"):
            c = _prepare(_settings(kafka, topic, writer), [batch])
        commit_prepared([c], kafka.wire, _log(kafka), run=f"headers-{writer}")
        got[writer] = _by_partition(kafka.read_committed(topic))
    assert got["auto"] == got["python"]
    assert sum(1 for recs in got["auto"].values() for r in recs if r[2]) == n // 2
    assert any("python" in m and "headers column" in m for m in caplog.messages)


def test_forcing_native_where_it_cannot_write_fails_loudly(kafka: KafkaEnv) -> None:
    from airflow_provider_kafka2pc.txn.kafka.native import NativeUnsupportedError

    batch = pa.record_batch([pa.array([b"v"]), pa.array([None], pa.list_(HEADER))], names=["value", "headers"])
    settings = _settings(kafka, kafka.topic(1), "native", delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    with pytest.raises(NativeUnsupportedError, match="headers"):
        list(write_partition(settings, 0, 0, iter([batch])))


def test_a_record_over_the_topic_limit_is_named_and_the_failed_prepare_aborts_its_own_transaction(
    kafka: KafkaEnv,
) -> None:
    """The broker refuses the batch (MSG_SIZE_TOO_LARGE in the delivery-report events): the error
    names topic, partition, the largest record and both limits, as the Python writer's does, and
    the writer aborts its own transaction (its purged records' reports served meanwhile)."""
    from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError

    topic = kafka.topic(1, config={"max.message.bytes": "20000"})
    big = os.urandom(50_000)  # incompressible: the limit applies to the compressed batch
    values = pa.array([b"small"] * 1000 + [big] + [b"small"] * 1000, pa.binary())
    settings = _settings(kafka, topic, "native")
    with pytest.raises(DeliveryError) as failed:
        _prepare(settings, [pa.record_batch([values], names=["value"])])
    message = str(failed.value)
    assert f"{topic} partition 0" in message and "max.message.bytes is 20000" in message, message
    assert "a record of 50000 bytes" in message and "message.max.bytes 1000000" in message, message
    assert kafka.open_transactions(settings.transactional_id_prefix) == []
    assert kafka.read_committed(topic) == []


def test_a_record_over_the_producer_limit_is_refused_locally_and_named(kafka: KafkaEnv) -> None:
    from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError

    topic = kafka.topic(2)
    settings = _settings(kafka, topic, "native", delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    values = pa.array([b"a", b"x" * 2_000_000, b"b"], pa.binary())
    with pytest.raises(
        DeliveryError, match=r"MSG_SIZE_TOO_LARGE: a record of 2000000 bytes .* message.max.bytes 1000000"
    ):
        list(write_partition(settings, 0, 0, iter([pa.record_batch([values], names=["value"])])))


def test_native_writer_over_sasl_ssl_names_a_missing_acl_and_then_commits(kafka_secure: KafkaEnv) -> None:
    """SCRAM-SHA-512 over TLS through the wheel's librdkafka, as the exporter user: without the
    TransactionalId ACL the writer's own error names it (the Python writer's helper, reused); with
    it, the native prepare commits and reads back once. The password shows in no error."""
    from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
    from tests.conftest import SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD
    from tests.helpers.acls import Acl, set_acls

    env = kafka_secure
    principal = f"User:{SECURE_EXPORTER}"
    topic, prefix = env.topic(2), f"nsec{uuid.uuid4().hex[:8]}"
    config = {**env.config, "sasl.username": SECURE_EXPORTER, "sasl.password": SECURE_EXPORTER_PASSWORD}
    try:
        set_acls(env, principal, {Acl("Topic", topic, "LITERAL", "Write")})
        with pytest.raises(KafkaAuthorizationError, match=f"TransactionalId.*{prefix}") as denied:
            NativeTransactionalWriter(config, f"{prefix}-0", 300_000, id_prefix=prefix).open()
        assert SECURE_EXPORTER_PASSWORD not in str(denied.value)

        set_acls(
            env,
            principal,
            {Acl("Topic", topic, "LITERAL", "Write"), Acl("TransactionalId", prefix, "PREFIXED", "Write")},
        )
        w = NativeTransactionalWriter(config, f"{prefix}-0", 300_000, id_prefix=prefix).open()
        w.produce_arrow(topic, pa.array([f"v{i}" for i in range(1000)]), pa.array([f"k{i}" for i in range(1000)]))
        c = w.prepare()
        assert c is not None and c.records == 1000
    finally:
        set_acls(env, principal, set())
    commit_prepared([c], env.wire, DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}"), run="nsec")
    assert sorted(r.value for r in env.read_committed(topic)) == sorted(f"v{i}".encode() for i in range(1000))


def test_a_full_local_queue_is_waited_out_and_the_order_kept(kafka: KafkaEnv) -> None:
    """queue.buffering.max.messages=500 against 30,000-record batches: rd_kafka_produce_batch refuses
    everything after the first record that found the queue full, the writer retries from there."""
    topic = kafka.topic(2)
    config = {**kafka.config, "queue.buffering.max.messages": 500}
    n = 30_000
    batch = pa.record_batch(
        [pa.array([f"v{i}".encode() for i in range(n)], pa.binary()), pa.array([i % 2 for i in range(n)], pa.int32())],
        names=["value", "partition"],
    )
    settings = ExportSettings(
        f"nq{uuid.uuid4().hex[:8]}", config, topic, transaction_timeout_ms=300_000, writer="native"
    )
    c = _prepare(settings, [batch, batch.slice(10)])
    assert c.records == 2 * n - 10
    commit_prepared([c], kafka.wire, _log(kafka), run="queue-full")
    got = _by_partition(kafka.read_committed(topic))
    for p in (0, 1):
        want = [f"v{i}".encode() for i in range(n) if i % 2 == p] + [
            f"v{i}".encode() for i in range(10, n) if i % 2 == p
        ]
        assert [v for _k, v, _h in got[p]] == want


@pytest.mark.parametrize("writer", ["native", "python"])
def test_a_partition_the_topic_does_not_have_is_named_and_nothing_stays_open(kafka: KafkaEnv, writer: str) -> None:
    """A partition column naming partition 7 of a 4-partition topic: on both paths the prepare fails
    naming the unknown partition, aborts its own transaction, and nothing becomes visible."""
    from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError

    topic = kafka.topic(4)
    batch = pa.record_batch(
        [pa.array([b"k0", b"k1", b"k2"]), pa.array([b"v0", b"v1", b"v2"]), pa.array([1, 7, 2], pa.int32())],
        names=["key", "value", "partition"],
    )
    settings = _settings(kafka, topic, writer)
    with pytest.raises(DeliveryError, match="UNKNOWN_PARTITION") as failed:
        _prepare(settings, [batch])
    assert f"{topic} has no partition 7" in str(failed.value), str(failed.value)
    assert kafka.open_transactions(settings.transactional_id_prefix) == []
    assert kafka.read_committed(topic) == []


@pytest.fixture(scope="module")
def kafka_auto_create(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A broker that creates a topic on the first request naming it (Kafka's default, off in the others)."""
    from tests.conftest import _start

    yield from _start(tmp_path_factory, "kafka1autocreate", 1, extra={"auto.create.topics.enable": "true"})


@pytest.mark.parametrize("writer", ["native", "python"])
def test_a_topic_the_broker_creates_on_first_use_gets_every_record_once(
    kafka_auto_create: KafkaEnv, writer: str
) -> None:
    """The first metadata of an auto-created topic has no partitions yet (LEADER_NOT_AVAILABLE):
    the native writer waits for them instead of counting records librdkafka parks and counts later
    (before: 'statistics count 6 records … which produced 3', and the transaction left open)."""
    kafka = kafka_auto_create
    topic = f"auto_{uuid.uuid4().hex[:8]}"
    batch = pa.record_batch(
        [pa.array([b"k0", b"k1", b"k2", None]), pa.array([b"v0", b"v1", b"v2", b"v3"]), pa.array([0, 0, 0, None])],
        names=["key", "value", "partition"],
    )
    settings = _settings(kafka, topic, writer)
    c = _prepare(settings, [batch])
    commit_prepared([c], kafka.wire, _log(kafka), run=f"auto-{writer}")
    seen = kafka.read_committed(topic)
    assert sorted(r.value or b"" for r in seen) == [b"v0", b"v1", b"v2", b"v3"]
    assert {r.partition for r in seen if r.key is not None} == {0}
    assert kafka.open_transactions(settings.transactional_id_prefix) == []


def test_a_partition_the_topic_lacks_is_refused_at_once_with_librdkafkas_own_partitioner(kafka: KafkaEnv) -> None:
    """With another ``partitioner`` the records without a partition go through librdkafka's: a
    named partition the topic lacks is refused before librdkafka sees it (librdkafka keeps such a
    record of a mixed batch, and the abort then waits out its timeout), and nothing stays open."""
    import time

    from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError

    topic = kafka.topic(4)
    batch = pa.record_batch(
        [pa.array([b"k0", b"k1", b"k2"]), pa.array([b"v0", b"v1", b"v2"]), pa.array([1, None, 7], pa.int32())],
        names=["key", "value", "partition"],
    )
    settings = _settings(kafka, topic, "native")
    settings = ExportSettings(
        settings.transactional_id_prefix,
        {**kafka.config, "partitioner": "consistent_random"},
        topic,
        transaction_timeout_ms=300_000,
        writer="native",
    )
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=f"{topic} has no partition 7"):
        _prepare(settings, [batch])
    assert time.monotonic() - started < 15
    assert kafka.open_transactions(settings.transactional_id_prefix) == []
    assert kafka.read_committed(topic) == []
