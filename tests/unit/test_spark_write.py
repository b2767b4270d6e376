"""``write_partition`` and the writers' proof of delivery, against a fake confluent-kafka Producer.

The fast loop (key/value only) and the general loop (topic, partition or headers columns) must
hand librdkafka exactly the same records for the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from airflow_provider_kafka2pc.txn.kafka.writer import DeliveryWriter, TransactionalWriter, enqueued_by_partition
from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError, Kafka2PCError
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.partition_writer import write_partition

TOPIC = "events"
HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
Record = tuple[str, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...] | None]


class FakeError:
    def name(self) -> str:
        return "MSG_SIZE_TOO_LARGE"

    def str(self) -> str:
        return "Broker: Message size too large"


class FakeMessage:
    def __init__(self, topic: str, partition: int, value: bytes | None = None, key: bytes | None = None) -> None:
        self._topic, self._partition, self._value, self._key = topic, partition, value, key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key


class FakeProducer:
    """Records what produce() receives, normalised; scripted queue-full and failed deliveries."""

    instances: ClassVar[list[FakeProducer]] = []
    full_every = 0  # raise BufferError on every n-th produce() call (once per record)
    fail_values: ClassVar[set[bytes]] = set()  # records whose delivery fails

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.records: list[Record] = []
        self.pending: list[Record] = []
        self.calls = 0
        self.polls = 0
        self.aborted = False
        FakeProducer.instances.append(self)

    def list_topics(self, timeout: float) -> None:
        return None

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        assert callback is None and on_delivery is None and timestamp == 0
        if not all(b is None or isinstance(b, bytes) for b in (value, key)):
            raise TypeError("expected bytes or None")  # as confluent-kafka does (z#)
        self.calls += 1
        if self.full_every and self.calls % self.full_every == 0:
            raise BufferError("Local: Queue full")
        record = (topic, value, key, partition, tuple(headers) if headers else None)
        self.records.append(record)
        self.pending.append(record)

    def poll(self, timeout: float = -1) -> int:
        self.polls += 1
        served, self.pending = self.pending, []
        for topic, value, key, partition, _ in served:
            if value in self.fail_values:  # only errors reach Python (delivery.report.only.error)
                self.config["on_delivery"](FakeError(), FakeMessage(topic, max(partition, 0), value, key))
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def init_transactions(self, timeout: float = -1) -> None:
        return None

    def begin_transaction(self) -> None:
        return None

    def abort_transaction(self, timeout: float = -1) -> None:
        self.aborted = True


@pytest.fixture(autouse=True)
def fake_producer(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeProducer]]:
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", FakeProducer)
    FakeProducer.instances = []
    FakeProducer.full_every = 0
    FakeProducer.fail_values = set()
    yield FakeProducer


def _settings(topic: str | None = TOPIC, **kw: Any) -> ExportSettings:
    # The Python loop against the fake Producer (the native path is tested in test_native.py and on a broker).
    kw.setdefault("writer", "python")
    return ExportSettings(
        "t", {"bootstrap.servers": "unused:9092"}, topic, delivery_guarantee=DeliveryGuarantee.NONE, **kw
    )


def _run(batches: list[pa.RecordBatch], settings: ExportSettings | None = None) -> tuple[list[Record], dict[str, Any]]:
    out = list(write_partition(settings or _settings(), 3, 0, iter(batches)))
    assert len(out) == 1
    row = out[0].to_pylist()[0]
    records = [r for p in FakeProducer.instances for r in p.records]
    return records, row


def _batch(**cols: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))


KEYS = ["k0", None, "k2", "é"]
VALUES = ["v0", "v1", None, "ü-value"]


def test_the_fast_loop_and_the_general_loop_produce_identical_records() -> None:
    plain = _batch(key=pa.array(KEYS, pa.string()), value=pa.array(VALUES, pa.string()))
    general = _batch(
        key=pa.array(KEYS, pa.string()),
        value=pa.array(VALUES, pa.string()),
        topic=pa.array([None, TOPIC, "", None], pa.string()),  # null and "" fall back to the default
        partition=pa.array([None, -1, None, -7], pa.int32()),  # null or negative: the partitioner
        headers=pa.array([None, [], None, []], pa.list_(HEADER)),  # null or empty: no headers
    )
    fast, fast_row = _run([plain])
    FakeProducer.instances = []
    slow, slow_row = _run([general])
    expected = [
        (TOPIC, b"v0", b"k0", -1, None),
        (TOPIC, b"v1", None, -1, None),
        (TOPIC, None, b"k2", -1, None),
        (TOPIC, "ü-value".encode(), "é".encode(), -1, None),
    ]
    assert fast == slow == expected
    assert fast_row == slow_row
    assert fast_row["records"] == 4 and fast_row["bytes"] == sum(len(b or b"") for r in expected for b in r[1:3])
    assert json.loads(fast_row["counts"]) == {TOPIC: 4}


def test_binary_columns_and_no_key_column_take_the_fast_loop() -> None:
    records, row = _run([_batch(value=pa.array([b"\x00\xff", None], pa.binary()))])
    assert records == [(TOPIC, b"\x00\xff", None, -1, None), (TOPIC, None, None, -1, None)]
    assert (row["records"], row["bytes"]) == (2, 2)


def test_the_general_loop_keeps_topics_partitions_and_headers_per_row() -> None:
    headers = pa.array(
        [[{"key": "a", "value": b"1"}, {"key": "b", "value": None}], None, [{"key": "dup", "value": b"\x00"}]],
        pa.list_(HEADER),
    )
    batch = _batch(
        value=pa.array([b"x", b"y", b"z"], pa.binary()),
        topic=pa.array(["other", None, "other"], pa.string()),
        partition=pa.array([2, None, 0], pa.int64()),
        headers=headers,
    )
    records, row = _run([batch.slice(0, 3)])
    assert records == [
        ("other", b"x", None, 2, (("a", b"1"), ("b", None))),
        (TOPIC, b"y", None, -1, None),
        ("other", b"z", None, 0, (("dup", b"\x00"),)),
    ]
    assert json.loads(row["counts"]) == {"other": 2, TOPIC: 1}


def test_string_header_values_are_utf8_and_sliced_batches_keep_their_rows() -> None:
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.string())])
    batch = _batch(
        value=pa.array(["0", "1", "2"], pa.string()),
        headers=pa.array([[{"key": "h", "value": "zero"}], [{"key": "h", "value": "é"}], None], pa.list_(header)),
    )
    records, _ = _run([batch.slice(1)])
    assert records == [(TOPIC, b"1", None, -1, (("h", "é".encode()),)), (TOPIC, b"2", None, -1, None)]


def test_a_row_without_any_topic_fails_clearly() -> None:
    batch = _batch(value=pa.array(["a", "b"]), topic=pa.array(["t", None], pa.string()))
    with pytest.raises(Kafka2PCError, match="row 1 of partition 3 has no topic"):
        _run([batch], _settings(None))
    with pytest.raises(Kafka2PCError, match="partition 3 has no topic column and there is no default topic"):
        _run([_batch(value=pa.array(["a"]))], _settings(None))


def test_empty_batches_open_no_producer() -> None:
    empty = _batch(value=pa.array([], pa.string()))
    assert list(write_partition(_settings(), 0, 0, iter([empty, empty]))) == []
    assert FakeProducer.instances == []


def test_the_injected_failure_stops_after_exactly_n_records() -> None:
    batches = [_batch(value=pa.array([str(i) for i in range(lo, lo + 10)])) for lo in (0, 10, 20)]
    with pytest.raises(RuntimeError, match="injected failure in partition 3, attempt 0"):
        _run(batches, _settings(fail_first_attempt=(3, 15)))
    assert [r[1] for r in FakeProducer.instances[0].records] == [str(i).encode() for i in range(15)]


def test_a_full_local_queue_is_waited_out_without_losing_or_reordering_records() -> None:
    FakeProducer.full_every = 3
    batch = _batch(key=pa.array([str(i) for i in range(50)]), value=pa.array([str(i) for i in range(50)]))
    records, row = _run([batch])
    assert [r[1] for r in records] == [str(i).encode() for i in range(50)] and row["records"] == 50


def test_a_failed_delivery_raises_delivery_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kafka2pc.txn.kafka import access

    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(access, "topic_config_value", lambda config, topic, key: asked.append((topic, key)) or "2")
    FakeProducer.fail_values = {b"2"}
    batch = _batch(value=pa.array([str(i) for i in range(5)]))
    with pytest.raises(DeliveryError, match=r"1 record\(s\) of transaction 'partition 3'.*MSG_SIZE_TOO_LARGE") as e:
        _run([batch])
    # The record that was refused, where, and the limits: the topic's (read when it happens) and the producer's.
    assert f"a record of 1 bytes (key + value; the largest refused) to {TOPIC} partition 0" in str(e.value)
    assert "the topic's max.message.bytes is 2, the producer's message.max.bytes 1000000" in str(e.value)
    assert asked == [(TOPIC, "max.message.bytes")]


def test_a_failed_prepare_aborts_its_own_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rather than leaving it Ongoing until the broker's timeout aborts it."""
    from airflow_provider_kafka2pc.txn.kafka import access

    monkeypatch.setattr(access, "topic_config_value", lambda *a: None)
    FakeProducer.fail_values = {b"bad"}
    w = TransactionalWriter({"transaction.timeout.ms": 60000}, "orders-0").open()
    w.produce(TOPIC, b"good")
    w.produce(TOPIC, b"bad")
    with pytest.raises(DeliveryError, match=r"the topic's max\.message\.bytes is unknown"):
        w.prepare()
    assert FakeProducer.instances[-1].aborted


def test_success_reports_are_not_sent_to_python() -> None:
    w = DeliveryWriter({}, "w").open()
    assert w._config["delivery.report.only.error"] is True
    w = DeliveryWriter({"delivery.report.only.error": False}, "w").open()
    assert w._config["delivery.report.only.error"] is True  # the proof depends on it


def test_a_produce_that_raised_can_never_be_prepared() -> None:
    w = DeliveryWriter({}, "w").open()
    with pytest.raises(TypeError):
        w.produce_batch(TOPIC, [b"ok", 5], None)  # type: ignore[list-item]
    with pytest.raises(DeliveryError, match="produce\\(\\) raised TypeError"):
        w.finish()


def test_single_records_count_bytes_and_topics() -> None:
    w = DeliveryWriter({}, "w").open()
    w.produce(TOPIC, b"abc", b"k", partition=-3, headers=[("h", b"v")])
    w.produce("other", None, None, partition=1)
    assert FakeProducer.instances[0].records == [
        (TOPIC, b"abc", b"k", -1, (("h", b"v"),)),
        ("other", None, None, 1, None),
    ]
    assert (w.records, w.bytes, w.counts_by_topic) == (2, 4, {TOPIC: 1, "other": 1})
    w.finish()


def _stats(partitions: dict[str, dict[int, int]], pid: int = 7) -> str:
    topics = {
        t: {"partitions": {str(p): {"partition": p, "msgs": n} for p, n in ps.items()}} for t, ps in partitions.items()
    }
    return json.dumps({"eos": {"producer_id": pid, "producer_epoch": 2}, "topics": topics})


def test_statistics_give_the_partitions_of_every_record_without_the_unassigned_one() -> None:
    stats = json.loads(_stats({"a": {-1: 3, 0: 2, 1: 0, 2: 1}, "b": {0: 4}}))
    assert enqueued_by_partition(stats) == {("a", 0): 2, ("a", 2): 1, ("b", 0): 4}

    w = TransactionalWriter({}, "tid-0", transaction_timeout_ms=60_000)
    w.records = 7
    w._on_stats(_stats({"a": {0: 2}}))
    assert w._partitions_of_every_record() is None  # an older report: wait for the next
    w._on_stats(_stats({"a": {-1: 3, 0: 2, 2: 1}, "b": {0: 4}}))
    assert w._partitions_of_every_record() == (("a", 0), ("a", 2), ("b", 0))
    assert w._eos == (7, 2)
    w._on_stats(_stats({"a": {0: 8}}))
    with pytest.raises(Kafka2PCError, match="cannot be told"):
        w._partitions_of_every_record()
