"""Where the time of (c) goes, without Spark: ``write_partition`` on Arrow batches, then the commit.

    .venv/bin/python benchmarks/profile_write.py [--rows 1000000] [--bootstrap HOST:PORT] [--variants]

The batches have the shape Spark hands to ``mapInArrow`` (two non-null string columns, 10,000 rows
per batch, 4 partitions); the partitions are written one after the other in this process, each
one transaction as in an executor, then committed with ``commit_prepared``.

1. phases (median of ``--runs``), measured without a profiler by timing wrappers around
   ``TransactionalWriter.open`` (init_transactions), ``_encode_column`` (Arrow → Python lists),
   ``flush_and_verify``, ``prepare`` (flush + waiting for the producer id in librdkafka's
   statistics) and the parts of ``commit_prepared``; the produce loop is the rest of
   ``write_partition``. Each as wall clock and as CPU time of the Python thread;
2. the same under cProfile, top ``--top`` functions by own time;
3. with ``--variants``: per-record cost of alternatives for the two hot spots (conversion, and the
   produce loop with its delivery callbacks), ``--repeat`` interleaved runs each.

Put a modified copy of the package first on ``PYTHONPATH`` to profile that instead.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import bench_data
from bench_env import Kafka, Phases, broker, use_repo
from bench_txn import coordinator_phases

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable


def write_all(kafka: Kafka, partitions: list[list[Any]], topic: str, timeout_ms: int) -> tuple[list[Committable], str]:
    """Every partition through ``write_partition`` as one transaction; returns committables and prefix."""
    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import write_partition

    settings = ExportSettings(f"prof{uuid.uuid4().hex[:8]}", kafka.config, topic, transaction_timeout_ms=timeout_ms)
    committables: list[Committable] = []
    for slot, batches in enumerate(partitions):
        for out in write_partition(settings, slot, 0, iter(batches)):
            committables.append(Committable.from_json(out.column(out.schema.names.index("committable"))[0].as_py()))
    return committables, settings.transactional_id_prefix


def commit(kafka: Kafka, committables: list[Committable], decisions: str) -> None:
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    decision_log = DecisionLog(kafka.config, topic=decisions)
    with WireClient(kafka.config) as wire:
        commit_prepared(committables, wire, decision_log, run=f"prof-{uuid.uuid4().hex[:6]}")
    decision_log.close()


COMMIT_PHASES = {
    "decision log read": "decision log read (a new consumer each time)",
    "DescribeTransactions": "DescribeTransactions",
    "decision log append": "decision log appends (COMMIT, then its outcome and run record)",
    "EndTxn (resolve)": "EndTxn (FindCoordinator + EndTxn per transaction)",
}


def abort_prefix(kafka: Kafka, prefix: str, decisions: str) -> None:
    """Abort what a profiling run left open (it has no COMMIT decision), as the abort task would."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover

    with WireClient(kafka.config) as wire:
        recover(wire, prefix, DecisionLog(kafka.config, topic=decisions), run="prof-cleanup")


def phase_run(kafka: Kafka, partitions: list[list[Any]], timeout_ms: int, decisions: str) -> dict[str, float]:
    """One instrumented write + commit; returns seconds per phase (and the read_committed count)."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.writer import DeliveryWriter, TransactionalWriter
    from airflow_provider_kafka2pc.txn.two_phase import partition_writer as job

    topic = kafka.topic("profile")
    DecisionLog(kafka.config, topic=decisions).ensure_topic()
    p = Phases()
    with contextlib.ExitStack() as stack:
        stack.enter_context(p.timing(TransactionalWriter, "open", "open"))
        stack.enter_context(p.timing(job, "_encode_column", "encode"))
        stack.enter_context(p.timing(DeliveryWriter, "flush_and_verify", "flush"))
        stack.enter_context(p.timing(TransactionalWriter, "prepare", "prepare"))
        stack.enter_context(coordinator_phases(p))
        started, cpu_started = time.perf_counter(), time.thread_time()
        committables, _ = write_all(kafka, partitions, topic, timeout_ms)
        written, cpu_written = time.perf_counter(), time.thread_time()
        commit(kafka, committables, decisions)
        done, cpu_done = time.perf_counter(), time.thread_time()
    out: dict[str, float] = {"transactions": len(committables), "counted": kafka.count_committed(topic)}
    for kind, s, write_s, commit_s in (
        ("wall", p.seconds, written - started, done - written),
        ("cpu", p.cpu, cpu_written - cpu_started, cpu_done - cpu_written),
    ):
        phases = {
            "open": s["open"],
            "encode": s["encode"],
            "loop": write_s - s["open"] - s["encode"] - s["prepare"],
            "flush": s["flush"],
            "stats": s["prepare"] - s["flush"],
            "write": write_s,
            "commit": commit_s,
            **{phase: s[phase] for phase in COMMIT_PHASES},
            "total": write_s + commit_s,
        }
        out.update({f"{kind}:{k}": v for k, v in phases.items()})
    return out


PHASE_LABELS = {
    "open": "init_transactions + begin (TransactionalWriter.open)",
    "encode": "Arrow -> Python bytes lists (_encode_column)",
    "loop": "produce loop (write_partition + DeliveryWriter.produce)",
    "flush": "flush + delivery callbacks (flush_and_verify)",
    "stats": "wait for producer id in statistics, release",
    "write": "= write_partition, all partitions",
    "commit": "commit_prepared",
    **{phase: f"  {label}" for phase, label in COMMIT_PHASES.items()},
    "total": "= total",
}


def phase_report(runs: list[dict[str, float]], rows: int, partitions: int) -> str:
    counted = [int(r["counted"]) for r in runs]
    lines = [
        f"(c) without Spark: {rows:,} records, {partitions} partitions written one after the other, "
        f"{int(runs[0]['transactions'])} transactions, then commit_prepared; median of {len(runs)} run(s); "
        f"read_committed {counted}" + ("" if set(counted) == {rows} else "  <<<< MISMATCH"),
        "wall: elapsed seconds; cpu: CPU seconds of the Python thread itself (the rest of wall is waiting"
        " for the broker, librdkafka's threads, or a core)",
        f"{'phase':<58} {'wall s':>7} {'share':>6} {'ns/rec':>7} {'cpu s':>7} {'ns/rec':>7}",
    ]
    total = statistics.median(r["wall:total"] for r in runs)
    for phase, label in PHASE_LABELS.items():
        wall = statistics.median(r[f"wall:{phase}"] for r in runs)
        cpu = statistics.median(r[f"cpu:{phase}"] for r in runs)
        lines.append(
            f"{label:<58} {wall:>7.3f} {100 * wall / total:>5.1f}% {1e9 * wall / rows:>7.0f} "
            f"{cpu:>7.3f} {1e9 * cpu / rows:>7.0f}"
        )
    return "\n".join(lines)


def profile_run(kafka: Kafka, partitions: list[list[Any]], timeout_ms: int, top: int, decisions: str) -> str:
    topic = kafka.topic("cprofile")
    profiler = cProfile.Profile()
    profiler.enable()
    _, prefix = write_all(kafka, partitions, topic, timeout_ms)
    profiler.disable()
    abort_prefix(kafka, prefix, decisions)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    text = out.getvalue()
    start = text.find("   ncalls")
    return f"cProfile of write_partition, all partitions, top {top} by own time:\n{text[start:].rstrip()}"


def variants(kafka: Kafka, partitions: list[list[Any]], repeat: int, timeout_ms: int) -> str:
    """Per-record cost of alternatives for the conversion and for the produce loop."""
    import pyarrow as pa

    from airflow_provider_kafka2pc.txn.two_phase import partition_writer as job

    batches = [b for part in partitions for b in part]
    rows = sum(b.num_rows for b in batches)

    conversions: dict[str, Callable[[Any], list[Any]]] = {
        "to_pylist() + str.encode() (before)": lambda c: [None if v is None else v.encode() for v in c.to_pylist()],
        "partition_writer._encode_column (cast to binary, to_pylist)": job._encode_column,
        "cast(pa.binary()).to_pylist()": lambda c: c.cast(pa.binary()).to_pylist(),
        "cast(pa.binary()).to_numpy(zero_copy_only=False).tolist()": lambda c: (
            c.cast(pa.binary()).to_numpy(zero_copy_only=False).tolist()
        ),
    }
    lines = [
        f"variants, {rows:,} records (key and value columns), {repeat} runs each, interleaved;",
        "ns per record: wall median [min-max], and CPU of the Python thread (median)",
    ]
    for name, convert in conversions.items():
        times = []
        for _ in range(repeat):
            started = _now()
            for b in batches:
                convert(b.column(0))
                convert(b.column(1))
            times.append(_since(started))
        lines.append(f"  convert  {name:<60} {_ns(times, rows)}")

    keys: list[bytes] = []
    values: list[bytes] = []
    for b in batches:
        keys += b.column(0).cast(pa.binary()).to_pylist()
        values += b.column(1).cast(pa.binary()).to_pylist()
    loops: dict[str, Callable[[str], tuple[float, float]]] = {
        "DeliveryWriter.produce per record": lambda t: _loop_writer(kafka, t, keys, values, timeout_ms),
        "Producer.produce, per-record Python on_delivery": lambda t: _loop_raw(
            kafka, t, keys, values, timeout_ms, False
        ),
        "Producer.produce, delivery.report.only.error": lambda t: _loop_raw(kafka, t, keys, values, timeout_ms, True),
        "produce_batch(list of dicts per 10k), only.error": lambda t: _loop_batch(kafka, t, keys, values, timeout_ms),
    }
    loop_times: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
    for _ in range(repeat):  # interleaved, so a slow phase of the machine hits every variant alike
        for name, loop in loops.items():
            loop_times[name].append(loop(kafka.topic("variant")))
    for name in loops:
        lines.append(f"  produce  {name:<60} {_ns(loop_times[name], rows)}  (one transaction, incl. flush)")
    return "\n".join(lines)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def _since(started: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU of this thread) seconds since ``started``."""
    return time.perf_counter() - started[0], time.thread_time() - started[1]


def _ns(times: list[tuple[float, float]], rows: int) -> str:
    wall = [1e9 * t / rows for t, _ in times]
    cpu = statistics.median(1e9 * c / rows for _, c in times)
    return f"wall {statistics.median(wall):>5.0f} [{min(wall):.0f}-{max(wall):.0f}]  cpu {cpu:>5.0f}"


def _txn_producer(kafka: Kafka, timeout_ms: int, only_errors: bool, on_delivery: Any = None) -> Any:
    from confluent_kafka import Producer

    from airflow_provider_kafka2pc.txn.kafka.writer import PRODUCER_DEFAULTS

    conf: dict[str, Any] = {
        **PRODUCER_DEFAULTS,
        **kafka.config,
        "transactional.id": f"profvar-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": timeout_ms,
        "enable.idempotence": True,
        "acks": "all",
    }
    if only_errors:
        conf["delivery.report.only.error"] = True
    if on_delivery is not None:
        conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    producer.init_transactions(60)
    producer.begin_transaction()
    return producer


def _finish(producer: Any, started: tuple[float, float]) -> tuple[float, float]:
    if producer.flush(120):
        raise RuntimeError("records left after flush")
    elapsed = _since(started)
    producer.abort_transaction(60)
    return elapsed


def _loop_writer(
    kafka: Kafka, topic: str, keys: list[bytes], values: list[bytes], timeout_ms: int
) -> tuple[float, float]:
    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter

    writer = TransactionalWriter(kafka.config, f"profvar-{uuid.uuid4().hex[:8]}", timeout_ms).open()
    produce = writer.produce
    started = _now()
    for key, value in zip(keys, values, strict=True):
        produce(topic, value, key)
    writer.flush_and_verify()
    elapsed = _since(started)
    writer._producer.abort_transaction(60)
    return elapsed


def _loop_raw(
    kafka: Kafka, topic: str, keys: list[bytes], values: list[bytes], timeout_ms: int, only_errors: bool
) -> tuple[float, float]:
    failed: list[Any] = []
    partitions: set[tuple[str, int]] = set()

    def on_delivery(err: Any, msg: Any) -> None:  # what DeliveryWriter._on_delivery keeps
        if err is not None:
            failed.append(err)
        else:
            partitions.add((msg.topic(), msg.partition()))

    producer = _txn_producer(kafka, timeout_ms, only_errors, on_delivery)
    produce, poll = producer.produce, producer.poll
    started = _now()
    for lo in range(0, len(keys), 10_000):
        for key, value in zip(keys[lo : lo + 10_000], values[lo : lo + 10_000], strict=True):
            try:
                produce(topic, value, key)
            except BufferError:
                poll(0.05)
                produce(topic, value, key)
        poll(0)
    elapsed = _finish(producer, started)
    if failed:
        raise RuntimeError(f"{len(failed)} deliveries failed: {failed[0]}")
    return elapsed


def _loop_batch(
    kafka: Kafka, topic: str, keys: list[bytes], values: list[bytes], timeout_ms: int
) -> tuple[float, float]:
    producer = _txn_producer(kafka, timeout_ms, True)
    started = _now()
    for lo in range(0, len(keys), 10_000):
        messages = [
            {"key": k, "value": v} for k, v in zip(keys[lo : lo + 10_000], values[lo : lo + 10_000], strict=True)
        ]
        queued = producer.produce_batch(topic, messages)
        if queued != len(messages):
            raise RuntimeError(f"produce_batch queued {queued} of {len(messages)}")
        producer.poll(0)
    return _finish(producer, started)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--bootstrap", help="use this broker instead of starting a 1-broker cluster")
    ap.add_argument("--payload", choices=sorted(bench_data.PAYLOADS), default="lpad")
    ap.add_argument("--runs", type=int, default=3, help="instrumented runs; the phase table shows medians")
    ap.add_argument("--top", type=int, default=25, help="cProfile lines to print (0: no cProfile run)")
    ap.add_argument("--variants", action="store_true", help="also measure alternatives for the hot spots")
    ap.add_argument("--repeat", type=int, default=5, help="runs per variant")
    args = ap.parse_args(argv)
    use_repo()
    from airflow_provider_kafka2pc.txn.kafka.transactions import broker_max_transaction_timeout_ms
    from airflow_provider_kafka2pc.txn.two_phase import partition_writer as job

    print(f"profiling {job.__file__}", flush=True)
    partitions = bench_data.arrow_partitions(args.rows, args.payload)
    with broker(args.bootstrap) as bootstrap:
        kafka = Kafka(bootstrap)
        timeout_ms = broker_max_transaction_timeout_ms(kafka.config)
        decisions = f"kafka2pc_prof_decisions_{uuid.uuid4().hex[:8]}"
        _, warm = write_all(kafka, bench_data.arrow_partitions(40_000, args.payload), kafka.topic("warm"), timeout_ms)
        abort_prefix(kafka, warm, decisions)
        runs = [phase_run(kafka, partitions, timeout_ms, decisions) for _ in range(args.runs)]
        print(phase_report(runs, args.rows, len(partitions)), flush=True)
        if args.top > 0:
            print(flush=True)
            print(profile_run(kafka, partitions, timeout_ms, args.top, decisions), flush=True)
        if args.variants:
            print(flush=True)
            print(variants(kafka, partitions, args.repeat, timeout_ms), flush=True)
        kafka.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
