"""The decision log under a broker crash, without a broker: every read and append waits out what a
leader change answers within ``budget_s``, never raises a raw KafkaException, never sends a record
twice, and past the budget names the topic, the partition, the error and what to do."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from airflow_provider_kafka2pc.txn.kafka import decision_topic_client
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError, DecisionLogUnavailableError
from airflow_provider_kafka2pc.txn.protocol.decisions import replay
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError
from airflow_provider_kafka2pc.txn.protocol.records import Covered, Entry, Kind, new_decision


def _log(timeout_s: float = 0.5, topic: str = "decisions") -> DecisionLog:
    log = DecisionLog({"bootstrap.servers": "127.0.0.1:1"}, topic=topic, timeout_s=timeout_s)
    log._ready = True  # the topic is known: these tests are about reads and appends
    return log


def _decision(kind: Kind, tid: str = "orders-0") -> Any:
    return new_decision(kind, [Covered(tid, 7, 1, 10, ("t-0",), None)], "dag/run", "commit", ("orders",), 1)


def test_replay_keeps_a_key_at_its_newest_offset_so_a_decision_sent_twice_could_flip_a_ruling() -> None:
    """Why append never produces a record a second time: a COMMIT in force, a void ABORT after it,
    and the same COMMIT again would hand the transaction to the ABORT."""
    commit, abort = _decision(Kind.COMMIT), _decision(Kind.ABORT)
    once = [Entry(0, 1, commit.key, commit.to_json()), Entry(1, 2, abort.key, abort.to_json())]
    ref = commit.txns[0].ref
    assert replay(once).ruling[ref] == commit.decision_id
    twice = [*once, Entry(2, 3, commit.key, commit.to_json())]
    assert replay(twice).ruling[ref] == abort.decision_id


class Producer:
    """Acknowledges nothing (a dead leader) or refuses with ``error``."""

    def __init__(self, error: Any = None) -> None:
        self.error, self.produced, self.purged = error, 0, False
        self.callbacks: list[Any] = []

    def produce(self, topic: str, key: bytes, value: bytes | None, partition: int, on_delivery: Any) -> None:
        self.produced += 1
        self.callbacks.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        assert timeout <= 1.0  # the budget of timeout_s=0.5
        if self.error is None:
            return len(self.callbacks)
        for cb in self.callbacks:
            cb(self.error, None)
        self.callbacks = []
        return 0

    def purge(self, **_kw: Any) -> None:
        self.purged = True


def test_an_append_left_unanswered_past_its_budget_is_uncertain_named_and_sent_once() -> None:
    log = _log()
    producer = log._producer = Producer()
    decision = _decision(Kind.COMMIT)
    with pytest.raises(DecisionLogUnavailableError) as info:
        log.decide(decision)
    message = str(info.value)
    assert producer.produced == 1 and producer.purged and log._producer is None
    assert message.startswith("decision log unavailable: decision topic 'decisions' (Kafka at 127.0.0.1:1)")
    assert "The write of 1 record(s) is uncertain: 0 acknowledged, 1 not (timed out or unanswered)" in message
    assert "Retry the task once the brokers are back" in message
    assert message.endswith("kafka2pc describe --prefix orders --decision-topic decisions")
    assert isinstance(info.value, BrokerUnavailableError)  # the CLI's "Kafka failing"


def test_a_delivery_that_timed_out_is_uncertain_too() -> None:
    log = _log()
    log._producer = Producer(KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"))
    with pytest.raises(DecisionLogUnavailableError, match="last error _MSG_TIMED_OUT") as info:
        log.append([(b"k", b"v")])
    # A record that timed out is not acknowledged (the soak once read "0 acknowledged, 0 without an answer").
    assert "The write of 1 record(s) is uncertain: 0 acknowledged, 1 not (timed out or unanswered)" in str(info.value)


def test_a_refused_delivery_names_the_acl_and_any_other_is_a_decision_log_error() -> None:
    log = _log()
    log._producer = Producer(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(Exception, match="may not Write Topic 'decisions'"):
        log.append([(b"k", b"v")])
    log._producer = Producer(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    with pytest.raises(DecisionLogError) as info:
        log.append([(b"k", b"v")])
    assert not isinstance(info.value, DecisionLogUnavailableError)


class Message:
    def __init__(self, offset: int, error: Any = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> Any:
        return self._error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"kafka2pc.prefix:orders"

    def value(self) -> bytes:
        return b'{"prefix":"orders","owner":"dag.export","at_ms":1}'

    def timestamp(self) -> tuple[int, int]:
        return 2, 1000 + self._offset


class Consumer:
    """A partition of two records whose leader dies: the end offset times out once, the fetch meets
    a dropped connection and a destroyed broker handle before the records arrive."""

    script: ClassVar[list[Any]] = []

    def __init__(self, _conf: Any) -> None:
        self.watermark_failures = 1

    def get_watermark_offsets(self, _tp: Any, timeout: float) -> tuple[int, int]:
        if self.watermark_failures:
            self.watermark_failures -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get watermark offsets: Local: Timed out"))
        return 0, 2

    def assign(self, _tps: Any) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        step = Consumer.script.pop(0) if Consumer.script else []
        if isinstance(step, BaseException):
            raise step
        return list(step)

    def close(self) -> None:
        pass


def test_a_read_waits_out_a_dead_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("confluent_kafka.Consumer", Consumer)
    Consumer.script = [
        [Message(0, KafkaError(KafkaError._TRANSPORT, "Disconnected"))],
        [Message(0, KafkaError(KafkaError._DESTROY_BROKER, "Broker handle destroyed without termination"))],
        [Message(0, KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))],
        [Message(0), Message(1)],
    ]
    assert [e.offset for e in _log().scan()] == [0, 1]


def test_a_read_past_its_budget_names_the_partition_and_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("confluent_kafka.Consumer", Consumer)
    monkeypatch.setattr(decision_topic_client, "_PAUSE_S", 0.01)
    down = [Message(0, KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))]
    Consumer.script = [down] * 100_000
    log = _log(timeout_s=0.1)
    log.prefixes.add("orders")
    with pytest.raises(DecisionLogUnavailableError) as info:
        list(log.scan())
    message = str(info.value)
    assert "partition 0 of decision topic 'decisions'" in message
    assert "while reading it up to offset 1; last error _ALL_BROKERS_DOWN: 1/1 brokers are down" in message
    assert "Nothing was decided or ended by this call." in message


def test_a_read_never_raises_a_raw_kafka_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("confluent_kafka.Consumer", Consumer)
    Consumer.script = [KafkaException(KafkaError(KafkaError._FATAL, "fatal"))]
    with pytest.raises(DecisionLogError, match="reading it up to offset 1 failed"):
        list(_log().scan())


def test_the_budget_is_twice_the_timeout_and_shared_by_one_reads_steps() -> None:
    log = _log(timeout_s=30)
    assert log.budget_s == 60
    with log._budget() as outer, log._budget() as inner:
        assert inner is outer


def test_the_describe_hint_names_no_placeholder_without_a_prefix() -> None:
    log = DecisionLog({"bootstrap.servers": "b:9092"})
    hint = log._describe_hint()
    assert "<" not in hint and "PREFIX" not in hint and "--decision-topic" not in hint
    log.keep_run_of(["orders", "billing"], "dag/run")
    assert log._describe_hint().endswith("kafka2pc describe --prefix billing ; kafka2pc describe --prefix orders")
