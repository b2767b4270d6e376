"""A Kafka source's range and its offsets participant against a real broker (KIP-447), no Spark.

Judged by Kafka: the group's committed offsets as a stable fetch and as Kafka's own
``kafka-consumer-groups --describe`` prints them, and the transactions left open.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.offsets_writer import prepare_offsets
from airflow_provider_kafka2pc.txn.kafka.source_snapshot import (
    KafkaSourceSpec,
    group_offsets,
    snapshot_source,
)
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import SourceError
from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared
from tests.helpers.kafka import KafkaEnv, kafka_local

pytestmark = pytest.mark.kafka


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def _producer(env: KafkaEnv, tid: str) -> Any:
    from confluent_kafka import Producer

    p = Producer({**env.config, "transactional.id": tid, "linger.ms": 0})
    p.init_transactions(30)
    return p


def _write(p: Any, topic: str, partition: int, keys: range, end: str) -> None:
    p.begin_transaction()
    for i in keys:
        p.produce(topic, value=b"v", key=f"k{i}".encode(), partition=partition)
    p.flush(30)
    if end == "commit":
        p.commit_transaction(30)
    elif end == "abort":
        p.abort_transaction(30)


@pytest.fixture
def source(kafka: KafkaEnv) -> Iterator[tuple[str, Any]]:
    """A 2-partition source topic of another producer: partition 0 holds 10 committed, 5 aborted
    and 4 more committed records; partition 1 holds 7 committed records and then 3 in a
    transaction that stays open (its producer is kept alive until the test ends)."""
    topic = kafka.topic(partitions=2)
    other = _producer(kafka, f"other-{uuid.uuid4().hex[:6]}")
    _write(other, topic, 0, range(10), "commit")
    _write(other, topic, 0, range(10, 15), "abort")
    _write(other, topic, 0, range(15, 19), "commit")
    _write(other, topic, 1, range(100, 107), "commit")
    _write(other, topic, 1, range(107, 110), "open")
    yield topic, other
    other.abort_transaction(30)


def consumer_groups_tool(env: KafkaEnv, group: str) -> dict[tuple[str, int], int | None]:
    """CURRENT-OFFSET per partition as Kafka's own kafka-consumer-groups prints it ('-': None)."""
    done = kafka_local().run_tool(env.directory, "consumer-groups", ["--describe", "--group", group, "--offsets"])
    assert done.returncode == 0 or "does not exist" in done.stdout + done.stderr, done.stderr[-2000:]
    rows: dict[tuple[str, int], int | None] = {}
    for line in done.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == group and cols[2].isdigit():
            rows[(cols[1], int(cols[2]))] = None if cols[3] == "-" else int(cols[3])
    return rows


def test_the_range_ends_at_the_last_stable_offset_and_the_offsets_move_only_with_the_commit(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    topic, _ = source
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    spec = KafkaSourceSpec(group, topics=(topic,))
    r = snapshot_source(kafka.config, spec)
    # Partition 0: 10 + 5 aborted + 4 records and 3 markers: all stable. Partition 1: 7 records and a
    # marker are stable, the open transaction's 3 records are not.
    assert [(p.name, p.start, p.end, p.committed) for p in r.partitions] == [
        (f"{topic}-0", 0, 22, None),
        (f"{topic}-1", 0, 8, None),
    ]
    tid = naming.transactional_id(prefix, naming.OFFSETS_SLOT)
    assert tid == f"{prefix}-offsets"
    c = prepare_offsets(kafka.config, tid, r)
    assert c.records == 0 and c.producer_id >= 0
    # Prepared, not committed: the group has no offset, and a stable read says one is pending.
    with pytest.raises(SourceError, match="inside a transaction that is still open"):
        group_offsets(kafka.config, group, [(topic, 0), (topic, 1)])
    assert consumer_groups_tool(kafka, group) in ({}, {(topic, 0): None, (topic, 1): None})
    assert kafka.open_transactions(prefix) == [tid]

    report = commit_prepared([c], kafka.wire, _log(kafka), run="source-run")
    assert [x.outcome for x in report.resolutions] == [Verdict.COMMITTED]
    assert group_offsets(kafka.config, group, [(topic, 0), (topic, 1)]) == {(topic, 0): 22, (topic, 1): 8}
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 22, (topic, 1): 8}
    assert kafka.open_transactions(prefix) == []

    # The next run starts where this one ended; nothing new: an empty range, which moves nothing.
    again = snapshot_source(kafka.config, spec)
    assert [(p.start, p.end, p.committed) for p in again.partitions] == [(22, 22, 22), (8, 8, 8)]
    assert not again.moves


def test_an_aborted_run_leaves_the_offsets_where_they_were(kafka: KafkaEnv, source: tuple[str, Any]) -> None:
    topic, _ = source
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    first = snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,), max_offsets_per_run=6))
    assert [(p.start, p.end) for p in first.partitions] == [(0, 3), (0, 3)]  # 6 offsets, shared evenly
    tid = naming.transactional_id(prefix, naming.OFFSETS_SLOT)
    commit_prepared([prepare_offsets(kafka.config, tid, first)], kafka.wire, _log(kafka), run="r1")
    second = snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,)))
    assert [(p.start, p.end, p.committed) for p in second.partitions] == [(3, 22, 3), (3, 8, 3)]
    c = prepare_offsets(kafka.config, tid, second)
    report = abort_prepared([c], kafka.wire, _log(kafka), run="r2")
    assert [x.outcome for x in report.resolutions] == [Verdict.ABORTED]
    assert group_offsets(kafka.config, group, [(topic, 0), (topic, 1)]) == {(topic, 0): 3, (topic, 1): 3}
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 3, (topic, 1): 3}
    assert kafka.open_transactions(prefix) == []


def test_a_group_with_a_live_member_is_refused_before_anything_is_written(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    from confluent_kafka import Consumer

    topic, _ = source
    group = f"g{uuid.uuid4().hex[:8]}"
    member = Consumer({**kafka.config, "group.id": group, "client.id": "live-reader", "session.timeout.ms": 45000})
    member.subscribe([topic])
    try:
        for _ in range(100):  # until it joined and holds its assignment
            member.poll(0.2)
            if member.assignment():
                break
        assert member.assignment()
        with pytest.raises(SourceError, match=r"has 1 live member\(s\) \(live-reader on .*\)") as refused:
            snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,)))
        assert "Stop those consumers, or give the export a consumer group of its own" in str(refused.value)
    finally:
        member.close()


def test_offsets_deleted_by_retention_are_counted_and_refused_unless_accepted(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, _ = source
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    _commit_a_run(kafka, topic, group, prefix, 4, "r1")
    admin = AdminClient(kafka.config)
    for f in admin.delete_records([TopicPartition(topic, 0, 12)]).values():  # offsets 2..11 of p0 unread
        f.result(30)
    with pytest.raises(SourceError) as refused:
        snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,)))
    said = f"has not read 10 offset(s) that retention already deleted: {topic}-0 (committed 2, log start 12)"
    assert said in str(refused.value), refused.value
    assert "set accept_gap=True" in str(refused.value)
    accepted = snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,), accept_gap=True))
    assert [(p.start, p.end, p.committed) for p in accepted.partitions] == [(12, 22, 2), (2, 8, 2)]


def test_a_pattern_finds_the_topics_and_a_missing_topic_is_named(kafka: KafkaEnv) -> None:
    stem = f"src_{uuid.uuid4().hex[:6]}"
    a, b = kafka.topic(1, name=f"{stem}_a"), kafka.topic(2, name=f"{stem}_b")
    r = snapshot_source(kafka.config, KafkaSourceSpec("g-pattern", pattern=re.escape(stem) + "_.*"))
    assert [p.name for p in r.partitions] == [f"{a}-0", f"{b}-0", f"{b}-1"]
    with pytest.raises(SourceError, match=f"topic '{stem}_none' does not exist"):
        snapshot_source(kafka.config, KafkaSourceSpec("g-missing", topics=(f"{stem}_none",)))
    with pytest.raises(SourceError, match="no topic matches"):
        snapshot_source(kafka.config, KafkaSourceSpec("g-missing", pattern=f"{stem}_zzz.*"))


def test_a_group_that_is_not_where_the_last_committed_run_left_it_is_named(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus

    topic, _ = source
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    spec = KafkaSourceSpec(group, topics=(topic,))
    first = snapshot_source(kafka.config, spec)
    tid = naming.transactional_id(prefix, naming.OFFSETS_SLOT)
    commit_prepared([prepare_offsets(kafka.config, tid, first)], kafka.wire, _log(kafka), run="r1")
    last = RunRecord(prefix, "dag/r1", RunStatus.COMMITTED, 1, 0, 0, "d1", source=first)
    assert not snapshot_source(kafka.config, spec, previous=last).moves  # it follows on

    other = Consumer({**kafka.config, "group.id": group, "enable.auto.commit": False})
    other.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    other.close()
    with pytest.raises(SourceError) as moved:
        snapshot_source(kafka.config, spec, previous=last)
    said = (
        f"is not where the exporter's last committed run dag/r1 (decision d1) left it ({topic}-0 is at 5, left at 22)"
    )
    assert said in str(moved.value), moved.value

    admin = AdminClient(kafka.config)  # kept: futures of a destroyed client never complete
    for f in admin.delete_consumer_groups([group], request_timeout=30).values():
        f.result(30)  # as retention does to a group's offsets after offsets.retention.minutes
    with pytest.raises(SourceError, match=r"has no offsets, but the exporter's last committed .* its offsets expired"):
        snapshot_source(kafka.config, spec, previous=last)
    again = snapshot_source(kafka.config, KafkaSourceSpec(group, topics=(topic,), accept_gap=True), previous=last)
    assert [(p.start, p.committed) for p in again.partitions] == [(0, None), (0, None)]


def test_latest_pins_a_new_group_where_it_starts_and_the_next_run_reads_what_came_after(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    topic, other = source
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    spec = KafkaSourceSpec(group, topics=(topic,), starting_offsets="latest")
    first = snapshot_source(kafka.config, spec)
    assert first.offsets == 0 and first.moves  # nothing to read, but the group gets its start
    tid = naming.transactional_id(prefix, naming.OFFSETS_SLOT)
    commit_prepared([prepare_offsets(kafka.config, tid, first)], kafka.wire, _log(kafka), run="r1")
    assert group_offsets(kafka.config, group, [(topic, 0), (topic, 1)]) == {(topic, 0): 22, (topic, 1): 8}
    other.abort_transaction(30)  # the open one: its 3 records and the marker are skipped offsets
    _write(other, topic, 0, range(200, 204), "commit")
    second = snapshot_source(kafka.config, spec)
    assert [(p.start, p.end) for p in second.partitions] == [(22, 27), (8, 12)]
    # A partition added after the group's first committed run is read whole, "latest" or not.
    from confluent_kafka.admin import AdminClient, NewPartitions

    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus

    admin = AdminClient(kafka.config)
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    _write(_producer(kafka, f"new-{uuid.uuid4().hex[:6]}"), topic, 2, range(300, 302), "commit")  # knows p2
    last = RunRecord(prefix, "dag/r1", RunStatus.COMMITTED, 1, 0, 0, "d1", source=first)
    third = snapshot_source(kafka.config, spec, previous=last)
    assert [(p.partition, p.start, p.end) for p in third.partitions][2] == (2, 0, 3)
    other.begin_transaction()  # the fixture's teardown aborts an open one


def _commit_a_run(env: KafkaEnv, topic: str, group: str, prefix: str, offsets: int, run: str) -> Any:
    """A sourced run of at most ``offsets`` offsets, its offsets participant prepared and committed;
    its range."""
    read = snapshot_source(env.config, KafkaSourceSpec(group, topics=(topic,), max_offsets_per_run=offsets))
    tid = naming.transactional_id(prefix, naming.OFFSETS_SLOT)
    commit_prepared([prepare_offsets(env.config, tid, read)], env.wire, _log(env), run=run)
    return read


def _reset_to_current(env: KafkaEnv, group: str, topic: str) -> str:
    """Kafka's own tool commits the value the group already has, as a regular (not transactional)
    offset commit: the move issue 37 found replacing a prepared run's offsets at its commit."""
    done = kafka_local().run_tool(
        env.directory,
        "consumer-groups",
        ["--group", group, "--reset-offsets", "--to-current", "--execute", "--topic", topic],
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _sourced_run(env: KafkaEnv, topic: str, group: str, prefix: str, out: str) -> tuple[Any, list[Any]]:
    """A Kafka-sourced run prepared as the operator prepares it: the range, 5 output records in a
    data transaction, the range's ends in the offsets participant; (range, committables)."""
    from tests.helpers.kafka import generate, prepare_in_subprocess

    _commit_a_run(env, topic, group, prefix, 6, "before")  # the group has (3, 3): a same-value commit writes that
    read = snapshot_source(env.config, KafkaSourceSpec(group, topics=(topic,)))
    data = prepare_in_subprocess(env, naming.transactional_id(prefix, 0), generate(out, 5, key_prefix=prefix))
    offsets = prepare_offsets(env.config, naming.transactional_id(prefix, naming.OFFSETS_SLOT), read)
    return read, [data, offsets]


def test_a_same_value_offset_commit_between_prepare_and_commit_still_moves_the_group_with_the_output(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    """On Kafka 3.7+ (the suite's broker): the guard's resend makes the run's offsets the group's
    latest write again. Before 3.7 (scripts/test-compat-brokers): no resend, a loud OffsetsNotMovedError."""
    from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard

    topic, _ = source
    out = kafka.topic(partitions=1)
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    read, committables = _sourced_run(kafka, topic, group, prefix, out)
    assert [(p.start, p.end, p.committed) for p in read.partitions] == [(3, 22, 3), (3, 8, 3)]
    said = _reset_to_current(kafka, group, topic)
    assert re.search(rf"{re.escape(topic)}\s+0\s+3\b", said), said  # it wrote the group's own value, 3

    guard = SourceGuard(kafka.config, [(read, committables[1])])
    kl = kafka_local()
    if kl.version_tuple(kl.KAFKA_VERSION) < (3, 7):
        # A broker before 3.7 does not verify a TxnOffsetCommit against its transaction, so the guard
        # sends none again (docs/design.md): the regular commit wins, and the commit says so, loudly,
        # with the output visible and the group left where the regular commit put it.
        from airflow_provider_kafka2pc.txn.protocol.errors import OffsetsNotMovedError

        with pytest.raises(OffsetsNotMovedError, match=f"consumer group {group!r} did not move with it"):
            commit_prepared(committables, kafka.wire, _log(kafka), run="r2", guard=guard, sources={prefix: read})
        assert kafka.count_committed(out, prefix.encode()) == (5, 5)
        assert consumer_groups_tool(kafka, group) == {(topic, 0): 3, (topic, 1): 3}
        assert kafka.open_transactions(prefix) == []
        return
    report = commit_prepared(committables, kafka.wire, _log(kafka), run="r2", guard=guard, sources={prefix: read})
    assert [x.outcome for x in report.resolutions] == [Verdict.COMMITTED, Verdict.COMMITTED]
    # The output and the group's offsets became visible together: 5 records, the group at the ends.
    assert kafka.count_committed(out, prefix.encode()) == (5, 5)
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 22, (topic, 1): 8}
    assert kafka.open_transactions(prefix) == []


def test_a_same_value_commit_after_the_resend_is_said_with_the_reset_commands_and_the_next_run_refuses(
    kafka: KafkaEnv, source: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The moment left: a regular commit between the guard's resend and the EndTxn. The output is
    visible and the group is not at the run's ends; the commit says so, with Kafka's commands, and the
    next run refuses (never advising accept_gap) until those commands have run."""
    import shlex

    from airflow_provider_kafka2pc.txn.protocol.errors import OffsetsNotMovedError
    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
    from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard

    topic, _ = source
    out = kafka.topic(partitions=1)
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    read, committables = _sourced_run(kafka, topic, group, prefix, out)

    class LateCommit(SourceGuard):
        def before_decision(self, wire: Any, resend_s: float = 15.0) -> tuple[dict[str, str], bool]:
            found = super().before_decision(wire, resend_s)
            _reset_to_current(kafka, group, topic)  # after the resend, before the decision and EndTxn
            return found

    guard = LateCommit(kafka.config, [(read, committables[1])])
    log = _log(kafka)
    with pytest.raises(OffsetsNotMovedError) as behind:
        commit_prepared(committables, kafka.wire, log, run="r2", guard=guard, sources={prefix: read})
    said = str(behind.value)
    assert f"run r2 committed: its output is visible, but consumer group {group!r} did not move" in said, said
    assert f"{topic}-0 is at 3, the run ended at 22" in said and f"{topic}-1 is at 3, the run ended at 8" in said
    assert "Do not set accept_gap=True" in said
    assert kafka.count_committed(out, prefix.encode()) == (5, 5)
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 3, (topic, 1): 3}
    assert kafka.open_transactions(prefix) == []
    # kafka2pc list says it too, with the same commands, and exits 5 (a loss would be 4).
    from airflow_provider_kafka2pc.cli import EXIT_SOURCE_BEHIND, main

    common = ["--prefix", prefix, "--bootstrap-servers", kafka.bootstrap, "--decision-topic", log.topic]
    assert main(["list", *common]) == EXIT_SOURCE_BEHIND
    listed = capsys.readouterr().out
    assert "SOURCE GROUP BEHIND: run r2 (decision " in listed and f"--topic {topic}:0 --to-offset 22" in listed, listed

    last = RunRecord(prefix, "r2", RunStatus.COMMITTED, 2, 5, 0, "d2", source=read)
    spec = KafkaSourceSpec(group, topics=(topic,))
    with pytest.raises(SourceError) as refused:
        snapshot_source(kafka.config, spec, previous=last)
    assert "run r2 (decision d2) committed: its output is visible" in str(refused.value)
    assert "set accept_gap=True for one run" not in str(refused.value)
    # Following the message: its commands, as printed, move the group; the next run follows on.
    commands = re.findall(r"kafka-consumer-groups (--bootstrap-server .*?--execute)", said)
    assert len(commands) == 2, said
    for command in commands:
        args = [a for a in shlex.split(command) if a not in ("--command-config", "admin.properties")]
        done = kafka_local().run_tool(kafka.directory, "consumer-groups", args)
        assert done.returncode == 0, done.stderr[-2000:]
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 22, (topic, 1): 8}
    assert not snapshot_source(kafka.config, spec, previous=last).moves
    assert main(["list", *common]) == 0


def test_a_commit_that_comes_back_after_later_runs_moved_the_group_on_says_nothing_of_moving_it_back(
    kafka: KafkaEnv, source: tuple[str, Any]
) -> None:
    """DESIGN §15: a commit paused between its EndTxns and its look at the group comes back after a
    later run committed and moved the group past the run's ends. That group is not behind the run;
    before, the commit raised OffsetsNotMovedError with commands that moved it back to the run's
    ends, and following them made the next run export the later run's records again."""
    from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard

    topic, _ = source
    out = kafka.topic(partitions=1)
    group, prefix = f"g{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    read, committables = _sourced_run(kafka, topic, group, prefix, out)
    guard = SourceGuard(kafka.config, [(read, committables[1])])
    report = commit_prepared(committables, kafka.wire, _log(kafka), run="r2", guard=guard, sources={prefix: read})
    assert [x.outcome for x in report.resolutions] == [Verdict.COMMITTED, Verdict.COMMITTED]
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 22, (topic, 1): 8}
    _write(_producer(kafka, f"more-{uuid.uuid4().hex[:6]}"), topic, 0, range(200, 204), "commit")
    later = _commit_a_run(kafka, topic, group, prefix, 100, "r3")
    assert [(p.start, p.end) for p in later.partitions if p.partition == 0] == [(22, 27)]
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 27, (topic, 1): 8}
    guard.after_commit("r2", [committables[1].transactional_id])  # r2's commit, resumed: nothing to say
    assert consumer_groups_tool(kafka, group) == {(topic, 0): 27, (topic, 1): 8}
