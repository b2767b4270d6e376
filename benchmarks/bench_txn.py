"""Latency of the coordinator's side: committing many prepared transactions, and recovery.

Both prepare their transactions in this process with ``TransactionalWriter`` (many at once on a
thread pool: each writer waits up to a second for librdkafka's statistics to learn its producer
id), which is not timed; only ``commit_prepared`` and ``recover`` are.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from bench_env import Kafka, Phases

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable

PREPARE_THREADS = 64


@contextlib.contextmanager
def coordinator_phases(phases: Phases) -> Iterator[None]:
    """Time the parts of ``commit_prepared`` / ``recover`` (a resolve that describes first includes it)."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
    from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver

    with contextlib.ExitStack() as stack:
        stack.enter_context(phases.timing(DecisionLog, "read", "decision log read"))
        stack.enter_context(phases.timing(DecisionLog, "append", "decision log append"))
        stack.enter_context(phases.timing(TransactionInspector, "describe_prefix", "ListTransactions + Describe"))
        stack.enter_context(phases.timing(TransactionResolver, "observe_all", "DescribeTransactions"))
        stack.enter_context(phases.timing(TransactionResolver, "resolve", "EndTxn (resolve)"))
        yield


def _phases_dict(phases: Phases) -> dict[str, dict[str, float]]:
    return {k: {"seconds": round(v, 4), "calls": phases.calls[k]} for k, v in phases.seconds.items()}


def prepare_many(
    kafka: Kafka, topic: str, prefix: str, count: int, records_each: int, timeout_ms: int
) -> list[Committable]:
    """``count`` open transactions ``{prefix}-0`` … of ``records_each`` records, like ``count`` Spark tasks."""
    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter
    from airflow_provider_kafka2pc.txn.protocol import naming

    def one(slot: int) -> Committable:
        writer = TransactionalWriter(kafka.config, naming.transactional_id(prefix, slot), timeout_ms).open()
        for i in range(records_each):
            writer.produce(topic, f"value-{slot}-{i}".encode(), f"{slot}-{i}".encode())
        committable = writer.prepare()
        assert committable is not None
        return committable

    with ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="bench-prepare") as pool:
        return list(pool.map(one, range(count)))


def commit_many(kafka: Kafka, decision_topic: str, count: int = 200, records_each: int = 10) -> dict[str, Any]:
    """Time ``commit_prepared`` on ``count`` prepared transactions."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector, broker_max_transaction_timeout_ms
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    topic = kafka.topic("commit")
    prefix = f"benchc{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    committables = prepare_many(
        kafka, topic, prefix, count, records_each, broker_max_transaction_timeout_ms(kafka.config)
    )
    prepare_s = time.perf_counter() - started
    decision_log = DecisionLog(kafka.config, topic=decision_topic)
    decision_log.ensure_topic()
    phases = Phases()
    with WireClient(kafka.config) as wire, coordinator_phases(phases):
        started = time.perf_counter()
        report = commit_prepared(committables, wire, decision_log, run=f"bench-{prefix}")
        seconds = time.perf_counter() - started
        still_open = TransactionInspector(wire).list_prefix(prefix)
    decision_log.close()
    committed = kafka.count_committed(topic)
    return {
        "transactions": count,
        "records_each": records_each,
        "seconds": round(seconds, 4),
        "phases": _phases_dict(phases),
        "prepare_seconds_untimed": round(prepare_s, 2),
        "committed_transactions": report.count(Verdict.COMMITTED),
        "still_open": len(still_open),
        "read_committed": committed,
        "verified": report.count(Verdict.COMMITTED) == count and not still_open and committed == count * records_each,
    }


def recover_many(kafka: Kafka, decision_topic: str, count: int = 1000, records_each: int = 1) -> dict[str, Any]:
    """Time ``recover`` of ``count`` lingering transactions of one prefix.

    Like a run that died between its COMMIT decision and the EndTxns, half of them carry a COMMIT
    decision (recovery commits those); the other half have none, like a prepare that died
    (recovery aborts those)."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector, broker_max_transaction_timeout_ms
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import decide_commit
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover

    topic = kafka.topic("recovery")
    prefix = f"benchr{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    committables = prepare_many(
        kafka, topic, prefix, count, records_each, broker_max_transaction_timeout_ms(kafka.config)
    )
    decided = committables[: count // 2]
    decision_log = DecisionLog(kafka.config, topic=decision_topic)
    with WireClient(kafka.config) as wire:  # a run that died right after its COMMIT decision
        decide_commit(decided, wire, decision_log, run=f"bench-{prefix}")
    prepare_s = time.perf_counter() - started
    phases = Phases()
    with WireClient(kafka.config) as wire:
        lingering = len(TransactionInspector(wire).list_prefix(prefix))
        with coordinator_phases(phases):
            started = time.perf_counter()
            result = recover(wire, prefix, decision_log, run=f"bench-recover-{prefix}")
            seconds = time.perf_counter() - started
        still_open = TransactionInspector(wire).list_prefix(prefix)
    decision_log.close()
    committed = kafka.count_committed(topic)
    n_committed = sum(1 for r in result.resolutions if r.outcome is Verdict.COMMITTED)
    n_aborted = sum(1 for r in result.resolutions if r.outcome is Verdict.ABORTED)
    return {
        "transactions": count,
        "lingering_before": lingering,
        "records_each": records_each,
        "seconds": round(seconds, 4),
        "phases": _phases_dict(phases),
        "prepare_seconds_untimed": round(prepare_s, 2),
        "committed": n_committed,
        "aborted": n_aborted,
        "still_open": len(still_open),
        "read_committed": committed,
        "verified": (
            lingering == count
            and n_committed == len(decided)
            and n_aborted == count - len(decided)
            and not still_open
            and committed == len(decided) * records_each
        ),
    }


def read_history(kafka: Kafka, runs: int = 100_000, txns_per_run: int = 8) -> dict[str, Any]:
    """Time the decision-log reads of a log that holds ``runs`` finished runs.

    Each finished run left what the protocol writes: its COMMIT decision and its tombstone in
    partition 0, its run record in partition 1 (the cleaner has not run: the worst case).
    Measured: a recovery pass's read (partition 0 only), and an export's or a commit's read,
    which also looks up its own run's record in partition 1."""
    import tracemalloc

    from confluent_kafka import Producer

    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.decision_topic import HISTORY_PARTITION
    from airflow_provider_kafka2pc.txn.protocol.records import Covered, Kind, RunRecord, RunStatus, new_decision

    topic = f"kafka2pc_bench_history_{uuid.uuid4().hex[:8]}"
    log = DecisionLog(kafka.config, topic=topic)
    log.ensure_topic()
    prefix = "hist"
    producer = Producer({**kafka.config, "linger.ms": 50, "compression.type": "lz4", "batch.size": 1_000_000})
    now = int(time.time() * 1000)

    def finish_runs(first: int, count: int) -> None:
        """What ``count`` finished runs leave behind: decision + tombstone in 0, run record in 1."""
        for i in range(first, first + count):
            run = f"dag/scheduled__{i}"
            txns = [
                Covered(f"{prefix}-{s}", 1000 + s, i % 30000, 100, (f"orders-{s}",), now) for s in range(txns_per_run)
            ]
            d = new_decision(Kind.COMMIT, txns, run, "commit", [prefix], now)
            rec = RunRecord(prefix, run, RunStatus.COMMITTED, txns_per_run, 100 * txns_per_run, now, d.decision_id)
            for key, value, partition in (
                (d.key, d.to_json(), 0),
                (rec.key, rec.to_json(), HISTORY_PARTITION),
                (d.key, None, 0),
            ):
                while True:
                    try:
                        producer.produce(topic, key=key, value=value, partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
        producer.flush(120)

    started = time.perf_counter()
    finish_runs(0, runs)
    write_s = time.perf_counter() - started

    def measure(run: str | None) -> dict[str, float]:
        times, peak = [], 0
        for _ in range(3):
            tracemalloc.start()
            t0 = time.perf_counter()
            state = log.read_for(prefix, run)
            times.append(time.perf_counter() - t0)
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            assert state.decisions == {}
        return {"seconds": round(min(times), 3), "peak_python_mb": round(peak / 1e6, 1)}

    uncompacted = {"recovery_read": measure(None), "own_run_read": measure("dag/scheduled__77777")}
    # Steady state: once segments roll (segment.ms, 10 min) and tombstones expire
    # (delete.retention.ms, 10 min), the cleaner leaves only live records in partition 0. The
    # benchmark shortens both to seconds to get there now.
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(kafka.config)
    fast = {"segment.ms": "1000", "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.01"}
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in fast.items()]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin.incremental_alter_configs([res])[res].result(30)
    compacted = uncompacted
    deadline = time.monotonic() + 240
    written = runs
    while time.monotonic() < deadline:
        # Runs keep finishing, as in production: new dirty data is what makes the cleaner pass
        # again and drop tombstones older than delete.retention.ms.
        finish_runs(written, runs // 50)
        written += runs // 50
        time.sleep(5)
        compacted = {"recovery_read": measure(None), "own_run_read": measure("dag/scheduled__77777")}
        if compacted["recovery_read"]["seconds"] < 0.2:
            break
    log.close()
    return {
        "runs": runs,
        "runs_at_the_end": written,
        "records_written": 3 * written,
        "write_seconds": round(write_s, 1),
        "uncompacted": uncompacted,
        "compacted": compacted,
        "seconds": compacted["recovery_read"]["seconds"],
        "verified": True,
    }
