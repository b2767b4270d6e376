"""Decision records, the snapshot read back from the log, and what may be logged of a config."""

from __future__ import annotations

import json

import pytest

from airflow_provider_kafka2pc.txn.config import connection_only, redact
from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionLog, DecisionRecord, DecisionSnapshot
from airflow_provider_kafka2pc.txn.outcome import TxnRef
from tests.unit.fakes import MemoryDecisionLog, ref

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


@pytest.mark.parametrize("decision", list(Decision))
def test_record_json_round_trip(decision: Decision) -> None:
    rec = DecisionRecord("orders-0", 4711, 5, decision, "manual__2026-11-21T10:00:00+00:00", 1_700_000_000_000, 42)
    assert DecisionRecord.from_json(rec.to_json()) == rec


def test_record_reason_round_trips_and_is_omitted_when_empty() -> None:
    rec = DecisionRecord("orders-0", 1, 0, Decision.LOST, "run", 1, 3, reason="the transaction was aborted")
    assert DecisionRecord.from_json(rec.to_json()) == rec
    plain = DecisionRecord("orders-0", 1, 0, Decision.COMMIT, "run", 1)
    assert "reason" not in json.loads(plain.to_json())


def test_record_json_carries_ids_and_counts_only() -> None:
    rec = DecisionRecord("orders-0", 1, 0, Decision.COMMIT, "run", 1, 7)
    assert set(json.loads(rec.to_json())) == {"tid", "pid", "epoch", "decision", "run", "at_ms", "records"}


def test_record_with_an_unknown_decision_does_not_parse() -> None:
    raw = json.dumps({"tid": "orders-0", "pid": 1, "epoch": 0, "decision": "MAYBE"}).encode()
    with pytest.raises(ValueError):
        DecisionRecord.from_json(raw)


def snapshot_of(decision: Decision, pid: int = 4711, epoch: int = 5) -> DecisionSnapshot:
    rec = DecisionRecord("orders-0", pid, epoch, decision, "run", 1)
    return DecisionSnapshot({"orders-0": rec}, {})


SAME = TxnRef("orders-0", 4711, 5)


@pytest.mark.parametrize(
    ("decision", "decided_commit", "committed"),
    [
        (Decision.COMMIT, True, False),
        (Decision.COMMITTED, True, True),
        (Decision.ABORTED, False, False),
        (Decision.LOST, False, False),
    ],
)
def test_snapshot_answers_for_the_same_transaction(decision: Decision, decided_commit: bool, committed: bool) -> None:
    s = snapshot_of(decision)
    assert s.decided_commit(SAME) is decided_commit
    assert s.committed(SAME) is committed


@pytest.mark.parametrize(
    "other",
    [
        TxnRef("orders-0", 4711, 6),  # next epoch: the id was reused or timed out
        TxnRef("orders-0", 4711, 4),
        TxnRef("orders-0", 4712, 5),
        TxnRef("orders-1", 4711, 5),
    ],
)
@pytest.mark.parametrize("decision", [Decision.COMMIT, Decision.COMMITTED])
def test_snapshot_says_nothing_about_another_transaction(other: TxnRef, decision: Decision) -> None:
    s = snapshot_of(decision)
    assert s.get(other) is None
    assert not s.decided_commit(other)
    assert not s.committed(other)


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


def test_decision_log_never_uses_the_transactional_settings() -> None:
    """The log's own producer must not become a transactional producer of the exporter's id."""
    log = DecisionLog(CONFIG)
    assert not any(k.startswith(("transactional.", "transaction.")) for k in log._config)


def test_record_writes_one_record_per_ref_with_counts_and_reasons() -> None:
    log = MemoryDecisionLog()
    log.record(
        [ref("orders-0"), ref("orders-1", producer_epoch=2)],
        Decision.ABORTED,
        "run-1",
        reasons={"orders-1": "past its deadline"},
        counts={"orders-0": 10},
    )
    assert [(r.transactional_id, r.producer_epoch, r.records, r.reason, r.run) for r in log.written] == [
        ("orders-0", 0, 10, "", "run-1"),
        ("orders-1", 2, 0, "past its deadline", "run-1"),
    ]
