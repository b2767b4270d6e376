"""A randomized fault soak of the decision protocol (Jepsen-style), on a real 3-broker Kafka.

Each run of one POOLING exporter goes recover → prepare → commit, every actor a process of its
own (``tests/helpers/phase_two.py``, the ``kafka2pc`` CLI), and at a random point a fault is
injected: a SIGKILL of an actor's process group, a broker stopped and started, an operator's
concurrent ``kafka2pc resolve``, a commit that outlives the transaction timeout (whole, or after
part of it committed), a clear of an old run's commit. Then the user's obvious next step runs
(retry, abort, the next run's recovery, acknowledging a reported loss). An independent checker
(``checker.py``) judges everything from Kafka alone.

    python -m tests.soak.harness --runs 300 --seed 1          # long mode
    python -m tests.soak.harness --runs 14 --seed 7 --short   # what CI runs: every kind once

A violation prints the seed; the same seed replays the same faults at the same points.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.kafka import REPO, kafka_local
from tests.soak.checker import Violation, judge

PREFIX = "soak"
CAP_MS = 10_000  # transaction.max.timeout.ms: short, so timeouts are part of the soak
# The commit's own worst case must fit well inside CAP_MS: 2 s decision write, 4 s of EndTxn retries.
COMMIT_TIMEOUTS = ["--decision-timeout", "2", "--end-txn-timeout", "4"]
KINDS = (
    "kill_recover",
    "kill_prepare_then_abort",
    "kill_prepare_then_retry",
    "kill_commit",
    "kill_commit_after_decision",
    "kill_abort",
    "broker_restart",
    "concurrent_resolve",
    "timeout",
    "timeout_after_decision",
    "clear_old_commit",
)
EXIT_CONFLICT, EXIT_LOST = 10, 11


@dataclass
class Run:
    run: str
    tag: str
    expected: int = 0
    status: str = "pending"  # success | failed | lost
    fault: str = "none"
    notes: list[str] = field(default_factory=list)
    acknowledged: bool = False


class Soak:
    def __init__(self, directory: Path, seed: int, brokers: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.dir = directory
        self.kl = kafka_local()
        state = self.kl.start_cluster(directory / "kafka", brokers=brokers, txn_max_timeout_ms=CAP_MS)
        self.bootstrap = state["bootstrap_servers"]
        self.brokers = brokers
        self.topic = f"soak_{seed}"
        self.decisions = f"soak_decisions_{seed}"
        create = ["--create", "--topic", self.topic, "--partitions", "6", "--replication-factor", str(min(3, brokers))]
        self.tool(create, alias="topics")
        self.runs: list[Run] = []
        self.committed: list[tuple[Run, Path]] = []
        self.faults: Counter[str] = Counter()
        self.judge_each_run = False
        self.first_violations: list[Violation] = []

    # -- plumbing -------------------------------------------------------------------------
    def tool(self, args: Sequence[str], alias: str = "transactions", check: bool = True) -> str:
        proc = self.kl.run_tool(self.dir / "kafka", alias, list(args), timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kafka tool {alias} {args}: {proc.stderr[-2000:]}")
        return str(proc.stdout)

    def cmd(self, action: str, *args: str) -> list[str]:
        base = [sys.executable, "-m", "tests.helpers.phase_two", action, "--bootstrap", self.bootstrap]
        return [*base, "--decision-topic", self.decisions, "--prefix", PREFIX, *args]

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow_provider_kafka2pc.cli", *args, "--prefix", PREFIX,
                "--bootstrap-servers", self.bootstrap, "--decision-topic", self.decisions]  # fmt: skip

    def spawn(self, argv: list[str]) -> tuple[subprocess.Popen[str], Path]:
        err = self.dir / f"actor-{len(os.listdir(self.dir))}.log"
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err.open("w"), text=True, cwd=REPO, start_new_session=True
        )
        return proc, err

    def call(self, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=timeout)

    @staticmethod
    def wait_for(proc: subprocess.Popen[str], err: Path, needle: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    @staticmethod
    def kill(proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)

    # -- the user's steps ----------------------------------------------------------------
    def recover(self, r: Run) -> None:
        """The recovery sensor: passes until done; a reported loss is acknowledged, then go on."""
        for _ in range(60):
            p = self.call(self.cmd("recover", "--run", f"{r.run}/recover"))
            if p.returncode == 0 and json.loads(p.stdout.strip().splitlines()[-1])["done"]:
                return
            if p.returncode == EXIT_LOST:
                for lost in [x for x in self.runs if x.status == "lost" and not x.acknowledged]:
                    a = self.call(self.cli("acknowledge", "--run", lost.run, "--note", "soak: acknowledged"))
                    if a.returncode != 0:
                        raise RuntimeError(f"acknowledge {lost.run}: exit {a.returncode}: {a.stdout} {a.stderr}")
                    lost.acknowledged = True
            time.sleep(0.5)
        raise RuntimeError(f"recovery never finished: {p.stderr[-2000:]}")

    def prepare(self, r: Run, count: int, records: int) -> Path:
        args = ["--count", str(count), "--records", str(records), "--topic", self.topic, "--tag", r.tag]
        p = self.call(self.cmd("prepare", *args))
        if p.returncode != 0:
            raise RuntimeError(f"prepare failed: {p.stderr[-2000:]}")
        path = self.dir / f"{r.tag}.jsonl"
        path.write_text(p.stdout)
        r.expected = count * records
        return path

    def commit(self, r: Run, file: Path, retries: int = 3) -> None:
        for _ in range(retries):
            p = self.call(self.cmd("commit", "--run", r.run, "--committables", str(file), *COMMIT_TIMEOUTS))
            if p.returncode in (0, EXIT_CONFLICT, EXIT_LOST):
                self.report(r, p.returncode, p.stderr)
                return
            r.notes.append(f"commit exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
        r.status = "failed"

    def report(self, r: Run, code: int, stderr: str) -> None:
        if code == 0:
            r.status = "success"
        elif code == EXIT_LOST and "partly visible" in stderr:
            r.status = "lost"
        else:  # a conflict, or a run aborted whole because part of it could no longer commit
            r.status = "failed"

    # -- one run --------------------------------------------------------------------------
    def one_run(self, i: int, fault: str) -> Run:
        r = Run(run=f"soak/run-{i}", tag=f"r{i}", fault=fault)
        self.runs.append(r)
        if fault != "none":
            self.faults[fault] += 1
        if fault == "kill_recover":
            proc, _ = self.spawn(self.cmd("recover", "--run", f"{r.run}/recover"))
            time.sleep(self.rng.uniform(0.3, 1.5))
            self.kill(proc)
        self.recover(r)
        if self.judge_each_run:  # after this recovery, every earlier run has reached its end
            self.first_violations = self.first_violations or self.check(open_checks=False, runs=self.runs[:-1])[0]
        count, records = self.rng.randint(1, 6), self.rng.randint(1, 40)
        if fault == "timeout_after_decision":
            count = max(count, 2)
        if fault.startswith("kill_prepare") or fault == "kill_abort":
            argv = self.cmd("prepare", "--count", str(count), "--records", str(records), "--topic", self.topic,
                            "--tag", r.tag)  # fmt: skip
            proc, _ = self.spawn(argv)
            time.sleep(self.rng.uniform(0.5, 2.0))
            self.kill(proc)
            printed = proc.stdout.read() if proc.stdout else ""
            partial = self.dir / f"{r.tag}-partial.jsonl"
            partial.write_text("".join(line for line in printed.splitlines(keepends=True) if line.endswith("\n")))
            r.expected = count * records
            if fault == "kill_prepare_then_retry":  # a Spark task retry: same ids, the old attempt fenced
                file = self.prepare(r, count, records)
                self.commit(r, file)
                return self.after_commit(r, file)
            if fault == "kill_abort":
                proc, _ = self.spawn(self.cmd("abort", "--run", r.run, "--committables", str(partial)))
                time.sleep(self.rng.uniform(0.2, 1.5))
                self.kill(proc)
            else:
                self.call(self.cmd("abort", "--run", r.run, "--committables", str(partial)))
            r.status = "failed"
            return r
        file = self.prepare(r, count, records)
        if fault == "kill_commit":
            proc, _ = self.spawn(self.cmd("commit", "--run", r.run, "--committables", str(file), *COMMIT_TIMEOUTS))
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.kill(proc)
            self.commit(r, file)  # the task's retry
        elif fault == "kill_commit_after_decision":
            # Decided, k EndTxns done, killed; no retry: the next run's recovery must roll it forward.
            k = self.rng.randint(0, count - 1)
            argv = self.cmd("commit", "--run", r.run, "--committables", str(file), "--stall-after-ends", str(k),
                            *COMMIT_TIMEOUTS)  # fmt: skip
            proc, err = self.spawn(argv)
            self.wait_for(proc, err, "stalled")
            self.kill(proc)
            r.status = "died-after-decision"
        elif fault == "broker_restart":
            node = self.rng.randint(1, self.brokers)
            proc, err = self.spawn(self.cmd("commit", "--run", r.run, "--committables", str(file), *COMMIT_TIMEOUTS))
            time.sleep(self.rng.uniform(0.0, 1.5))
            self.kl.stop_node(self.dir / "kafka", node)
            self.kl.start_node(self.dir / "kafka", node)
            code = proc.wait(300)
            if code in (0, EXIT_CONFLICT, EXIT_LOST):
                self.report(r, code, err.read_text())
            else:
                self.commit(r, file)  # the task's retry
        elif fault == "concurrent_resolve":
            proc, err = self.spawn(self.cmd("commit", "--run", r.run, "--committables", str(file), *COMMIT_TIMEOUTS))
            time.sleep(self.rng.uniform(0.0, 2.0))
            self.call(self.cli("resolve", "--run", "operator"))
            self.report(r, proc.wait(300), err.read_text())
        elif fault == "timeout":
            time.sleep(CAP_MS / 1000 + 2)
            self.commit(r, file)
        elif fault == "timeout_after_decision":
            k = self.rng.randint(1, count - 1)
            argv = self.cmd("commit", "--run", r.run, "--committables", str(file), "--stall-after-ends", str(k),
                            *COMMIT_TIMEOUTS)  # fmt: skip
            proc, err = self.spawn(argv)
            self.wait_for(proc, err, "stalled")
            self.kill(proc)
            time.sleep(CAP_MS / 1000 + 3)
            p = self.call(self.cmd("recover", "--run", f"{r.run}/after"))
            r.status = "lost" if p.returncode == EXIT_LOST else "success"
            r.notes.append(f"recovery after the timeout: exit {p.returncode}")
        else:
            self.commit(r, file)
        return self.after_commit(r, file)

    def after_commit(self, r: Run, file: Path) -> Run:
        if r.status == "success":
            self.committed.append((r, file))
        if r.fault == "clear_old_commit" and self.committed:
            old, old_file = self.rng.choice(self.committed)
            p = self.call(self.cmd("commit", "--run", old.run, "--committables", str(old_file), *COMMIT_TIMEOUTS))
            if p.returncode != 0 or "already committed" not in p.stdout:
                r.notes.append(f"clear of {old.run}: exit {p.returncode} {p.stdout.strip()} {p.stderr[-500:]}")
                r.status = "clear-failed"
        return r

    def settle(self) -> None:
        self.recover(Run("soak/final", "final"))

    def check(self, open_checks: bool = True, runs: list[Run] | None = None) -> tuple[list[Violation], dict[str, int]]:
        judged = [asdict(r) for r in (self.runs if runs is None else runs)]
        brokers = list(range(1, self.brokers + 1))
        return judge(self.bootstrap, self.topic, PREFIX, judged, self.tool, brokers, open_checks)

    def close(self) -> None:
        self.kl.stop_cluster(self.dir / "kafka")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--fault-rate", type=float, default=0.8)
    ap.add_argument("--short", action="store_true", help="every fault kind in turn (CI)")
    ap.add_argument("--dir", type=Path, default=None, help="keep logs here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("--stop-at-violation", action="store_true", help="judge visibility after every run")
    ap.add_argument("--keep-kafka", action="store_true", help="leave the brokers running (to inspect a failure)")
    args = ap.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="kafka2pc-soak-"))
    directory.mkdir(parents=True, exist_ok=True)
    soak = Soak(directory, args.seed, args.brokers)
    soak.judge_each_run = args.stop_at_violation
    started = time.monotonic()
    stop = {"asked": False}  # SIGTERM: finish the run under way, then settle and judge what ran

    def ask_to_stop(_signum: int, _frame: object) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, ask_to_stop)
    try:
        for i in range(args.runs):
            if stop["asked"]:
                print(f"stopping after {i} runs (SIGTERM)", flush=True)
                break
            if args.short:
                fault = KINDS[i % len(KINDS)]
            else:
                fault = soak.rng.choice(KINDS) if soak.rng.random() < args.fault_rate else "none"
            r = soak.one_run(i, fault)
            print(f"run {i:4d} {fault:26s} {r.status:8s} {r.expected:4d} records {'; '.join(r.notes)}", flush=True)
            if soak.first_violations:
                print(f"first violation found at run {i}: {soak.first_violations}", flush=True)
                break
        soak.settle()
        violations, outcomes = soak.check()
    finally:
        if not args.keep_kafka:
            soak.close()
    result: dict[str, Any] = {
        "seed": args.seed,
        "runs": len(soak.runs),
        "seconds": round(time.monotonic() - started),
        "faults": dict(soak.faults),
        "outcomes": outcomes,
        "violations": [asdict(v) for v in violations],
        "logs": str(directory),
    }
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if violations else 0


def render(result: dict[str, Any]) -> str:
    lines = [f"soak seed {result['seed']}: {result['runs']} runs in {result['seconds']} s", "faults injected:"]
    lines += [f"  {k:26s} {v}" for k, v in sorted(result["faults"].items())]
    lines += ["outcomes:"] + [f"  {k:34s} {v}" for k, v in sorted(result["outcomes"].items())]
    lines.append(
        f"violations: {len(result['violations'])}"
        + (f" (replay with --seed {result['seed']})" if result["violations"] else "")
    )
    lines += [f"  {v['run']}: {v['what']}" for v in result["violations"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
