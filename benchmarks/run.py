"""kafka2pc benchmark: throughput side by side, commit and recovery latency.

    .venv/bin/python benchmarks/run.py [--mode quick|full] [--bootstrap HOST:PORT]

One process, one broker (its own 1-broker cluster unless ``--bootstrap`` is given), one
``local[2]`` SparkSession, the same N records (quick: 1M, full: 10M; 100-byte values, keys =
row number) into a fresh 4-partition topic per run. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_data
import bench_spark
from bench_env import REPO, Kafka, broker, competing_load, kafka_local, package_dir, use_repo
from bench_throughput import LABELS, ORDER, Runner, Sample
from bench_txn import commit_many, read_history, recover_many
from bench_window import render as render_window
from bench_window import window_run

ROWS = {"quick": 1_000_000, "full": 10_000_000}
WARMUP_ROWS = 40_000
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
TXN_BENCHES = ("commit", "recovery", "log", "window")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=sorted(ROWS), default="quick", help="quick: 1M records, full: 10M")
    p.add_argument("--rows", type=int, help="override the mode's record count (smoke tests)")
    p.add_argument("--bootstrap", help="use this broker instead of starting a 1-broker cluster")
    p.add_argument(
        "--payload", choices=sorted(bench_data.PAYLOADS), default="lpad", help="value bytes (see bench_data)"
    )
    p.add_argument(
        "--repeat", type=int, help="timed runs per mode, interleaved; the table shows the median (quick 3, full 1)"
    )
    p.add_argument(
        "--only",
        default=",".join((*ORDER, *TXN_BENCHES)),
        help="comma-separated subset of: a,b,b',c,n,n+,n0,nc,nb,h,k,d,s,commit,recovery,log,window (default: all)",
    )
    p.add_argument(
        "--source",
        choices=("cached", "parquet", "computed"),
        default="cached",
        help="the Spark modes read a cached frame (default), Parquet files written once, not cached, or rows "
        "computed from spark.range by every run",
    )
    p.add_argument(
        "--master",
        default="local[2]",
        help="Spark master URL (e.g. the emulated cluster's spark://…, with --spark-conf spark.driver.host=…)",
    )
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (the cached DataFrame lives there)")
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the benchmark's SparkSession, repeatable (e.g. the user guide's "
        "spark.sql.execution.arrow.maxBytesPerBatch=2147483647); printed in the banner",
    )
    p.add_argument(
        "--contention",
        type=int,
        default=0,
        metavar="K",
        help="K competing busy processes (SHA-256 loops) on the same cores while every mode runs, warm-up "
        "included: the same competition each time (default 0, a quiet machine)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up: the first timed run of each mode is its first export in this process",
    )
    p.add_argument("--json", type=Path, default=RESULTS, help=f"results file (default {RESULTS.relative_to(REPO)})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.json = args.json.resolve()
    selected = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(selected) - set(ORDER) - set(TXN_BENCHES)
    if unknown:
        raise SystemExit(f"--only: unknown {sorted(unknown)}")
    modes = [m for m in ORDER if m in selected]
    rows = args.rows or ROWS[args.mode]
    if args.repeat is None:
        args.repeat = 3 if args.mode == "quick" else 1
    use_repo()
    env = _environment(args, rows)
    print(_banner(env), flush=True)

    samples: list[Sample] = []
    txn: dict[str, dict[str, Any]] = {}
    spark_modes = set(ORDER) - {"a"} & set(modes) or {"window"} & set(selected)
    jars = bench_spark.sink_jars() if spark_modes else []
    with broker(args.bootstrap) as bootstrap:
        env["bootstrap"] = bootstrap
        kafka = Kafka(bootstrap)
        decisions = f"kafka2pc_bench_decisions_{uuid.uuid4().hex[:8]}"
        with contextlib.ExitStack() as stack:
            spark = (
                stack.enter_context(bench_spark.session(jars, args.driver_memory, env["spark_conf"], args.master))
                if jars
                else None
            )
            connect = (
                stack.enter_context(
                    bench_spark.connect_session(
                        args.master,
                        {**env["spark_conf"], "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"]},
                        args.driver_memory,
                    )
                )
                if "k" in modes
                else None
            )
            stack.callback(kafka.close)
            env["package"] = package_dir()
            if spark is not None:
                env["package_in_spark_workers"] = bench_spark.worker_package(spark)
            print(f"package: {env['package']} (Spark workers: {env.get('package_in_spark_workers', '-')})")
            if modes:
                with competing_load(args.contention):
                    samples = _throughput(
                        kafka, spark, modes, rows, args.payload, args.repeat, decisions, args.source, connect, args.cold
                    )
            if "commit" in selected:
                print("commit_prepared of 200 prepared transactions …", flush=True)
                txn["commit_200"] = commit_many(kafka, decisions)
                print(f"  {txn['commit_200']}", flush=True)
            if "recovery" in selected:
                print("recover() of 1,000 lingering transactions …", flush=True)
                txn["recovery_1000"] = recover_many(kafka, decisions)
                print(f"  {txn['recovery_1000']}", flush=True)
            if "window" in selected and spark is not None:
                print("window: a ~60 s source, not materialized and materialized first …", flush=True)
                runs = [window_run(kafka, spark, decisions, materialize) for materialize in (False, True)]
                txn["window"] = {"runs": runs, "verified": all(r["verified"] for r in runs)}
                print(render_window(runs), flush=True)
            if "log" in selected:
                print("decision log read with 100,000 finished runs …", flush=True)
                txn["log_100k_runs"] = read_history(kafka)
                print(f"  {txn['log_100k_runs']}", flush=True)

    table = _table(samples)
    goals = _goals(table, txn)
    if table:
        print()
        print(_render(table, env))
    print()
    print(_render_txn(txn))
    print(_render_goals(goals))
    failures = [s for s in samples if not s.verified] + [
        {"bench": k, **v} for k, v in txn.items() if not v.get("verified")
    ]
    _write_json(args.json, env, samples, table, txn, goals, failures)
    if failures:
        print(_loud(f"VERIFICATION FAILED for {len(failures)} run(s): see above and {args.json}"))
        return 1
    return 0


def _throughput(
    kafka: Kafka,
    spark: Any,
    modes: list[str],
    rows: int,
    payload: str,
    repeat: int,
    decisions: str,
    source: str = "cached",
    connect: Any = None,
    cold: bool = False,
) -> list[Sample]:
    scratch = Path(tempfile.mkdtemp(prefix="kafka2pc-bench-parquet-"))

    def frame(session: Any, n: int, name: str) -> Any:
        if source == "parquet":
            return bench_data.parquet_frame(session, n, payload, str(scratch / f"{name}-{n}"))
        if source == "computed":
            return bench_data.computed_frame(session, n, payload)
        return bench_data.spark_frame(session, n, payload)

    def runner(n: int) -> Runner:
        keys, values = bench_data.python_records(n, payload) if "a" in modes else ([], [])
        df = frame(spark, n, "rows") if spark is not None else None
        connect_df = frame(connect, n, "connect-rows") if connect is not None else None
        return Runner(kafka, n, df, keys, values, bench_data.payload_bytes(n), decisions, connect_df)

    try:
        return _timed_runs(runner, modes, rows, repeat, cold)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _timed_runs(runner: Any, modes: list[str], rows: int, repeat: int, cold: bool = False) -> list[Sample]:
    if not cold:
        _warm_up(runner, modes)

    started = time.perf_counter()
    print(f"building {rows:,} records (not timed) …", flush=True)
    main_runner = runner(rows)
    print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)
    samples: list[Sample] = []
    for attempt in range(repeat):
        for mode in modes:
            time.sleep(1.0)  # let the broker finish the previous run's background work
            sample = main_runner.run(mode)
            samples.append(sample)
            phases = ", ".join(f"{k} {v:.3f}" for k, v in sample.phases.items())
            seen = "read_committed" if sample.topic else "rows seen"
            print(
                f"  [{attempt + 1}/{repeat}] {LABELS[mode]:<40} {sample.seconds:8.3f} s "
                f"{sample.rows_per_s:>12,.0f} rows/s  {seen} {sample.committed:,}"
                + (f"  ({phases})" if phases else ""),
                flush=True,
            )
            if not sample.verified:
                print(
                    _loud(f"{LABELS[mode]}: wrote {sample.rows:,} records, read_committed counted {sample.committed:,}")
                )
    if main_runner.df is not None:
        main_runner.df.unpersist()
    return samples


def _warm_up(runner: Any, modes: list[str]) -> None:
    """Python workers started and importing, the JVM's Kafka producer loaded and compiled, every
    path proven against the broker before anything is timed."""
    print(f"warm-up with {WARMUP_ROWS:,} records: {', '.join(modes)}", flush=True)
    warm = runner(WARMUP_ROWS)
    for mode in modes:
        sample = warm.run(mode)
        if not sample.verified:
            raise RuntimeError(_loud(f"warm-up {mode}: wrote {sample.rows}, read_committed counted {sample.committed}"))
    if warm.df is not None:
        warm.df.unpersist()


def _table(samples: list[Sample]) -> list[dict[str, Any]]:
    by_mode: dict[str, list[Sample]] = {}
    for s in samples:
        by_mode.setdefault(s.mode, []).append(s)
    rows: list[dict[str, Any]] = []
    for mode in ORDER:
        if mode not in by_mode:
            continue
        runs = by_mode[mode]
        seconds = statistics.median(s.seconds for s in runs)
        phases = {k: statistics.median(s.phases[k] for s in runs) for k in runs[0].phases}
        rows.append(
            {
                "mode": mode,
                "label": LABELS[mode],
                "seconds": seconds,
                "rows_per_s": runs[0].rows / seconds,
                "mb_per_s": runs[0].payload_bytes / seconds / 1e6,
                "cpu_ns_per_row": statistics.median(s.cpu_ns_per_row for s in runs),
                "worker_cpu_ns_per_row": statistics.median(s.worker_cpu_ns_per_row for s in runs),
                "machine_cpu_ns_per_row": statistics.median(s.machine_cpu_ns_per_row for s in runs),
                # The first timed run apart from the others: cold with --cold (the mode's first
                # export in this process), else the first after the warm-up.
                "first_seconds": runs[0].seconds,
                "rest_seconds": statistics.median(s.seconds for s in runs[1:]) if len(runs) > 1 else None,
                "phases": phases,
                "verified": all(s.verified for s in runs),
                "runs": len(runs),
            }
        )
    base = {r["mode"]: r["rows_per_s"] for r in rows}
    for r in rows:
        for mode in ("a", "b", "b'", "c"):
            key = "x_bp" if mode == "b'" else f"x_{mode}"
            r[key] = r["rows_per_s"] / base[mode] if mode in base else None
    return rows


def _goals(table: list[dict[str, Any]], txn: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The writer's goals (issue 11) from the modes run, and the coordinator's time budgets."""
    row = {r["mode"]: r for r in table}
    goals: list[dict[str, Any]] = []

    def ratio(goal: str, x: float, at_least: float) -> None:
        goals.append({"goal": goal, "measured": round(x, 3), "met": x >= at_least})

    if "n" in row and row["n"]["x_bp"] is not None:
        ratio("(n) >= 1.2 x (b') rows/s", row["n"]["x_bp"], 1.2)
    if "n" in row and "b'" in row and row["n"]["cpu_ns_per_row"] > 0:
        ratio("(n) CPU/record <= (b')'s", row["b'"]["cpu_ns_per_row"] / row["n"]["cpu_ns_per_row"], 1.0)
    if "n" in row and row["n"]["x_c"] is not None:
        ratio("(n) >= 2.0 x (c) rows/s", row["n"]["x_c"], 2.0)
    if "n" in row and "c" in row and row["n"]["worker_cpu_ns_per_row"] > 0:  # 0 below one clock tick (--rows)
        # CPU of the executor's Python workers (writer, librdkafka, Arrow in): the native path's share.
        ratio(
            "(n) workers' CPU/record <= 0.5 x (c)'s",
            row["c"]["worker_cpu_ns_per_row"] / row["n"]["worker_cpu_ns_per_row"],
            2.0,
        )
    if "d" in row and row["d"]["x_c"] is not None:
        ratio("(d) >= 1.0 x (c) rows/s", row["d"]["x_c"], 1.0)
    if "n+" in row and row["n+"]["x_bp"] is not None:  # the same goals with the guide's small-record setting
        ratio("(n+) >= 1.0 x (b') rows/s", row["n+"]["x_bp"], 1.0)
    if "n+" in row and row["n+"]["x_c"] is not None:
        ratio("(n+) >= 2.0 x (c) rows/s", row["n+"]["x_c"], 2.0)
    if "commit_200" in txn:
        s = txn["commit_200"]["seconds"]
        goals.append({"goal": "commit of 200 prepared transactions < 1 s", "measured": s, "met": s < 1.0})
    if "recovery_1000" in txn:
        s = txn["recovery_1000"]["seconds"]
        goals.append({"goal": "recovery of 1,000 lingering transactions < 10 s", "measured": s, "met": s < 10.0})
    if "log_100k_runs" in txn:
        s = txn["log_100k_runs"]["seconds"]
        goals.append(
            {"goal": "recovery's decision log read with 100,000 finished runs < 1 s", "measured": s, "met": s < 1.0}
        )
    return goals


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _render(table: list[dict[str, Any]], env: dict[str, Any]) -> str:
    vs_bp = "vs (b')"
    head = (
        f"{'run':<40} {'rows/s':>12} {'MB/s':>7} {'vs (c)':>7} {vs_bp:>7} {'CPU ns/rec':>10} "
        f"{'workers':>8} {'all CPU':>8} {'seconds':>8} {'first':>7} {'rest':>7}  verified"
    )
    lines = [f"Throughput, {env['rows']:,} records of {env['value_bytes']} B values ({env['payload']}), median", head]
    lines.append("-" * len(head))
    for r in table:
        lines.append(
            f"{r['label']:<40} {r['rows_per_s']:>12,.0f} {r['mb_per_s']:>7.1f} {_fmt_ratio(r['x_c']):>7} "
            f"{_fmt_ratio(r['x_bp']):>7} {r['cpu_ns_per_row']:>10,.0f} {r['worker_cpu_ns_per_row']:>8,.0f} "
            f"{r['machine_cpu_ns_per_row']:>8,.0f} {r['seconds']:>8.3f} {r['first_seconds']:>7.3f} "
            f"{r['rest_seconds'] if r['rest_seconds'] is not None else float('nan'):>7.3f}  "
            f"{'yes' if r['verified'] else 'NO  <<<<<<<<'}"
        )
    for r in table:
        if r["mode"] in ("c", "n", "n+", "n0"):
            p = r["phases"]
            lines.append(
                f"{r['mode']} split: prepare (Spark jobs) {p['prepare']:.3f} s (materializing "
                f"{p.get('prepare:materialize', 0):.3f} s, writing {p.get('prepare:write', 0):.3f} s), "
                f"commit_prepared {p['commit']:.3f} s "
                f"for {int(p['transactions'])} transactions (decision log read {p['commit:log_read']:.3f} s, "
                f"appends {p['commit:log_write']:.3f} s, EndTxn {p['commit:end_txn']:.3f} s)"
            )
    by_mode = {r["mode"]: r for r in table}
    if "h" in by_mode:
        p, n = by_mode["h"]["phases"], by_mode.get("n")
        over = f", {by_mode['h']['seconds'] - n['seconds']:+.3f} s per run beside (n)" if n else ""
        lines.append(
            f"h split: the application's export and handoff {p['prepare']:.3f} s, the Airflow side's acceptance "
            f"{p['handoff:accept']:.3f} s, commit_prepared {p['commit']:.3f} s{over}"
        )
    lines.append("MB = 10^6 bytes of key + value; rows/s and MB/s are end to end for the timed part.")
    lines.append(
        "CPU ns/rec: the whole process tree (this process, Spark's JVM, its Python workers, the broker if started "
        "here) while the mode ran; workers: Spark's Python workers alone (the writer, librdkafka's threads); all "
        "CPU: the whole machine's busy CPU, the competing load's taken off (on the emulated cluster every host's: "
        "executors and brokers too)."
    )
    lines.append(
        "seconds: the median of the timed runs; first: the first timed run (cold with --cold: the mode's first "
        "export in this process), rest: the median of the others."
    )
    return "\n".join(lines)


def _render_txn(txn: dict[str, dict[str, Any]]) -> str:
    lines = [render_window(txn["window"]["runs"])] if "window" in txn else []
    if "commit_200" in txn:
        t = txn["commit_200"]
        lines.append(
            f"commit_prepared, {t['transactions']} prepared transactions x {t['records_each']} records: "
            f"{t['seconds']:.3f} s ({t['committed_transactions']} committed, read_committed {t['read_committed']:,}, "
            f"verified {'yes' if t['verified'] else 'NO <<<<<<<<'})"
        )
        lines.append(_render_phases(t["phases"]))
    if "recovery_1000" in txn:
        t = txn["recovery_1000"]
        lines.append(
            f"recover, {t['lingering_before']} lingering transactions: {t['seconds']:.3f} s "
            f"({t['committed']} committed by decision, {t['aborted']} aborted, {t['still_open']} still open, "
            f"verified {'yes' if t['verified'] else 'NO <<<<<<<<'})"
        )
        lines.append(_render_phases(t["phases"]))
    if "log_100k_runs" in txn:
        t = txn["log_100k_runs"]
        for label in ("uncompacted", "compacted"):
            m = t[label]
            lines.append(
                f"decision log with {t['runs']:,} finished runs, {label}: recovery's read "
                f"{m['recovery_read']['seconds']:.3f} s (peak {m['recovery_read']['peak_python_mb']} MB), a task's "
                f"read of its own run {m['own_run_read']['seconds']:.3f} s "
                f"(peak {m['own_run_read']['peak_python_mb']} MB)"
            )
    return "\n".join(lines)


def _render_phases(phases: dict[str, dict[str, float]]) -> str:
    parts = [f"{name} {p['seconds']:.3f} s ({int(p['calls'])}x)" for name, p in phases.items()]
    return "  of which: " + ", ".join(parts)


def _render_goals(goals: list[dict[str, Any]]) -> str:
    lines = ["", "Goals:"]
    for g in goals:
        lines.append(f"  {'MET ' if g['met'] else 'MISS'}  {g['goal']:<48} measured {g['measured']}")
    return "\n".join(lines)


def _loud(message: str) -> str:
    bar = "!" * 100
    return f"\n{bar}\n!!! {message}\n{bar}\n"


def _environment(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    import confluent_kafka
    import kafka as kafka_python

    def version(module: str) -> str:
        try:
            return str(__import__(module).__version__)
        except ImportError:
            return "not installed"

    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "mode": args.mode,
        "rows": rows,
        "value_bytes": bench_data.VALUE_BYTES,
        "payload": args.payload,
        "repeat": args.repeat,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": commit,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": version("pyspark"),
        "pyarrow": version("pyarrow"),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka_python": kafka_python.__version__,
        "broker": "external" if args.bootstrap else f"kafka-local {kafka_local().KAFKA_VERSION}, 1 broker",
        "spark_master": args.master,
        "spark_conf": dict(kv.split("=", 1) for kv in args.spark_conf),
        "source": args.source,
        "contention": args.contention,
        "cold": args.cold,
        "spark_kafka_sink": f"spark-sql-kafka-0-10_2.13 {bench_spark.SPARK_VERSION}",
    }


def _banner(env: dict[str, Any]) -> str:
    return (
        f"kafka2pc benchmark ({env['mode']}): {env['rows']:,} records, {env['value_bytes']} B values "
        f"({env['payload']}), {env['cores']} cores, Python {env['python']}, pyspark {env['pyspark']}, "
        f"confluent-kafka {env['confluent_kafka']} (librdkafka {env['librdkafka']}), {env['broker']}, git {env['git']}"
        + f", master {env['spark_master']}, source: {env['source']}"
        + (f", contention: {env['contention']} busy processes" if env["contention"] else ", quiet (no competing load)")
        + (", cold (no warm-up)" if env["cold"] else "")
        + "".join(f", {k}={v}" for k, v in env["spark_conf"].items())
    )


def _write_json(
    path: Path,
    env: dict[str, Any],
    samples: list[Sample],
    table: list[dict[str, Any]],
    txn: dict[str, dict[str, Any]],
    goals: list[dict[str, Any]],
    failures: list[Any],
) -> None:
    def rounded(r: dict[str, Any]) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}

    doc = {
        "environment": env,
        "throughput": [{**rounded(r), "phases": {k: round(v, 4) for k, v in r["phases"].items()}} for r in table],
        "samples": [s.to_dict() for s in samples],
        **txn,
        "goals": goals,
        "verified": not failures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nresults written to {path}")


if __name__ == "__main__":
    sys.exit(main())
