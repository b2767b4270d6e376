"""g. The same flows on a 3-broker cluster, with the transaction coordinator's broker restarted
between prepare and commit."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

import pytest

from airflow_provider_kafka2pc.txn.kafka import listing
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from tests.helpers.kafka import KafkaEnv, generate, kafka_local, prepare_in_subprocess

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


def _restart_coordinator(env: KafkaEnv, tid: str) -> int:
    kl = kafka_local()
    node = env.wire.find_transaction_coordinators([tid])[tid].node_id
    kl.stop_node(env.directory, node)
    kl.start_node(env.directory, node)
    return int(node)


@pytest.mark.parametrize("intent", ["commit", "abort"])
def test_g_coordinator_restart_between_prepare_and_end(kafka_cluster: KafkaEnv, intent: str) -> None:
    env = kafka_cluster
    prefix = f"g{uuid.uuid4().hex[:8]}"
    topic = env.topic(6)
    committables = [prepare_in_subprocess(env, f"{prefix}-{i}", generate(topic, 500, f"{i}-")) for i in range(4)]
    log = DecisionLog(env.config, topic=f"decisions_{prefix}")
    log.ensure_topic()
    _restart_coordinator(env, committables[0].transactional_id)

    wire = env.new_wire()  # a fresh process's view, as the commit task would have
    try:
        if intent == "commit":
            report = commit_prepared(committables, wire, log, run="g")
            assert report.count(Verdict.COMMITTED) == 4
            keys = [r.key for r in env.read_committed(topic)]
            assert len(keys) == 2000 and len(set(keys)) == 2000
        else:
            report = abort_prepared(committables, wire, log, run="g")
            assert report.count(Verdict.ABORTED) == 4
            assert env.read_committed(topic) == []
    finally:
        wire.close()
    assert env.open_transactions(prefix) == []


def test_g_recovery_on_the_cluster_after_a_coordinator_restart(kafka_cluster: KafkaEnv) -> None:
    env = kafka_cluster
    prefix = f"g{uuid.uuid4().hex[:8]}"
    topic = env.topic(3)
    cs = [prepare_in_subprocess(env, f"{prefix}-{i}", generate(topic, 100, f"{i}-")) for i in range(6)]
    log = DecisionLog(env.config, topic=f"decisions_{prefix}")
    decide_commit(cs[:3], env.wire, log, run="crashed")  # a commit that died right after deciding
    _restart_coordinator(env, cs[0].transactional_id)
    wire = env.new_wire()
    try:
        result = recover(wire, prefix, log)
    finally:
        wire.close()
    assert result.done
    keys = [r.key for r in env.read_committed(topic)]
    assert len(keys) == 300 and len(set(keys)) == 300
    assert env.open_transactions(prefix) == []
    # env.wire's kafka-python cache still names the coordinators from before the restart; its
    # describe (kafka-python's public call, routed by that cache) must follow the fresh lookup.
    described = TransactionInspector(env.wire).describe([c.transactional_id for c in cs])
    assert {tid: s.state if s else None for tid, s in described.items()} == {
        c.transactional_id: "CompleteCommit" if i < 3 else "CompleteAbort" for i, c in enumerate(cs)
    }


def test_the_probes_land_on_the_leader_of_their_transaction_log_partition(kafka_cluster: KafkaEnv) -> None:
    """The complete listing asks each partition's owner about a probe id hashing to it: the hash must
    be the broker's (FindCoordinator answers with the partition's leader)."""
    tid = f"probe{uuid.uuid4().hex[:6]}-0"  # the transaction log exists once a transaction began
    began = prepare_in_subprocess(kafka_cluster, tid, generate(kafka_cluster.topic(1), 1))
    abort_prepared([began], kafka_cluster.wire, DecisionLog(kafka_cluster.config, topic=f"decisions_{tid}"), "probe")
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient

    parts = [TopicPartition(listing.TRANSACTION_LOG, p) for p in range(4)]
    with contextlib.suppress(Exception):  # earlier restarts moved leadership; ELECTION_NOT_NEEDED where it did not
        AdminClient(kafka_cluster.config).elect_leaders(ElectionType.PREFERRED, parts).result(30)
    view = listing.newest_leaders(kafka_cluster.wire)
    assert view is not None and len({node for node, _ in view.values()}) > 1  # spread over several brokers
    probes = listing.probe_ids(f"probe{uuid.uuid4().hex[:6]}", len(view))
    found = kafka_cluster.wire.find_transaction_coordinators(list(probes))
    assert {p: found[probes[p]].node_id for p in view} == {p: node for p, (node, _) in view.items()}


# Moves: a broker stopped, started and made preferred leader again, the brokers in turn. One in the
# suite (its time counts); the 40 by hand (KAFKA2PC_LISTING_MOVES=40), figures on the design page.
MOVES = int(os.environ.get("KAFKA2PC_LISTING_MOVES", "1"))


def test_a_listing_stays_complete_while_transaction_log_leadership_moves(kafka_cluster: KafkaEnv) -> None:
    """A broker is stopped (its transaction-log partitions move away), started again and made preferred
    leader again (``MOVES`` times, the brokers in turn), while recovery's listing runs over a long-lived
    client and fresh ones:
    every listing holds every open transaction of the prefix (issue 46: 947 of 6,917 did not)."""
    env = kafka_cluster
    prefix = f"lm{uuid.uuid4().hex[:8]}"
    topic = env.topic(3)
    cs = [prepare_in_subprocess(env, f"{prefix}-{i}", generate(topic, 10, f"{i}-")) for i in range(8)]
    expected = {c.transactional_id for c in cs}
    moved = threading.Event()
    errors: list[BaseException] = []

    def move_leadership() -> None:
        from confluent_kafka import ElectionType, TopicPartition
        from confluent_kafka.admin import AdminClient

        kl = kafka_local()
        try:
            for i in range(MOVES):
                with env.new_wire() as own:  # the leader of one transaction-log partition after another moves
                    view = listing.newest_leaders(own) or {0: (1 + i % env.brokers, 0)}
                node = view[i % len(view)][0]
                kl.stop_node(env.directory, node)
                kl.start_node(env.directory, node)
                parts = [TopicPartition(listing.TRANSACTION_LOG, p) for p in range(4)]
                with contextlib.suppress(Exception):  # ELECTION_NOT_NEEDED for partitions already home
                    AdminClient(env.config).elect_leaders(ElectionType.PREFERRED, parts).result(30)
        except BaseException as e:
            errors.append(e)
        finally:
            moved.set()

    mover = threading.Thread(target=move_leadership, daemon=True)
    mover.start()
    passes = 0
    try:
        while not moved.is_set() or passes < 2:
            fresh = env.new_wire()
            try:
                for wire in (env.wire, fresh):
                    listed = {t.transactional_id for t in TransactionInspector(wire, 60).list_prefix(prefix)}
                    assert listed == expected, f"pass {passes}: missing {sorted(expected - listed)}"
                    passes += 1
            finally:
                fresh.close()
    finally:
        mover.join(300)
    assert not errors, errors
    assert passes >= 4
    print(f"{passes} complete listings while {MOVES} broker(s) were stopped, started and elected again")
    # Once the cluster settles, what kafka2pc lists is what Kafka's own tool lists.
    tool = kafka_local().run_tool(env.directory, "transactions", ["list"]).stdout
    theirs = {line.split()[0] for line in tool.splitlines()[1:] if line.startswith(f"{prefix}-") and "Ongoing" in line}
    with env.new_wire() as fresh:
        ours = {t.transactional_id for t in TransactionInspector(fresh, 60).list_prefix(prefix)}
    assert ours == theirs == expected
    log = DecisionLog(env.config, topic=f"decisions_{prefix}")
    assert recover(env.wire, prefix, log).done
    assert env.open_transactions(prefix) == []
