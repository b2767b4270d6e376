"""The transaction core against a real Kafka broker, judged by a read_committed consumer."""

from __future__ import annotations

import time
import uuid

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.transactions import broker_max_transaction_timeout_ms
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import DecisionConflictError, RunAbortedError
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent, Observation, Verdict
from airflow_provider_kafka2pc.txn.protocol.records import Covered, Kind, RunStatus, new_decision
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.conftest import SHORT_TXN_MAX_TIMEOUT_MS
from tests.helpers.kafka import KafkaEnv, generate, prepare_in_subprocess

pytestmark = pytest.mark.kafka


def _prefix() -> str:
    return f"p{uuid.uuid4().hex[:8]}"


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def _keys(records: list) -> list[bytes]:
    return [r.key for r in records]


# -- a. cross-process commit and abort --------------------------------------------------


def test_a_commit_from_another_process_makes_every_record_visible_once(kafka: KafkaEnv) -> None:
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    c = prepare_in_subprocess(kafka, tid, generate(topic, 5000))

    state = kafka.describe(tid)[tid]
    assert state is not None and state.state == "Ongoing"  # the writer process is gone, the txn is not
    assert (state.producer_id, state.producer_epoch) == (c.producer_id, c.producer_epoch)
    assert kafka.read_committed(topic) == []

    report = commit_prepared([c], kafka.wire, _log(kafka), run="run-a")
    assert [r.outcome for r in report.resolutions] == [Verdict.COMMITTED]

    keys = _keys(kafka.read_committed(topic))
    assert len(keys) == 5000 and len(set(keys)) == 5000
    assert kafka.open_transactions(tid.split("-")[0]) == []


def test_a_transactions_end_under_transaction_version_1_keeping_their_epoch(kafka: KafkaEnv) -> None:
    """The outcome table reads "commit again after CompleteCommit" as NONE because, under
    transaction version 1, ending a transaction keeps its epoch. librdkafka opens transactions
    under version 1 and EndTxn is pinned to <= 4 (test_wire_surface); should either change
    (version 2 bumps the epoch at every end), this fails before any outcome is misread."""
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    c = prepare_in_subprocess(kafka, tid, generate(topic, 10))
    commit_prepared([c], kafka.wire, _log(kafka), run="run-tv1")
    state = kafka.describe(tid)[tid]
    assert state is not None and state.state == "CompleteCommit"
    assert (state.producer_id, state.producer_epoch) == (c.producer_id, c.producer_epoch)


def test_a_abort_from_another_process_leaves_nothing(kafka: KafkaEnv) -> None:
    prefix = _prefix()
    topic = kafka.topic()
    c = prepare_in_subprocess(kafka, f"{prefix}-0", generate(topic, 1000))
    report = abort_prepared([c], kafka.wire, _log(kafka), run="run-a2")
    assert [r.outcome for r in report.resolutions] == [Verdict.ABORTED]
    assert kafka.read_committed(topic) == []
    assert kafka.open_transactions(prefix) == []
    assert kafka.describe(c.transactional_id)[c.transactional_id].state == "CompleteAbort"


# -- b. idempotence ------------------------------------------------------------------


def test_b_recommit_is_already_committed_and_abort_after_commit_rolls_forward(kafka: KafkaEnv) -> None:
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    c = prepare_in_subprocess(kafka, tid, generate(topic, 100))
    log = _log(kafka)
    commit_prepared([c], kafka.wire, log, run="b")
    again = commit_prepared([c], kafka.wire, log, run="b")  # a task retry or a UI clear
    # Answered from the run's own record: nothing described, no EndTxn sent, nothing written.
    assert again.resolutions == () and "already committed" in again.note

    resolver = TransactionResolver(kafka.wire)
    after = resolver.resolve([ref_of(c)], Intent.ABORT)[0]
    assert (after.outcome, after.observation) == (Verdict.COMMITTED, Observation.COMMITTED)
    assert len(kafka.read_committed(topic)) == 100


def test_b_commit_after_abort_obeys_the_abort_and_nothing_shows(kafka: KafkaEnv) -> None:
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    c = prepare_in_subprocess(kafka, tid, generate(topic, 100))
    log = _log(kafka)
    abort_prepared([c], kafka.wire, log, run="b2")
    with pytest.raises(DecisionConflictError, match=r"ABORT \w+ by abort for b2"):
        commit_prepared([c], kafka.wire, log, run="b2")
    assert kafka.read_committed(topic) == []
    # Aborting twice is a success too: the log already has it ended, nothing is sent again.
    assert abort_prepared([c], kafka.wire, log, run="b2").resolutions == ()
    assert kafka.describe(tid)[tid].state == "CompleteAbort"  # type: ignore[union-attr]


def test_b_end_txn_retried_concurrently_is_classified_not_guessed(kafka: KafkaEnv) -> None:
    """A second EndTxn while the first is still completing answers CONCURRENT_TRANSACTIONS (retriable)."""
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    c = prepare_in_subprocess(kafka, tid, generate(topic, 100))
    wire = kafka.wire
    node = wire.find_transaction_coordinators([tid])[tid].node_id
    assert wire.end_txn(node, tid, c.producer_id, c.producer_epoch, True) == 0
    second = TransactionResolver(wire).resolve([ref_of(c)], Intent.COMMIT)[0]
    assert second.outcome is Verdict.COMMITTED
    assert len(kafka.read_committed(topic)) == 100


# -- c. timeout --------------------------------------------------------------------


def test_c_committable_outliving_the_transaction_timeout_aborts_the_run_whole_loudly(
    kafka_short_timeout: KafkaEnv,
) -> None:
    env = kafka_short_timeout
    assert broker_max_transaction_timeout_ms(env.config) == SHORT_TXN_MAX_TIMEOUT_MS
    topic, prefix = env.topic(), _prefix()
    late = prepare_in_subprocess(env, f"{prefix}-0", generate(topic, 300, "late"))
    assert late.transaction_timeout_ms == SHORT_TXN_MAX_TIMEOUT_MS  # defaulted to the broker's cap
    time.sleep(SHORT_TXN_MAX_TIMEOUT_MS / 1000 + 3)
    fresh = prepare_in_subprocess(env, f"{prefix}-1", generate(topic, 200, "fresh"))

    # The commit's own worst case must fit in the short cap: a 1 s decision write, 2 s of EndTxn retries.
    log = DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}", timeout_s=1)
    with pytest.raises(RunAbortedError) as e:
        commit_prepared([late, fresh], env.wire, log, run="c", end_txn_timeout_s=2)
    assert [t.transactional_id for t in e.value.why] == [late.transactional_id]
    assert e.value.why[0].records == 300
    assert (e.value.transactions, e.value.records) == (2, 500)  # the run's real totals
    assert str(e.value).startswith("run c was aborted as a whole, nothing of it is visible: 2 transaction(s)")
    assert "transaction.timeout.ms" in str(e.value)
    # Atomic: the fresh transaction was aborted too, nothing of the run is visible, nothing open.
    assert env.read_committed(topic) == []
    assert env.open_transactions(prefix) == []
    ruler = log.read().ruled_by(ref_of(fresh))
    assert ruler is not None and ruler.kind is Kind.ABORT and ruler.actor == "commit"


def test_c_commit_refuses_a_committable_past_its_deadline(kafka_short_timeout: KafkaEnv) -> None:
    env = kafka_short_timeout
    topic, prefix = env.topic(), _prefix()
    c = prepare_in_subprocess(env, f"{prefix}-0", generate(topic, 10))
    # A headroom as long as the timeout: the commit can never start in time.
    with pytest.raises(RunAbortedError, match="too close to its broker deadline"):
        commit_prepared([c], env.wire, _log(env), run="c2", headroom_ms=SHORT_TXN_MAX_TIMEOUT_MS)
    assert env.read_committed(topic) == []
    assert env.open_transactions(prefix) == []


# -- d. fencing --------------------------------------------------------------------


def test_d_second_writer_fences_the_first(kafka: KafkaEnv) -> None:
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    first = prepare_in_subprocess(kafka, tid, generate(topic, 100, "first"))
    second = prepare_in_subprocess(kafka, tid, generate(topic, 50, "second"))
    assert second.producer_epoch > first.producer_epoch or second.producer_id != first.producer_id

    resolver = TransactionResolver(kafka.wire)
    r = resolver.resolve([ref_of(first)], Intent.COMMIT)[0]
    assert (r.outcome, r.observation) == (Verdict.LOST, Observation.SUPERSEDED)
    with pytest.raises(RunAbortedError, match="fenced"):
        commit_prepared([first], kafka.wire, _log(kafka), run="d")
    commit_prepared([second], kafka.wire, _log(kafka), run="d2")
    keys = _keys(kafka.read_committed(topic))
    assert sorted(keys) == sorted(f"second{i}".encode() for i in range(50))


def test_d_end_txn_with_a_stale_epoch_is_rejected_by_the_broker(kafka: KafkaEnv) -> None:
    """The raw answer the classification has to look behind."""
    topic, tid = kafka.topic(), f"{_prefix()}-0"
    first = prepare_in_subprocess(kafka, tid, generate(topic, 10))
    prepare_in_subprocess(kafka, tid, generate(topic, 10))
    node = kafka.wire.find_transaction_coordinators([tid])[tid].node_id
    code = kafka.wire.end_txn(node, tid, first.producer_id, first.producer_epoch, True)
    assert code in (47, 90)  # INVALID_PRODUCER_EPOCH / PRODUCER_FENCED


# -- e. producer id and epoch --------------------------------------------------------


def test_e_librdkafka_producer_id_and_epoch_match_describe_transactions(kafka: KafkaEnv) -> None:
    topic, prefix = kafka.topic(), _prefix()
    for slot in range(3):
        tid = f"{prefix}-{slot}"
        for _round in range(2):  # the second round bumps the epoch of the same id
            c = prepare_in_subprocess(kafka, tid, generate(topic, 10))
            s = kafka.describe(tid)[tid]
            assert s is not None and s.state == "Ongoing"
            assert (s.producer_id, s.producer_epoch) == (c.producer_id, c.producer_epoch)
            assert sorted(s.topic_partitions) == sorted(c.topic_partitions)
            assert s.timeout_ms == c.transaction_timeout_ms
            assert c.first_write_ms <= s.start_time_ms + 1000
    recover(kafka.wire, prefix, _log(kafka))
    assert kafka.open_transactions(prefix) == []


# -- h. record shapes ----------------------------------------------------------------


def test_h_keys_headers_null_values_and_several_topics_in_one_transaction(kafka: KafkaEnv) -> None:
    t1, t2 = kafka.topic(2), kafka.topic(1)
    spec = [
        {"topic": t1, "key": "a", "value": "1", "headers": [["h1", "x"], ["h2", None]]},
        {"topic": t1, "key": None, "value": "no key"},
        {"topic": t2, "key": "tomb", "value": None},
        {"topic": t2, "key": "b", "value": "é", "headers": [["dup", "1"], ["dup", "2"]]},
        {"topic": t1, "key": "p1", "value": "to partition 1", "partition": 1},
    ]
    c = prepare_in_subprocess(kafka, f"{_prefix()}-0", spec)
    assert c.records == 5 and dict(c.counts_by_topic) == {t1: 3, t2: 2}
    assert {t for t, _ in c.topic_partitions} == {t1, t2}
    assert kafka.read_committed(t1, t2) == []
    commit_prepared([c], kafka.wire, _log(kafka), run="h")
    got = {(r.topic, r.key): r for r in kafka.read_committed(t1, t2)}
    assert len(got) == 5
    assert got[(t1, b"a")].headers == (("h1", b"x"), ("h2", None))
    assert got[(t1, None)].value == b"no key"
    assert got[(t2, b"tomb")].value is None
    assert got[(t2, b"b")].value == "é".encode() and got[(t2, b"b")].headers == (("dup", b"1"), ("dup", b"2"))
    assert got[(t1, b"p1")].partition == 1


# -- f. recovery -------------------------------------------------------------------


def test_f_recovery_commits_decided_aborts_the_rest_and_leaves_other_prefixes_alone(kafka: KafkaEnv) -> None:
    import concurrent.futures as cf

    topic = kafka.topic(6)
    p = _prefix()
    p2 = p + "2"  # a prefix that starts with P: must never match
    other = _prefix()
    own = [(f"{p}-{i}", f"{p}-{i}-") for i in range(50)]
    left_open = [(f"{p2}-{i}", f"{p2}-{i}-") for i in range(3)] + [(f"{other}-{i}", f"{other}-{i}-") for i in range(2)]
    committables: dict[str, Committable] = {}
    # The other prefixes' transactions stay open, and a read_committed consumer stops at the first
    # open one on a partition: they are prepared after ours, so no record of ours lies behind them.
    for jobs in (own, left_open):
        with cf.ThreadPoolExecutor(4) as ex:
            prepared = ex.map(lambda j: prepare_in_subprocess(kafka, j[0], generate(topic, 20, j[1])), jobs)
            committables.update(zip([t for t, _ in jobs], prepared, strict=True))
    log = _log(kafka)
    decided = [committables[f"{p}-{i}"] for i in range(0, 50, 3)]  # 17 with a COMMIT decision
    decide_commit(decided, kafka.wire, log, run="crashed-run")  # the commit died right after deciding
    # A COMMIT decision for an *older* epoch of the same id must not commit the current one; with
    # no record of it committing, it is reported lost.
    stale = committables[f"{p}-1"]
    old = new_decision(
        Kind.COMMIT, [Covered(stale.transactional_id, stale.producer_id, stale.producer_epoch - 1)], "older-run", "t"
    )
    log.append([(old.key, old.to_json())])

    result = recover(kafka.wire, p, log, raise_on_loss=False)
    assert [t.transactional_id for t in result.lost] == [stale.transactional_id]
    assert not result.done
    assert sorted(r.transactional_id for r in result.plan.commit) == sorted(c.transactional_id for c in decided)
    assert len(result.plan.abort) == 50 - len(decided)
    assert all(r.outcome is Verdict.COMMITTED for r in result.resolutions if r.ref in result.plan.commit)

    visible = {r.key for r in kafka.read_committed(topic)}
    want = {f"{c.transactional_id}-{i}".encode() for c in decided for i in range(20)}
    assert visible == want  # exactly the decided ones, each record once
    assert len(kafka.read_committed(topic)) == len(want)
    assert kafka.open_transactions(p) == []
    assert sorted(kafka.open_transactions(p2)) == sorted(f"{p2}-{i}" for i in range(3))
    assert sorted(kafka.open_transactions(other)) == sorted(f"{other}-{i}" for i in range(2))
    assert log.read().runs[(p, "crashed-run")].status is RunStatus.COMMITTED

    # Idempotent: a second pass finds nothing to do, and still reports the loss.
    again = recover(kafka.wire, p, log, raise_on_loss=False)
    assert again.plan.empty and [t.transactional_id for t in again.lost] == [stale.transactional_id]
    for q in (p2, other):
        recover(kafka.wire, q, log)
        assert kafka.open_transactions(q) == []
    assert {r.key for r in kafka.read_committed(topic)} == want


# -- bad input: colliding prefix, broker down ---------------------------------------------


def test_a_prefix_claimed_by_another_exporter_is_refused(kafka: KafkaEnv) -> None:
    from airflow_provider_kafka2pc.txn.protocol.errors import PrefixCollisionError

    log, prefix = _log(kafka), _prefix()
    log.claim_prefix(prefix, "dag_a.export")
    log.claim_prefix(prefix, "dag_a.export")  # the owner again: fine
    with pytest.raises(PrefixCollisionError, match=r"dag_a\.export"):
        DecisionLog(kafka.config, topic=log.topic).claim_prefix(prefix, "dag_b.export")
    DecisionLog(kafka.config, topic=log.topic).claim_prefix(prefix + "2", "dag_b.export")  # a different prefix


def test_a_broker_that_is_down_gives_a_clear_error_and_loses_nothing(kafka: KafkaEnv) -> None:
    import socket

    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = {"bootstrap.servers": f"127.0.0.1:{s.getsockname()[1]}"}
    topic, prefix = kafka.topic(), _prefix()
    c = prepare_in_subprocess(kafka, f"{prefix}-0", generate(topic, 100))
    with pytest.raises(BrokerUnavailableError, match=r"^cannot reach Kafka at 127\.0\.0\.1:\d+: connection refused"):
        WireClient(dead, bootstrap_timeout_ms=2000)
    with pytest.raises(BrokerUnavailableError, match="decision log") as unavailable:
        DecisionLog(dead, timeout_s=2).read()
    assert f"Now: cannot reach Kafka at {dead['bootstrap.servers']}: connection refused" in str(unavailable.value)
    # The prepared transaction is untouched and still commits once the broker is back.
    assert kafka.describe(c.transactional_id)[c.transactional_id].state == "Ongoing"  # type: ignore[union-attr]
    commit_prepared([c], kafka.wire, _log(kafka), run="down")
    assert len(kafka.read_committed(topic)) == 100


def test_kafkas_own_tools_see_what_kafka2pc_does(kafka: KafkaEnv) -> None:
    """TransactionsCommand lists the prepared transaction; the console consumer (read_committed)
    sees nothing before the commit and every record after it."""
    from tests.helpers.kafka import kafka_local

    kl = kafka_local()
    topic, prefix = kafka.topic(1), _prefix()
    c = prepare_in_subprocess(kafka, f"{prefix}-0", generate(topic, 5))
    listed = kl.run_tool(kafka.directory, "transactions", ["list"])
    assert listed.returncode == 0, listed.stderr
    assert c.transactional_id in listed.stdout and "Ongoing" in listed.stdout
    described = kl.run_tool(kafka.directory, "transactions", ["describe", "--transactional-id", c.transactional_id])
    assert str(c.producer_id) in described.stdout and str(c.producer_epoch) in described.stdout

    def console() -> list[str]:
        args = ["--topic", topic, "--from-beginning", "--isolation-level", "read_committed", "--timeout-ms", "4000"]
        return [ln for ln in kl.run_tool(kafka.directory, "console-consumer", args).stdout.splitlines() if ln]

    assert console() == []
    commit_prepared([c], kafka.wire, _log(kafka), run="tools")
    assert sorted(console()) == sorted(f"value-{i}" for i in range(5))


def test_a_200_transaction_commit_logs_a_handful_of_info_lines_and_no_warning(
    kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit of a 200-partition export on the broker: every record visible once, nothing open,
    and the commit's log at INFO is a summary (per-transaction lines only at DEBUG), no WARNING."""
    import logging

    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter

    topic, prefix = kafka.topic(partitions=4), _prefix()
    committables = []
    for slot in range(200):
        w = TransactionalWriter(kafka.config, f"{prefix}-{slot}", 300_000).open()
        w.produce(topic, b"v", f"k{slot}".encode())
        c = w.prepare()
        assert c is not None
        committables.append(c)
    log = _log(kafka)
    with caplog.at_level(logging.INFO, logger="airflow_provider_kafka2pc"):
        report = commit_prepared(committables, kafka.wire, log, run="dag/run-200")
    assert report.committed
    mine = [r for r in caplog.records if r.name.startswith("airflow_provider_kafka2pc")]
    info = [r.getMessage() for r in mine if r.levelno == logging.INFO]
    assert len(info) <= 5, info
    assert not [r for r in mine if r.levelno >= logging.WARNING], [r.getMessage() for r in mine]
    assert any("200 transaction(s): 200 committed" in line for line in info), info
    keys = _keys(kafka.read_committed(topic))
    assert len(keys) == len(set(keys)) == 200
    assert kafka.open_transactions(prefix) == []
