"""One diagnosis of "cannot reach Kafka" (issue 32): librdkafka's connection errors read as causes,
worded once, with the address, for the Test button, the CLI, the page and the tasks alike."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.kafka2pc import connect_timeout_s
from airflow_provider_kafka2pc.txn.kafka import reachability
from airflow_provider_kafka2pc.txn.kafka.reachability import (
    REFUSED,
    Failure,
    answering_bootstrap,
    bootstrap_addresses,
    failure_of,
    unreachable_message,
)
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

REFUSED_TEXT = (
    "127.0.0.1:19999/bootstrap: Connect to ipv4#127.0.0.1:19999 failed: Connection refused (after 0ms in state CONNECT)"
)
UNRESOLVED_TEXT = (
    "nohost.invalid:9092/bootstrap: Failed to resolve 'nohost.invalid:9092': Name or service not known "
    "(after 1ms in state CONNECT)"
)
NOT_KAFKA_TEXT = (
    "sasl_ssl://b:9093/1: Receive failed: Invalid response size 1213486160 (0..100000000): increase "
    "receive.message.max.bytes (after 0ms in state APIVERSION_QUERY, 4 identical error(s) suppressed)"
)


def test_librdkafka_connection_errors_read_as_causes() -> None:
    assert failure_of(REFUSED_TEXT) == Failure("127.0.0.1:19999", REFUSED, True)
    assert failure_of(UNRESOLVED_TEXT) == Failure(
        "nohost.invalid:9092", "the host name nohost.invalid could not be resolved (Name or service not known)", True
    )
    assert failure_of(NOT_KAFKA_TEXT) == Failure(
        "b:9093",
        "Receive failed: Invalid response size 1213486160 (0..100000000): increase receive.message.max.bytes",
        False,
    )
    assert failure_of("1/1 brokers are down") is None  # about no one broker


def test_bootstrap_addresses_are_named_as_librdkafka_names_its_brokers() -> None:
    assert bootstrap_addresses(" b1:9093, b2 ,SSL://b3:1,[::1]:9,[::1]") == [
        "b1:9093",
        "b2:9092",
        "b3:1",
        "[::1]:9",
        "[::1]:9092",
    ]


def test_one_wording_per_cause_with_the_address() -> None:
    refused = failure_of(REFUSED_TEXT)
    unresolved = failure_of(UNRESOLVED_TEXT)
    assert refused is not None and unresolved is not None
    assert unreachable_message("127.0.0.1:19999", 10, [refused, refused]) == (
        "cannot reach Kafka at 127.0.0.1:19999: connection refused (is a broker listening on that port?)"
    )
    assert unreachable_message("nohost.invalid:9092", 10, [unresolved]) == (
        "cannot reach Kafka at nohost.invalid:9092: the host name nohost.invalid could not be resolved "
        "(Name or service not known)"
    )
    # Each broker's own cause, in the order of the bootstrap list.
    both = "nohost.invalid:9092,127.0.0.1:19999"
    assert unreachable_message(both, 10, [refused, unresolved]) == (
        f"cannot reach Kafka at {both}: nohost.invalid:9092: the host name nohost.invalid could not be resolved "
        "(Name or service not known); 127.0.0.1:19999: connection refused (is a broker listening on that port?)"
    )
    # Nothing said: a timeout, named as one, with the timeout in force.
    assert unreachable_message("b:9092", 2.5, []) == "cannot reach Kafka at b:9092: no answer within 2.5 s (timed out)"
    # Something said that is no definite cause: the timeout, and what librdkafka said, never a guess.
    not_kafka = failure_of(NOT_KAFKA_TEXT)
    assert not_kafka is not None
    assert unreachable_message("b:9093", 10, [not_kafka]) == (
        "cannot reach Kafka at b:9093: no answer within 10 s; Receive failed: Invalid response size 1213486160 "
        "(0..100000000): increase receive.message.max.bytes"
    )
    # A broker that said nothing may still answer: no cause is claimed for it, so none for the cluster.
    assert unreachable_message("127.0.0.1:19999,b2", 10, [refused]) == (
        f"cannot reach Kafka at 127.0.0.1:19999,b2: no broker answered within 10 s: 127.0.0.1:19999: {REFUSED}; "
        "b2:9092: no answer"
    )


class FakeError:
    def __init__(self, text: str, code: int = -195) -> None:
        self.text, self.number = text, code

    def code(self) -> int:
        return self.number

    def str(self) -> str:
        return self.text


class FakeAdmin:
    """An AdminClient whose metadata request never answers and whose error callback tells ``texts``."""

    def __init__(self, texts: list[str], conf: dict[str, Any]) -> None:
        self.texts, self.cb = texts, conf["error_cb"]
        self.conf = conf

    def list_topics(self, timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException

        time.sleep(timeout)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    def poll(self, timeout: float) -> int:
        for text in self.texts:
            self.cb(FakeError(text))
        return len(self.texts)


def probe(monkeypatch: pytest.MonkeyPatch, texts: list[str]) -> list[dict[str, Any]]:
    built: list[dict[str, Any]] = []

    def admin(conf: dict[str, Any]) -> FakeAdmin:
        built.append(conf)
        return FakeAdmin(texts, conf)

    monkeypatch.setattr("confluent_kafka.admin.AdminClient", admin)
    return built


def test_every_bootstrap_broker_refused_is_answered_after_a_short_grace_not_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = probe(monkeypatch, [REFUSED_TEXT])
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as failed:
        reachability.check_reachable({"bootstrap.servers": "127.0.0.1:19999", "sasl.password": "pw"}, timeout_s=8)
    assert time.monotonic() - started < 3
    assert str(failed.value) == f"cannot reach Kafka at 127.0.0.1:19999: {REFUSED}"
    assert built[0]["reconnect.backoff.max.ms"] <= 500  # retried often: a second address is tried in the grace


def test_a_task_waits_out_a_refusing_broker_until_the_timeout_and_then_names_the_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Patient (the tasks): a broker restarting refuses for a while; the task asks again until the
    connect timeout, then says the same words the Test button says at once."""
    probe(monkeypatch, [REFUSED_TEXT])
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as failed:
        reachability.check_reachable({"bootstrap.servers": "127.0.0.1:19999"}, timeout_s=2.5, patient=True)
    assert time.monotonic() - started >= 2.5
    assert str(failed.value) == f"cannot reach Kafka at 127.0.0.1:19999: {REFUSED}"


def test_one_broker_refusing_and_one_silent_waits_for_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    probe(monkeypatch, [REFUSED_TEXT])
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as failed:
        reachability.check_reachable({"bootstrap.servers": "127.0.0.1:19999,b2:9092"}, timeout_s=1.5)
    assert time.monotonic() - started >= 1.5  # b2 may still answer: no cause is claimed for it
    assert str(failed.value) == (
        f"cannot reach Kafka at 127.0.0.1:19999,b2:9092: no broker answered within 1.5 s: 127.0.0.1:19999: {REFUSED}; "
        "b2:9092: no answer"
    )


def test_secrets_never_reach_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    probe(monkeypatch, ["b:9092/bootstrap: something about s3cret-pw (after 1ms in state UP)"])
    with pytest.raises(BrokerUnavailableError) as failed:
        reachability.check_reachable({"bootstrap.servers": "b:9092", "sasl.password": "s3cret-pw"}, timeout_s=0.6)
    assert "s3cret-pw" not in str(failed.value) and "***" in str(failed.value)


def test_the_connect_timeout_is_a_field_of_the_connection() -> None:
    assert connect_timeout_s("kafka2pc", {}) == reachability.DEFAULT_CONNECT_TIMEOUT_S == 10
    assert connect_timeout_s("kafka2pc", {"connect_timeout_s": "2.5"}) == 2.5  # the classic form saves text
    assert connect_timeout_s("kafka2pc", {"connect_timeout_s": 30}) == 30
    assert connect_timeout_s("kafka", {"connect_timeout_s": 30}) == 10  # kafka type: its extra is librdkafka's
    for bad in (0, -1, "soon", True, float("inf")):
        with pytest.raises(Kafka2PCConfigError, match=r"'Connect timeout \(s\)': must be a number of seconds > 0"):
            connect_timeout_s("kafka2pc", {"connect_timeout_s": bad})


def _silent_server() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket whose accept queue is full: the kernel drops further SYNs, as a host cut off
    the network does (no refusal, no answer)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(server.getsockname())
        fillers.append(c)
    time.sleep(0.2)
    return server, fillers


def test_the_commit_sides_client_bootstraps_from_the_servers_that_answer() -> None:
    """kafka-python gives one randomly picked bootstrap server its whole deadline: a silent one failed
    the client while others answered. The silent and the refusing server are left out, quickly, and
    the others keep their order; an entry that is not plainly host:port is kept unasked."""
    ups = []
    for _ in range(2):
        up = socket.socket()
        up.bind(("127.0.0.1", 0))
        up.listen(8)
        ups.append(up)
    silent, fillers = _silent_server()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    first, second = (f"PLAINTEXT://127.0.0.1:{u.getsockname()[1]}" for u in ups)
    silent_at, refused_at = f"127.0.0.1:{silent.getsockname()[1]}", f"127.0.0.1:{refused_port}"
    try:
        started = time.monotonic()
        assert answering_bootstrap([silent_at, second, refused_at, first, second], 10.0) == [second, first, second]
        assert time.monotonic() - started < 5, "waited for the silent server instead of the grace"
        assert answering_bootstrap([refused_at, "::1", first], 10.0) == ["::1", first]  # a bare IPv6 literal
        # None answers: all are kept, so the client's own error names them; one is never probed.
        assert answering_bootstrap([silent_at, refused_at], 1.0) == [silent_at, refused_at]
        assert answering_bootstrap([silent_at], 1.0) == [silent_at]
    finally:
        for s in (*ups, silent, *fillers):
            s.close()
