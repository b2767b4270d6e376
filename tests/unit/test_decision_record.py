"""Decision, outcome and run records as they travel through the decision topic, the state read
back from the log, and what may be logged of a config."""

from __future__ import annotations

import json

import pytest

from airflow_provider_kafka2pc.txn.kafka.config import CONNECTION_DEFAULTS, connection_only, redact
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError
from airflow_provider_kafka2pc.txn.kafka.writer import PRODUCER_DEFAULTS
from airflow_provider_kafka2pc.txn.protocol.decisions import replay
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef
from airflow_provider_kafka2pc.txn.protocol.records import (
    DECISION_KEY,
    Covered,
    DecisionRecord,
    Entry,
    Kind,
    LostTxn,
    OutcomeRecord,
    RunRecord,
    RunStatus,
    new_decision,
)
from airflow_provider_kafka2pc.txn.two_phase.ruling import committed_in
from tests.unit.fakes import MemoryDecisionLog, decision_item, ref

CONFIG = {
    "bootstrap.servers": "broker-1:9093,broker-2:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "exporter",
    "sasl.password": "hunter2",
    "ssl.key.password": "pem-secret",
    "ssl.ca.location": "/etc/ca.pem",
    "sasl.oauthbearer.config": "clientSecret=abc",
    "linger.ms": 20,
    "transactional.id": "orders-0",
    "transaction.timeout.ms": 900_000,
}
SECRETS = ("hunter2", "pem-secret", "clientSecret=abc")


COVERED = (
    Covered("orders-0", 4711, 5, 42, ("events-0", "events-3"), 1_700_000_900_000),
    Covered("orders-1", 4711, 6, 0, (), None),
)


@pytest.mark.parametrize("kind", list(Kind))
def test_decision_json_round_trip(kind: Kind) -> None:
    d = new_decision(
        kind, COVERED, "manual__2026-11-21T10:00:00+00:00", "commit", ["orders", "events"], 1_700_000_000_000
    )
    assert DecisionRecord.from_json(d.to_json()) == d
    assert d.prefixes == ("events", "orders")  # sorted, once each


def test_decision_json_carries_ids_and_counts_only() -> None:
    d = new_decision(Kind.COMMIT, COVERED, "run", "commit", ["orders"], 1)
    body = json.loads(d.to_json())
    assert set(body) == {"v", "id", "kind", "run", "actor", "prefixes", "at_ms", "txns"}
    assert body["txns"][0] == ["orders-0", 4711, 5, 42, 1_700_000_900_000, ["events-0", "events-3"]]


def test_decision_with_an_unknown_kind_does_not_parse() -> None:
    raw = json.loads(new_decision(Kind.COMMIT, COVERED, "run", "commit").to_json())
    raw["kind"] = "MAYBE"
    with pytest.raises(ValueError):
        DecisionRecord.from_json(json.dumps(raw).encode())


def test_each_decision_has_a_key_of_its_own() -> None:
    """Compaction must never replace a decision by a later record: its key is unique."""
    a = new_decision(Kind.COMMIT, COVERED, "run", "commit")
    b = new_decision(Kind.COMMIT, COVERED, "run", "commit")
    assert a.key != b.key
    assert a.key == (DECISION_KEY + a.decision_id).encode()


def test_a_decision_covers_each_id_once() -> None:
    with pytest.raises(ValueError, match="orders-0"):
        new_decision(Kind.ABORT, [COVERED[0], Covered("orders-0", 1, 0)], "run", "abort")


def test_outcome_and_run_records_round_trip() -> None:
    lost = (LostTxn(COVERED[0], "the transaction was aborted"),)
    out = OutcomeRecord("d1", frozenset({"orders-2"}), frozenset({"orders-3"}), lost)
    assert OutcomeRecord.from_json(out.to_json()) == out
    rec = RunRecord("orders", "dag/run-1", RunStatus.LOST, 2, 42, 7, "d1", lost, note="acknowledged by ops")
    assert RunRecord.from_json(rec.to_json()) == rec
    plain = RunRecord("orders", "dag/run-1", RunStatus.COMMITTED, 2, 42, 7, "d1")
    assert RunRecord.from_json(plain.to_json()) == plain
    assert "lost" not in json.loads(plain.to_json()) and "note" not in json.loads(plain.to_json())


def test_outcomes_merge_as_a_union() -> None:
    a = OutcomeRecord("d", frozenset({"orders-0"}), lost=(LostTxn(COVERED[1], "x"),))
    b = OutcomeRecord("d", frozenset({"orders-2"}), frozenset({"orders-3"}), (LostTxn(COVERED[1], "y"),))
    m = a.merge(b)
    assert m.committed == {"orders-0", "orders-2"} and m.aborted == {"orders-3"}
    assert m.lost_ids == {"orders-1"}
    assert m.resolved() == {"orders-0", "orders-1", "orders-2", "orders-3"}


SAME = TxnRef("orders-0", 4711, 5)


def state_of(kind: Kind, committed: bool = False) -> MemoryDecisionLog:
    log = MemoryDecisionLog(initial=[decision_item(kind, [SAME])])
    if committed:
        did = next(iter(log.read().decisions))
        out = OutcomeRecord(did, frozenset({"orders-0"}))
        log.append([(out.key, out.to_json())])
    return log


@pytest.mark.parametrize(
    ("kind", "committed", "decided_commit"),
    [(Kind.COMMIT, False, True), (Kind.COMMIT, True, True), (Kind.ABORT, False, False)],
)
def test_state_answers_for_the_same_transaction(kind: Kind, committed: bool, decided_commit: bool) -> None:
    state = state_of(kind, committed).read()
    d = state.ruled_by(SAME)
    assert d is not None and (d.kind is Kind.COMMIT) is decided_commit
    assert committed_in(state)(SAME) is committed


@pytest.mark.parametrize(
    "other",
    [
        TxnRef("orders-0", 4711, 6),  # next epoch: the id was reused or timed out
        TxnRef("orders-0", 4711, 4),
        TxnRef("orders-0", 4712, 5),
        TxnRef("orders-1", 4711, 5),
    ],
)
@pytest.mark.parametrize("committed", [False, True])
def test_state_says_nothing_about_another_transaction(other: TxnRef, committed: bool) -> None:
    state = state_of(Kind.COMMIT, committed).read()
    assert state.ruled_by(other) is None
    assert not committed_in(state)(other)


def test_redact_hides_secrets_and_keeps_the_rest() -> None:
    safe = redact(CONFIG)
    assert set(safe) == set(CONFIG)
    for key in ("sasl.password", "ssl.key.password", "sasl.oauthbearer.config"):
        assert safe[key] == "***"
    for key in ("bootstrap.servers", "sasl.username", "security.protocol", "linger.ms"):
        assert safe[key] == CONFIG[key]
    assert not any(secret in repr(safe) for secret in SECRETS)


def test_connection_only_keeps_how_to_connect_and_drops_producer_tuning() -> None:
    conn = connection_only(CONFIG)
    assert "linger.ms" not in conn
    assert "transactional.id" not in conn and "transaction.timeout.ms" not in conn
    assert conn["bootstrap.servers"] == CONFIG["bootstrap.servers"]
    assert conn["sasl.password"] == "hunter2"  # the client needs it; only logs get redact()
    # kafka2pc's connection defaults come first, the user's own settings win over them.
    assert conn["reconnect.backoff.ms"] == CONNECTION_DEFAULTS["reconnect.backoff.ms"]
    assert connection_only({**CONFIG, "reconnect.backoff.ms": 500})["reconnect.backoff.ms"] == 500
    assert PRODUCER_DEFAULTS["reconnect.backoff.ms"] == CONNECTION_DEFAULTS["reconnect.backoff.ms"]


def test_decision_log_never_uses_the_transactional_settings() -> None:
    """The log's own producer must not become a transactional producer of the exporter's id."""
    log = DecisionLog(CONFIG)
    assert not any(k.startswith(("transactional.", "transaction.")) for k in log._config)


def test_decide_appends_one_record_and_reads_the_log_back_up_to_it() -> None:
    events: list[str] = []
    log = MemoryDecisionLog(events)
    d = new_decision(Kind.ABORT, [Covered("orders-0", 1000, 0), Covered("orders-1", 1000, 2)], "run-1", "abort")
    state = log.decide(d)
    assert events == ["decision ABORT orders-0 orders-1"]
    assert state.decisions == {d.decision_id: d}
    assert state.offsets[d.decision_id] == 0 == state.end_offset
    assert state.ruled_by(ref("orders-1", producer_epoch=2)) == d


def test_decide_reads_nothing_appended_after_its_own_record() -> None:
    log = MemoryDecisionLog()
    first = new_decision(Kind.ABORT, [Covered("orders-0", 1000, 0)], "run-1", "abort")
    state = log.decide(first)
    later = log.decide(new_decision(Kind.ABORT, [Covered("orders-1", 1000, 0)], "run-2", "abort"))
    assert list(state.decisions) == [first.decision_id]
    assert len(later.decisions) == 2


def test_decide_fails_if_its_record_is_not_read_back() -> None:
    class Lossy(MemoryDecisionLog):
        def scan(self, until: int | None = None):  # type: ignore[no-untyped-def]
            return iter([e for e in super().scan(until) if not e.key.startswith(DECISION_KEY.encode())])

    with pytest.raises(DecisionLogError, match="not read back"):
        Lossy().decide(new_decision(Kind.COMMIT, [Covered("orders-0", 1000, 0)], "run-1", "commit"))


def test_replay_skips_tombstones_and_unknown_keys() -> None:
    d = new_decision(Kind.COMMIT, [Covered("orders-0", 1000, 0)], "run-1", "commit")
    state = replay(
        [
            Entry(0, 1, d.key, d.to_json()),
            Entry(1, 2, b"not-a-decision", json.dumps({"what": "else"}).encode()),
            Entry(2, 3, d.key, None),
        ]
    )
    assert state.decisions == {} and state.ruling == {}
    assert (state.end_offset, state.broker_time_ms) == (2, 3)


@pytest.mark.parametrize(
    "code",
    [
        "OFFSET_NOT_AVAILABLE",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_DESTROY_BROKER",
        "_TRANSPORT",
    ],
)
def test_the_end_of_the_log_is_asked_again_while_a_new_leader_catches_up(code: str) -> None:
    """A read right after a broker restart met 'Leader high watermark is not caught up' (a soak
    run's prepare failed on it): retriable errors are waited out, any other is raised."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

    class Consumer:
        def __init__(self, failures: int, error: int) -> None:
            self.failures, self.error = failures, error

        def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
            if self.failures:
                self.failures -= 1
                raise KafkaException(KafkaError(self.error))
            return 0, 42

    log = DecisionLog({"bootstrap.servers": "127.0.0.1:1"}, topic="decisions", timeout_s=5)
    tp = TopicPartition("decisions", 0)
    assert log._end_offset(Consumer(2, getattr(KafkaError, code)), tp) == 42
    with pytest.raises(Kafka2PCError, match="may not Read Topic 'decisions'"):  # never a raw KafkaException
        log._end_offset(Consumer(1, KafkaError.TOPIC_AUTHORIZATION_FAILED), tp)


def test_a_leader_down_past_the_budget_is_named_not_raw() -> None:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogUnavailableError

    class Down:
        def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
            assert timeout <= 5.0  # asked in short steps, not one call as long as the budget
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get watermark offsets: Local: Timed out"))

    log = DecisionLog({"bootstrap.servers": "127.0.0.1:1"}, topic="decisions", timeout_s=0.5)
    with pytest.raises(DecisionLogUnavailableError) as info:
        log._end_offset(Down(), TopicPartition("decisions", 0))
    assert str(info.value).startswith(
        "decision log unavailable: partition 0 of decision topic 'decisions' (Kafka at 127.0.0.1:1) did not answer "
        "for 1 s while asking for its end offset; last error _TIMED_OUT: Failed to get watermark offsets"
    )
    # Nothing listens at 127.0.0.1:1: the cause, as the Test button and the CLI word it.
    assert (
        "; last error _TIMED_OUT: Failed to get watermark offsets: Local: Timed out. Now: cannot reach Kafka at "
        "127.0.0.1:1: connection refused (is a broker listening on that port?). Its leader is down" in str(info.value)
    )
    assert "Nothing was decided or ended by this call" in str(info.value)
