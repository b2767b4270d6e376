"""3 brokers: SIGKILL of the broker leading the decision topic's protocol partition, and at once a
commit (or a recovery pass) of transactions prepared before the kill. Exactly once, judged by a
read_committed consumer and the transactions left open: the call succeeds without a user retry, or,
past the decision log's budget, fails with DecisionLogUnavailableError and a retry once the broker
is back succeeds. Each test runs ROUNDS rounds, restarting the broker between them, and prints one
summary line (``pytest -s``)."""

from __future__ import annotations

import os
import re
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogUnavailableError
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from tests.helpers.kafka import (
    KafkaEnv,
    generate,
    kafka_local,
    kill_node,
    partition_leader,
    prepare_in_subprocess,
    wait_in_sync,
)

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

ROUNDS = int(os.environ.get("KAFKA2PC_LEADER_KILL_ROUNDS", "10"))
TXNS = 2  # per round
RECORDS = 100  # per transaction


@dataclass
class Round:
    node: int  # the broker killed
    seconds: float  # from the kill to the call's answer (the first try's, if it failed)
    outcome: str  # "ok" or "unavailable, retried"
    visible: int
    restart_s: float


def _prepare(env: KafkaEnv, topic: str, prefix: str, tag: str) -> list[Committable]:
    with ThreadPoolExecutor(TXNS) as pool:
        futures = [
            pool.submit(prepare_in_subprocess, env, f"{prefix}-{j}", generate(topic, RECORDS, f"{tag}-{j}-"))
            for j in range(TXNS)
        ]
        return [f.result() for f in futures]


def _visible(env: KafkaEnv, topic: str, tag: str) -> tuple[int, int]:
    keys = [r.key for r in env.read_committed(topic) if r.key is not None and r.key.startswith(f"{tag}-".encode())]
    return len(keys), len(set(keys))


def _kill_then(env: KafkaEnv, decisions: str, call: Callable[[DecisionLog, Any], None]) -> tuple[int, float, str]:
    """Kill the decision partition's leader and run ``call`` at once, as a fresh task would (its own
    decision log and wire client); on DecisionLogUnavailableError restart the broker and retry."""
    node = partition_leader(env, decisions)
    kill_node(env, node)
    started = time.monotonic()
    outcome = "ok"
    for attempt in range(2):
        log, wire = DecisionLog(env.config, topic=decisions), env.new_wire()
        try:
            call(log, wire)
            break
        except DecisionLogUnavailableError as e:
            assert attempt == 0, f"the retry after the restart failed too: {e}"
            cause = re.search(r"while (.*?)\. Its leader", str(e))
            outcome = f"unavailable after {time.monotonic() - started:.1f} s ({cause and cause[1]}), retried"
            kafka_local().start_node(env.directory, node)
        finally:
            wire.close()
            log.close()
    return node, time.monotonic() - started, outcome


def _restart(env: KafkaEnv, node: int) -> float:
    started = time.monotonic()
    kl = kafka_local()
    if not kl.status(env.directory)["alive"][str(node)]:
        kl.start_node(env.directory, node)
    return time.monotonic() - started


def _rounds(
    env: KafkaEnv, name: str, setup: Callable[[str, str, str, int], Callable[[DecisionLog, Any], None]], expected: int
) -> None:
    """ROUNDS rounds of: ``setup`` (prepare; it runs while the previous round's broker restarts), all
    replicas in sync, kill the decision leader and run what ``setup`` returned, then judge."""
    decisions, topic = f"decisions_lk{uuid.uuid4().hex[:8]}", env.topic(3)
    DecisionLog(env.config, topic=decisions).ensure_topic()
    rounds: list[Round] = []
    pool = ThreadPoolExecutor(1)
    restarting: tuple[Future[float], str, Round, int] | None = None

    def finish(restart: Future[float], prefix: str, done: Round, i: int) -> None:
        done.restart_s = restart.result()
        assert env.open_transactions(prefix) == [], i
        print(
            f"{name} round {i}: killed node {done.node}, {done.outcome} in {done.seconds:.1f} s, "
            f"{done.visible} visible, restart {done.restart_s:.1f} s"
        )

    try:
        for i in range(ROUNDS):
            prefix, tag = f"lk{name[0]}{uuid.uuid4().hex[:8]}", f"{name[0]}{i}"
            call = setup(decisions, topic, prefix, tag)
            if restarting is not None:
                finish(*restarting)
            wait_in_sync(env, [decisions, topic, "__transaction_state"])
            node, seconds, outcome = _kill_then(env, decisions, call)
            count, unique = _visible(env, topic, tag)
            assert (count, unique) == (expected, expected), (i, count, unique)
            rounds.append(Round(node, seconds, outcome, count, 0.0))
            restarting = (pool.submit(_restart, env, node), prefix, rounds[-1], i)
        if restarting is not None:
            finish(*restarting)
    finally:
        pool.shutdown(wait=True)
    secs = sorted(r.seconds for r in rounds)
    ok = sum(r.outcome == "ok" for r in rounds)
    print(
        f"LEADER-KILL {name}: {len(rounds)} rounds, {ok} succeeded without a retry, {len(rounds) - ok} after "
        f"DecisionLogUnavailableError and a retry; exactly once {sum(r.visible == expected for r in rounds)}/"
        f"{len(rounds)} ({expected} visible records each, unique, nothing open); kill-to-answer s "
        f"min {secs[0]:.1f} median {statistics.median(secs):.1f} max {secs[-1]:.1f}; "
        f"restart s median {statistics.median(r.restart_s for r in rounds):.1f}; nodes killed "
        f"{[r.node for r in rounds]}"
    )


def test_a_commit_started_as_the_decision_leader_dies_commits_exactly_once(kafka_cluster: KafkaEnv) -> None:
    env = kafka_cluster

    def setup(_decisions: str, topic: str, prefix: str, tag: str) -> Callable[[DecisionLog, Any], None]:
        committables = _prepare(env, topic, prefix, tag)

        def commit(log: DecisionLog, wire: Any) -> None:
            report = commit_prepared(committables, wire, log, run=f"{tag}-run")
            assert report.count(Verdict.COMMITTED) == TXNS, report

        return commit

    _rounds(env, "commit", setup, TXNS * RECORDS)


def test_a_recovery_started_as_the_decision_leader_dies_recovers_exactly_once(kafka_cluster: KafkaEnv) -> None:
    """Half of each round's transactions are under a COMMIT (a commit died after deciding): the
    recovery rolls them forward, decides ABORT for the rest and aborts them."""
    env = kafka_cluster

    def setup(decisions: str, topic: str, prefix: str, tag: str) -> Callable[[DecisionLog, Any], None]:
        committables = _prepare(env, topic, prefix, tag)
        log, wire = DecisionLog(env.config, topic=decisions), env.new_wire()
        try:
            decide_commit(committables[: TXNS // 2], wire, log, run=f"{tag}-crashed")
        finally:
            wire.close()
            log.close()

        def recovery(log: DecisionLog, wire: Any) -> None:
            for _ in range(3):  # a pass that must wait (a transaction still ending) is followed by another
                if recover(wire, prefix, log).done:
                    return
            raise AssertionError("recovery did not finish in 3 passes")

        return recovery

    _rounds(env, "recovery", setup, (TXNS // 2) * RECORDS)
