"""A randomized fault soak of the decision protocol (Jepsen-style), on a real 3-broker Kafka.

Each run of one POOLING exporter goes recover → prepare → commit, every actor a process of its
own (``tests/helpers/phase_two.py``, the exporter's Spark job in ``spark_actor.py``, the
``kafka2pc`` CLI). Each run draws a ``Plan`` of faults at the points where they can strike (the
``KINDS``); then the user's obvious next step runs (retry, abort, the next run's recovery,
acknowledging a reported loss). Most raw prepares are a Kafka-sourced export's: they read the new
records the harness adds to a source topic before the run, and their consumer group's offsets
commit with the run (KIP-447). An independent checker (``checker.py``) judges everything from
Kafka alone, and after every run what ``kafka2pc list`` and ``describe`` tell the user against it,
and the group's offsets against the runs' output.

    python -m tests.soak.harness --runs 450 --enough 300:50 --airflow 8 --seed 1   # long: >= 50 of every kind
    python -m tests.soak.harness --runs 8 --seed 7 --short   # what CI runs: every kind and variant

A violation prints the seed; the same seed replays the same plans.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tests.helpers.actors import stopped
from tests.helpers.kafka import REPO, kafka_local
from tests.soak.airflow_soak import AIRFLOW_SHORT_PLANS, AirflowPlan, AirflowRuns
from tests.soak.checker import CLI_LOST, Answer, Violation, judge, offsets_judged, open_transactions, told, truth
from tests.soak.spark_actor import kill_all, python_workers

PREFIX = "soak"
# transaction.max.timeout.ms: room for Airflow's commits, whose worst case (decision write + EndTxn
# retries) is the defaults' 90 s. The timeout faults set short timeouts on their own prepares.
CAP_MS = 300_000
# The protocol runs' commits: 2 s decision write, 4 s of EndTxn retries, so that TIMEOUT_MS fits them.
COMMIT_TIMEOUTS = ["--decision-timeout", "2", "--end-txn-timeout", "4"]
# The fault kinds, as the issue names them; each run draws a plan that may combine several.
KINDS = (
    "kill_recover",  # SIGKILL of the recovery
    "kill_prepare",  # SIGKILL of the prepare, then its abort or a retry that fences it
    "kill_abort",  # SIGKILL of the abort that follows a killed prepare
    "kill_commit",  # SIGKILL of the commit: before its decision (then its retry), or after it (no retry)
    "broker_restart",  # a broker stopped and started during the prepare or the commit
    "spark_task_failure",  # a Spark Python worker SIGKILLed mid-task; Spark retries the task
    "concurrent_resolve",  # an operator's `kafka2pc resolve` during the prepare or the commit
    "clear",  # a clear of an earlier run's commit task, or of the whole earlier run
    "timeout",  # the broker's transaction timeout: before the commit, or after its decision
    # SIGKILL of the broker leading the decision topic's partition 0, then its restart, during:
    "leader_kill_commit",  # a commit (then its retry, if it failed, once the broker is back)
    "leader_kill_recover",  # a recovery (then the sensor's next pass)
    "leader_kill_prepare",  # a prepare (then the commit, or the abort if it failed)
    # SIGSTOP of the commit right after its decision; its retry commits the run; SIGCONT once the
    # next run has committed on the same ids (new epochs): the zombie must change nothing (DESIGN §15).
    "pause_commit",
    "pause_abort",  # the same for the abort task after a failed prepare: its retry aborts, it resumes a run later
    # SIGSTOP of the raw prepare inside its open transactions: the run fails, its abort fences the ids,
    # the next run takes them; SIGCONT then: the fenced prepare fails, nothing of it becomes visible.
    "pause_prepare",
    # A recovery that decides ABORT for the paused (or killed) prepare's transactions, paused after its
    # decision; the abort task finishes; it resumes a run later and must change nothing.
    "pause_recover",
    # A repair of a lost run paused after its COMMIT; its rerun finishes the repair; it resumes a run
    # later and must end well and change nothing.
    "pause_repair",
    # The operator's `kafka2pc resolve` (the CLI) SIGSTOPped at a random moment, resumed a run later.
    "pause_resolve",
)
EXIT_CONFLICT, EXIT_LOST, EXIT_ABORTED = 10, 11, 12
# A commit struck by a leader kill gets either the soak's short budgets (the decision log gives up
# after 2 x 2 s: DecisionLogUnavailableError, then the retry) or these, which outlast an election.
PATIENT_COMMIT = ["--decision-timeout", "10", "--end-txn-timeout", "20"]
LEADER_MARKER = {"commit": "appending the COMMIT decision"}  # the moment a "during" kill of a commit waits for
TIMEOUT_MS = {"timeout": 4_000, "timeout_after_decision": 10_000}  # the prepare's transaction.timeout.ms


class UnexpectedLoss(Exception):
    """Recovery reports a loss that no run was reported with: the soak stops and judges."""


@dataclass
class Plan:
    """The faults of one run, drawn together; each field is one point where a fault can strike."""

    kill_recover: bool = False
    spark: bool = False  # prepare with the real Spark job and SIGKILL one of its Python workers
    kill_prepare: str = ""  # "" | "abort" (then the abort task) | "retry" (the task's retry) | "pause" (SIGSTOP)
    kill_abort: bool = False  # only after kill_prepare == "abort"
    broker_in_prepare: bool = False
    resolve_in: str = ""  # "" | "prepare" | "commit"
    kill_commit_before: bool = False  # the first commit attempt, then its retry
    commit_end: str = ""  # "" | "kill_after_decision" | "timeout" | "timeout_after_decision"
    broker_in_commit: bool = False
    clear: str = ""  # "" | "commit" | "run"
    pause_commit: bool = False  # the plain commit's first try paused after its decision, resumed a run later
    pause_abort: bool = False  # the abort task's first try, likewise (only where the abort is not killed)
    pause_recover: bool = False  # a recovery after the failed prepare, paused after its ABORT decision
    pause_repair: bool = False  # the repair of this run's loss (if it is lost), paused after its decision
    pause_resolve: bool = False  # the operator's concurrent `kafka2pc resolve`, paused at a random moment
    leader_kill: str = ""  # phases ("recover,prepare,commit") when the decision topic's leader is killed
    leader_at: str = "start"  # "start": just before the actor starts | "during": while it runs
    # A Kafka-sourced export (the raw prepare only: the Spark actor exports a frame of its own): it
    # reads the source topic's new records, and its group's offsets commit with the run.
    source: bool = False

    @classmethod
    def draw(cls, rng: random.Random) -> Plan:
        plan = cls.draw_faults(rng)
        plan.source = not plan.spark and rng.random() < 0.85
        return plan

    @classmethod
    def draw_faults(cls, rng: random.Random) -> Plan:
        r = rng.random
        # Odds chosen so that 300 runs strike every kind 50 times or more (the rarest, the Spark worker
        # kill and the timeouts, which exclude each other, about 85); --enough stops once they have.
        kill_prepare = "abort" if (x := r()) < 0.35 else "retry" if x < 0.47 else "pause" if x < 0.6 else ""
        commit_end = rng.choices(["", "kill_after_decision", "timeout", "timeout_after_decision"], [3, 8, 5, 4])[0]
        return cls(
            kill_recover=r() < 0.4,
            # The timeout faults need the raw prepare: the Spark export's window check refuses a 4 or
            # 10 s transaction timeout before it opens anything (its own tests cover that).
            spark=not kill_prepare and commit_end not in TIMEOUT_MS and r() < 0.97,
            kill_prepare=kill_prepare,
            kill_abort=kill_prepare == "abort" and r() < 0.97,
            broker_in_prepare=r() < 0.25,
            resolve_in=rng.choice(["prepare", "commit"]) if r() < 0.5 else "",
            kill_commit_before=r() < 0.5,
            commit_end=commit_end,
            broker_in_commit=r() < 0.4,
            clear=rng.choice(["commit", "run"]) if r() < 0.35 else "",
            pause_commit=commit_end == "" and r() < 0.9,
            pause_abort=kill_prepare in ("abort", "pause") and r() < 0.5,
            pause_recover=kill_prepare == "pause" or (kill_prepare == "abort" and r() < 0.1),
            pause_repair=r() < 0.5,  # only a run that ends lost has a repair to pause
            pause_resolve=r() < 0.3,  # only where an operator resolves concurrently
            # A leader kill in about half the runs per phase (the commit's wherever a commit follows):
            # each of the three kinds strikes about 50 times in 100 runs.
            leader_kill=",".join(
                phase
                for phase, odds in (
                    ("recover", 0.55),
                    ("prepare", 0.5),
                    # Not before a timeout after the decision: the commit it fails takes the 10 s
                    # window with it, its retry is refused as too late, and no loss arises.
                    ("commit", 0.0 if kill_prepare == "abort" or commit_end == "timeout_after_decision" else 1.0),
                )
                if r() < odds
            ),
            leader_at=rng.choice(["start", "during"]),
        )


# The short mode (CI): every kind and every variant at least once, in a few runs.
# Every raw prepare is sourced here, so that each fault strikes a run whose offsets are judged.
SHORT_PLANS = (
    Plan(kill_recover=True, kill_prepare="abort", kill_abort=True, source=True),
    Plan(kill_prepare="retry", broker_in_prepare=True, leader_kill="commit", source=True),
    Plan(spark=True, kill_commit_before=True, leader_kill="prepare"),
    Plan(commit_end="kill_after_decision", clear="commit", leader_kill="recover", source=True),
    Plan(broker_in_commit=True, resolve_in="commit", source=True, pause_commit=True),
    Plan(kill_prepare="abort", pause_abort=True, source=True),
    Plan(kill_prepare="pause", pause_recover=True, source=True),
    Plan(commit_end="timeout", source=True),
    Plan(commit_end="timeout_after_decision", source=True),
    Plan(commit_end="timeout_after_decision", pause_repair=True),  # not sourced: its repair is the output's
    Plan(resolve_in="prepare", clear="run", source=True, pause_resolve=True),
)


@dataclass
class Run:
    run: str
    tag: str
    expected: int = 0
    count: int = 0
    records: int = 0
    status: str = "pending"  # success | failed | lost | died-after-decision
    faults: list[str] = field(default_factory=list)  # kind:variant, as injected
    notes: list[str] = field(default_factory=list)
    acknowledged: bool = False
    pause_repair: bool = False  # its repair's first try pauses after its decision (Plan.pause_repair)
    repaired: bool = False  # a LOST run the soak repaired (tests/helpers/repair_actor.py): all visible once
    loss_reported: bool = False  # a tool (commit, recovery, the operator's resolve) reported a loss
    # A COMMIT decision for the run is in force (a commit stalled after its EndTxns): if the broker
    # aborted all of its transactions, nothing is visible and the run is lost, not aborted.
    commit_decided: bool = False
    sourced: bool = False
    # The end of the range its prepare read (topic-partition -> offset), once a prepare took one.
    source_end: dict[str, int] = field(default_factory=dict)


class LeaderKill:
    """SIGKILL of the broker leading the decision topic's partition 0 around one actor, then its restart.

    ``at`` "start": killed just before the actor starts (it meets a dead leader at once; the
    issue's scenario); "during": on a thread, after ``delay_s`` or once the actor's stderr shows its
    marker, counted only if the actor still runs. The broker stays down until the actor ends or
    ``down_s`` has passed, then starts again and its replicas catch up; ``join`` waits for that, so
    the user's next step (a retry) meets the brokers back.
    """

    def __init__(self, soak: Soak, r: Run, phase: str, at: str, delay_s: float, down_s: float) -> None:
        self.soak, self.r, self.kind, self.at = soak, r, f"leader_kill_{phase}", at
        self.marker = LEADER_MARKER.get(phase)
        self.delay_s, self.down_s = delay_s, down_s
        self.node: int | None = None
        self.thread: threading.Thread | None = None

    def before(self) -> None:
        if self.at == "start":
            self._kill(lambda: True)

    def around(self, running: Callable[[], bool], err: Path | None = None) -> None:
        """The actor has started: strike now (``during``) on a thread, then restart the broker."""

        def strike() -> None:
            if self.at == "during":
                deadline = time.monotonic() + (60 if self.marker and err else self.delay_s)
                while time.monotonic() < deadline and running():
                    if self.marker and err is not None and self.marker in err.read_text():
                        break
                    time.sleep(0.02)
                self._kill(running)
            if self.node is not None:
                deadline = time.monotonic() + self.down_s
                while running() and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.soak.restart_node(self.node)

        self.thread = threading.Thread(target=strike, daemon=True)
        self.thread.start()

    def _kill(self, running: Callable[[], bool]) -> None:
        self.soak.broker_lock.acquire()  # released by restart_node: one broker down at a time
        leader = self.soak.decision_leader()
        if leader is None or not running():
            self.soak.broker_lock.release()
            self.r.notes.append(f"{self.kind}: {'no leader yet' if leader is None else 'the actor had ended'}")
            return
        self.soak.kill_node(leader)
        self.node = leader
        self.soak.inject(self.r, self.kind, self.at)

    def join(self) -> bool:
        """Wait until the broker is back; whether the kill struck."""
        if self.thread is not None:
            self.thread.join()
        return self.node is not None


class Soak:
    def __init__(self, directory: Path, seed: int, brokers: int) -> None:
        self.rng = random.Random(seed)
        self.prefix = PREFIX
        self.broker_rng = random.Random(seed + 1)
        self.seed = seed
        self.dir = directory
        self.kl = kafka_local()
        state = self.kl.start_cluster(directory / "kafka", brokers=brokers, txn_max_timeout_ms=CAP_MS)
        self.bootstrap = state["bootstrap_servers"]
        self.brokers = brokers
        self.topic = f"soak_{seed}"
        self.decisions = f"soak_decisions_{seed}"
        self.source, self.group = f"soak_source_{seed}", f"soak_group_{seed}"
        for topic, partitions in ((self.topic, 6), (self.source, 3)):
            create = ["--create", "--topic", topic, "--partitions", str(partitions)]
            self.tool([*create, "--replication-factor", str(min(3, brokers))], alias="topics")
        self.runs: list[Run] = []
        self.committed: list[tuple[Run, Path]] = []
        self.faults: Counter[str] = Counter()
        self._spark: subprocess.Popen[str] | None = None
        self.judge_each_run = False
        self.first_violations: list[Violation] = []
        # Broken promises seen as they happen: a successful run that left something open, a clear
        # that did not end as its run had.
        self.broken: list[Violation] = []
        self.told: list[Violation] = []  # what list/describe said against Kafka's truth ("truth" kind)
        self.offsets_broken: list[Violation] = []  # the group's offsets against the output ("offsets" kind)
        self.repairs = Counter[str]()  # how each repair of a lost run ended
        self.truth_checks = Counter[str]()  # checks, and those where list reported a loss (exit 4)
        self.truth_s = 0.0
        self.broker_lock = threading.Lock()  # one broker down at a time (2 of 3 down: no KRaft quorum)
        self.leader_outcomes: Counter[str] = Counter()  # how the actor struck by a leader kill ended
        self._admin: Any = None
        self._source_producer: Any = None
        # Paused actors (SIGSTOP), each with its run, the run after which it resumes, and whether it
        # must then end well (a commit, an abort, a recovery, a repair) or fail (a fenced prepare);
        # None: either (the CLI, stopped anywhere), judged by the truth checks alone.
        self.paused: list[tuple[Run, subprocess.Popen[str], Path, int, bool | None]] = []

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

    def spawn(self, argv: list[str], stdin: bool = False) -> tuple[subprocess.Popen[str], Path]:
        err = self.dir / f"actor-{len(os.listdir(self.dir))}.log"
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err.open("w"),
            text=True,
            cwd=REPO,
            start_new_session=True,
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
        """The recovery sensor: passes until done; a reported loss is repaired (exported again and
        committed, as ``kafka2pc repair`` does) or, where the repair refuses, acknowledged, then go on.

        The soak's truth check ran before (after the run that lost): read-only commands saw the loss
        before any recovery; once repaired or acknowledged, ``list`` must no longer report it (checked here)."""
        acknowledged: list[str] = []
        for _ in range(60):
            p = self.call(self.cmd("recover", "--run", f"{r.run}/recover"))
            if p.returncode == 0 and json.loads(p.stdout.strip().splitlines()[-1])["done"]:
                if acknowledged:
                    self.check_truth(f"after repairing or acknowledging {', '.join(acknowledged)}")
                return
            if p.returncode == EXIT_LOST:
                pending = [
                    x
                    for x in self.runs
                    if (x.status == "lost" or x.loss_reported) and not x.acknowledged and not x.repaired
                ]
                if not pending:  # no tool told the user of this loss when its run ended
                    raise UnexpectedLoss(p.stderr.strip()[-1500:])
                for lost in pending:
                    if self.repair(lost):
                        acknowledged.append(lost.run)
                        continue
                    a = self.call(self.cli("acknowledge", "--run", lost.run, "--note", "soak: acknowledged"))
                    if a.returncode != 0:
                        raise RuntimeError(f"acknowledge {lost.run}: exit {a.returncode}: {a.stdout} {a.stderr}")
                    lost.acknowledged = True
                    acknowledged.append(lost.run)
            time.sleep(0.5)
        raise RuntimeError(f"recovery never finished: {p.stderr[-2000:]}")

    def repair(self, r: Run) -> bool:
        """Repair a LOST run: its lost slots written again as its raw prepare wrote them, compared by
        their digests, committed. False when the repair refused (a Spark-prepared run, whose digests
        are Spark's; a lost offsets participant): then it is acknowledged instead."""
        argv = [sys.executable, "-m", "tests.helpers.repair_actor", "--bootstrap", self.bootstrap,
                "--decision-topic", self.decisions, "--prefix", PREFIX, "--run", r.run, "--topic", self.topic,
                "--records", str(r.records), "--tag", r.tag, "--lease-ttl-ms", "5000"]  # fmt: skip
        # Its rerun (the call below) finishes what the paused one decided, once the paused one's lease
        # lapsed (5 s: it renews nothing while stopped).
        if r.pause_repair:
            self.pause(r, argv, "pause_repair")
        p = self.call(argv)
        status = json.loads(p.stdout.strip().splitlines()[-1])["status"] if p.returncode == 0 else ""
        self.repairs["repaired" if status == "REPAIRED" else f"exit {p.returncode} {status}".strip()] += 1
        if status != "REPAIRED":
            r.notes.append(f"repair: exit {p.returncode} {status}: {p.stderr.strip().splitlines()[-1:]}")
            return False
        r.repaired, r.status = True, "repaired"
        r.notes.append("repaired")
        return True

    def commit_argv(self, r: Run, file: Path) -> list[str]:
        # COMMIT_TIMEOUTS last: a patient commit replaces them.
        return self.cmd("commit", "--run", r.run, "--committables", str(file), *self.range_of(r.tag), *COMMIT_TIMEOUTS)

    def commit(self, r: Run, file: Path, retries: int = 3) -> None:
        for _ in range(retries):
            p = self.call(self.commit_argv(r, file))
            if p.returncode in (0, EXIT_CONFLICT, EXIT_LOST, EXIT_ABORTED):
                self.report(r, p.returncode, p.stderr)
                if p.returncode:
                    r.notes.append(f"the retry: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
                return
            r.notes.append(f"commit exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
        r.status = "failed"

    def report(self, r: Run, code: int, stderr: str) -> None:
        r.loss_reported |= code == EXIT_LOST
        if code == 0:
            r.status = "success"
        elif code == EXIT_LOST and "partly visible" in stderr:
            r.status = "lost"
        else:  # a conflict, or a run aborted whole because part of it could no longer commit (RunAbortedError)
            r.status = "failed"

    # -- the Kafka source ---------------------------------------------------------------
    def fill_source(self) -> None:
        """New committed records in the source topic before a sourced run: what it is to read."""
        from confluent_kafka import Producer

        if self._source_producer is None:
            conf = {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "log_level": 0}
            self._source_producer = Producer(conf)
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        n = self.rng.randint(1, 30)
        for i in range(n):
            self._source_producer.produce(self.source, b"v", f"{len(self.runs)}/{i}".encode(), on_delivery=delivered)
        if self._source_producer.flush(60) or failed:
            raise RuntimeError(f"filling the source topic {self.source}: {failed[:3] or 'not delivered in 60 s'}")

    def source_args(self, r: Run, range_file: Path) -> list[str]:
        """A sourced prepare's flags; it writes its range to ``range_file``."""
        if not r.sourced:
            return []
        return ["--source-topic", self.source, "--source-group", self.group, "--range-out", str(range_file)]

    def took_range(self, r: Run, range_file: Path) -> None:
        """The range of the prepare whose committables go to the commit: its ends, for the checker."""
        if r.sourced and range_file.exists():
            parts = json.loads(range_file.read_text())["partitions"]
            r.source_end = {f"{topic}-{partition}": end for topic, partition, _start, end, _had in parts}

    def range_of(self, tag: str) -> list[str]:
        """The commit's ``--source-range``: the range the prepare of ``tag`` read, if it read one (the
        commit passes it on only with the offsets participant among its committables)."""
        path = self.dir / f"{tag}.range.json"
        return ["--source-range", str(path)] if path.exists() else []

    # -- faults -------------------------------------------------------------------------
    def inject(self, r: Run, kind: str, variant: str = "") -> None:
        self.faults[kind] += 1
        r.faults.append(f"{kind}:{variant}" if variant else kind)

    def restart_broker(self, r: Run, variant: str) -> None:
        node = self.broker_rng.randint(1, self.brokers)  # not self.rng: this runs on a fault's thread
        self.broker_lock.acquire()  # released by restart_node
        try:
            self.kl.stop_node(self.dir / "kafka", node)
            self.inject(r, "broker_restart", variant)
        finally:
            self.restart_node(node)

    def restart_node(self, node: int) -> None:
        """Start a stopped or killed broker, wait until its replicas are back in sync (so that the next
        fault leaves every partition its min.insync.replicas), and let the next broker fault go."""
        try:
            self.kl.start_node(self.dir / "kafka", node)
            self.wait_in_sync()
        finally:
            self.broker_lock.release()

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            # Quiet: its connections to a killed broker are expected, and the harness prints a table.
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        return self._admin

    def decision_leader(self, timeout_s: float = 30.0) -> int | None:
        """The broker leading the decision topic's partition 0 (a metadata call); None before the
        first recovery created the topic."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                md = self.admin().list_topics(self.decisions, timeout=10).topics[self.decisions]
                if md.error is not None:
                    return None
                leader = int(md.partitions[0].leader)
                if leader >= 0:
                    return leader
            time.sleep(0.2)
        return None

    def kill_node(self, node: int) -> None:
        """SIGKILL one broker's JVM (a crash: no controlled shutdown) and mark it stopped."""
        kl, root = self.kl, (self.dir / "kafka").resolve()
        with kl._locked(root / ".kafka-local.lock"):
            state = kl.load_state(root)
            entry = kl._node(state, node)
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 10
            while kl._alive(entry) and time.monotonic() < deadline:  # _alive reaps our own child
                time.sleep(0.01)
            entry["pid"] = entry["pid_start_ticks"] = None
            kl._write_json(root / kl.STATE_FILE, state)

    def wait_in_sync(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                lagging = self.lagging([self.topic, self.decisions, "__transaction_state"])
            except Exception as e:  # a metadata call during an election: ask again
                lagging = [f"metadata: {e}"]
            if not lagging:
                return
            if time.monotonic() > deadline:
                print(f"replicas not in sync after {timeout_s:g} s: {lagging}", flush=True)
                return
            time.sleep(0.2)

    def lagging(self, topics: Sequence[str]) -> list[str]:
        """Partitions without a leader or with a replica out of sync (a topic not created yet has none)."""
        out = []
        for name in topics:
            md = self.admin().list_topics(name, timeout=10).topics[name]
            if md.error is None:
                out += [
                    f"{name}[{p.id}] isr {p.isrs} of {p.replicas}"
                    for p in md.partitions.values()
                    if p.leader < 0 or sorted(p.isrs) != sorted(p.replicas)
                ]
        return out

    def leader_kill(self, r: Run, plan: Plan, phase: str) -> LeaderKill | None:
        """The plan's leader kill for this phase; its moments drawn here (a seed replays them)."""
        if phase not in plan.leader_kill.split(","):
            return None
        delay_s, down_s = self.rng.uniform(0.05, 0.5), self.rng.uniform(1.0, 12.0)  # a recovery takes ~0.5 s
        return LeaderKill(self, r, phase, plan.leader_at, delay_s, down_s)

    def leader_outcome(self, lk: LeaderKill | None, code: int | None, err: Path | str | None) -> None:
        """How the actor struck by a leader kill ended (rode it out, or the error it failed with),
        once the broker is back."""
        if lk is None or not lk.join():
            return
        what = (
            "rode it out"
            if code == 0
            else f"killed by another fault (signal {-code})"
            if code and code < 0
            else f"exit {code}"
        )
        if code is not None and code > 0 and err is not None:
            text = err.read_text() if isinstance(err, Path) else err
            # The exception a traceback ends with, or the one phase_two or the Spark actor printed.
            names = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)):", text[-5000:], re.MULTILINE)
            what = names[-1] if names else what
        self.leader_outcomes[f"{lk.kind} {lk.at}: {what}"] += 1
        lk.r.notes.append(f"{lk.kind} {lk.at}: {what}")

    def operator_resolves(self, r: Run, variant: str, pause: bool = False) -> None:
        if pause:  # stopped wherever it has got to, resumed after the next run: judged by the truth checks
            for delay in (self.rng.uniform(0.0, 0.8), 0.0):  # one that ended first is followed by one stopped at once
                proc, err = self.spawn(self.cli("resolve", "--run", "operator"))
                time.sleep(delay)
                if proc.poll() is None:
                    self.freeze(r, proc, err, "pause_resolve", variant, ends_well=None)
                    return
                r.notes.append(f"a resolve to pause ended first (exit {proc.returncode})")
            return
        p = self.call(self.cli("resolve", "--run", "operator"))
        self.inject(r, "concurrent_resolve", variant)
        if p.returncode == CLI_LOST:
            r.notes.append("the operator's resolve reported a loss")

    def at_random(
        self,
        within_s: float,
        fault: Callable[[Run, str], None],
        r: Run,
        variant: str,
        after: Callable[[], bool] = lambda: True,
    ) -> threading.Thread:
        """``fault`` on a thread, at a random moment within ``within_s`` of ``after()`` turning true."""
        delay = self.rng.uniform(0.0, within_s)  # drawn here, on the harness's thread: a seed replays it

        def strike() -> None:
            deadline = time.monotonic() + 60
            while not after() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(delay)
            fault(r, variant)

        t = threading.Thread(target=strike, daemon=True)
        t.start()
        return t

    def spark_actor(self) -> subprocess.Popen[str]:
        if self._spark is None or self._spark.poll() is not None:
            argv = [sys.executable, "-m", "tests.soak.spark_actor", self.bootstrap]
            self._spark, _ = self.spawn(argv, stdin=True)
            assert self._spark.stdout is not None
            if "ready" not in self._spark.stdout.readline():
                raise RuntimeError("the Spark actor did not start")
        return self._spark

    # -- one run --------------------------------------------------------------------------
    def one_run(self, i: int, plan: Plan) -> Run:
        r = Run(
            run=f"soak/run-{i}", tag=f"r{i}", sourced=plan.source and not plan.spark, pause_repair=plan.pause_repair
        )
        self.runs.append(r)
        if r.sourced:
            self.fill_source()
        if plan.kill_recover:
            proc, _ = self.spawn(self.cmd("recover", "--run", f"{r.run}/recover"))
            time.sleep(self.rng.uniform(0.3, 1.5))
            self.kill(proc)
            self.inject(r, "kill_recover")
        if (lk := self.leader_kill(r, plan, "recover")) is not None:  # one pass meets it, then the sensor's next
            lk.before()
            proc, err = self.spawn(self.cmd("recover", "--run", f"{r.run}/recover"))
            lk.around(lambda: proc.poll() is None)
            code = proc.wait(300)
            self.leader_outcome(lk, code, err)
        self.recover(r)
        if self.judge_each_run:  # after this recovery, every earlier run has reached its end
            self.first_violations = self.first_violations or self.check(open_checks=False, runs=self.runs[:-1])[0]
        r.count, r.records = self.rng.randint(1, 6), self.rng.randint(1, 40)
        if plan.commit_end == "timeout_after_decision":
            r.count = max(r.count, 2)
        r.expected = r.count * r.records
        file = self.prepare_phase(r, plan)
        if file is not None:
            self.commit_phase(r, plan, file)
            if r.status == "success":
                self.committed.append((r, file))
        if plan.clear:
            self.clear_earlier(r, plan.clear)
        self.resume_paused(after=len(self.runs) - 1)  # a paused commit of an earlier run: the ids moved on
        return r

    def prepare_phase(self, r: Run, plan: Plan) -> Path | None:
        """The export: its committables file, or None when it failed (then its abort ran)."""
        # A short transaction timeout where the broker is to expire the transaction before the commit.
        timeout_ms = TIMEOUT_MS.get(plan.commit_end)
        lines, ok = self.prepare_once(r, plan, timeout_ms, faults=True)
        # A prepare failed by a leader kill (a loaded machine stretches the election past its budgets)
        # is retried as Airflow's task retry would, so that the plan's commit faults still strike.
        failed_by_leader_kill = not ok and "prepare" in plan.leader_kill.split(",") and not plan.kill_prepare
        if failed_by_leader_kill:
            r.notes.append("the prepare failed under the leader kill; its task's retry")
        if plan.kill_prepare == "retry" or failed_by_leader_kill:  # the task's retry: same ids, the first fenced
            lines, ok = self.prepare_once(r, Plan(spark=plan.spark), timeout_ms, faults=False)
        file = self.dir / f"{r.tag}.jsonl"
        file.write_text("".join(f"{line}\n" for line in lines))
        if ok:
            self.took_range(r, self.dir / f"{r.tag}.range.json")
            return file
        r.status = "failed"  # the export failed: the abort task runs (and may be killed too)
        abort = self.cmd("abort", "--run", r.run, "--committables", str(file))
        if plan.kill_abort:  # it holds after its decision a while: the kill lands before or after it
            hold_s = self.rng.uniform(0.5, 2.0)
            proc, err = self.spawn([*abort, "--hold-ms", str(int(hold_s * 1000))])
            if self.rng.random() < 0.5:  # after its decision, while it holds
                self.wait_for(proc, err, "decided", 60)
                time.sleep(self.rng.uniform(0.0, hold_s * 0.8))
            else:  # early: before its decision, or wherever it has got to
                time.sleep(self.rng.uniform(0.2, 1.0))
            if proc.poll() is None:
                self.inject(r, "kill_abort", "after-decision" if "decided" in err.read_text() else "before-decision")
            self.kill(proc)
        else:
            if plan.pause_recover:  # the next run's recovery sensor, or a user's `kafka2pc recover`, came first
                self.pause(r, self.cmd("recover", "--run", f"{r.run}/recover"), "pause_recover")
            if plan.pause_abort:
                self.pause(r, abort, "pause_abort")
            self.call(abort)  # with a paused first try: its retry
        return None

    def prepare_once(self, r: Run, plan: Plan, timeout_ms: int | None, faults: bool) -> tuple[list[str], bool]:
        """One prepare attempt, with the plan's faults during it; its committables and whether it ended well."""
        proc: subprocess.Popen[str] | None = None
        err = self.dir / "unused.log"  # the raw prepare's stderr, once spawned
        workers: list[int] = []
        spark = self.spark_actor() if plan.spark else None
        lk = self.leader_kill(r, plan, "prepare") if faults else None
        answered = threading.Event()  # the Spark prepare's answer came
        if lk is not None:
            lk.before()
        if spark is not None:
            assert spark.stdin is not None and spark.stdout is not None
            request = {"count": r.count, "records": r.records, "tag": r.tag, "topic": self.topic, "prefix": PREFIX,
                       "slow_s": 1.0}  # fmt: skip
            spark.stdin.write(json.dumps(request) + "\n")
            spark.stdin.flush()
            if lk is not None:
                lk.around(lambda: not answered.is_set())
            delay = self.rng.uniform(0.2, 0.6)  # a worker killed before it reports to Spark is just forked again
            workers = self.python_workers(spark.pid)
            if workers:  # every task under way fails (a first row takes 1 s); Spark retries them
                time.sleep(delay)
                kill_all(workers)
        else:
            args = ["--count", str(r.count), "--records", str(r.records), "--topic", self.topic, "--tag", r.tag]
            args += self.source_args(r, self.dir / f"{r.tag}.range.json")
            if timeout_ms is not None:
                args += ["--timeout-ms", str(timeout_ms)]
            if faults and plan.kill_prepare:  # transactions held open half-way, so the kill lands in them
                args += ["--hold-ms", str(self.rng.randint(1000, 2500))]
            proc, err = self.spawn(self.cmd("prepare", *args))
            if lk is not None:
                lk.around(lambda: proc is not None and proc.poll() is None)
        # Faults at random moments, each on a thread of its own, so that they overlap as they would.
        during = []
        if faults and plan.broker_in_prepare:
            # A sourced prepare's broker restart strikes once its range is taken, in its transactions:
            # the snapshot, a read before anything is written, fails now and then under a restart
            # (docs/design.md, the fault soak), which would only make a failed export.
            taken = self.dir / f"{r.tag}.range.json"
            ready = (lambda: taken.exists() or proc is None or proc.poll() is not None) if r.sourced else (lambda: True)
            during.append(self.at_random(1.0, self.restart_broker, r, "prepare", ready))
        if faults and plan.resolve_in == "prepare":
            during.append(self.at_random(1.0, self.operator_resolves, r, "prepare"))
        if faults and plan.pause_resolve and plan.resolve_in:
            during.append(self.at_random(1.0, partial(self.operator_resolves, pause=True), r, "prepare"))
        if spark is not None:
            assert spark.stdout is not None
            answer = json.loads(spark.stdout.readline())
            answered.set()
            self.leader_outcome(lk, 0 if "error" not in answer else 1, str(answer.get("error", ""))[:300])
            if answer.get("retried"):  # the killed worker's task failed and Spark retried it
                self.inject(r, "spark_task_failure")
            elif workers:
                r.notes.append("the Spark worker was killed after its task had finished")
            if "error" in answer:
                r.notes.append(f"Spark prepare failed: {answer['error'][-300:]}")
            for t in during:
                t.join()
            return list(answer.get("committables", [])), "error" not in answer
        assert proc is not None
        if faults and plan.kill_prepare:
            # Inside its open transactions (always when its abort is to be struck or paused too: a prepare killed
            # before it opened anything leaves its abort nothing to do), else at any moment.
            if plan.kill_abort or plan.pause_abort or plan.pause_recover or self.rng.random() < 0.75:
                self.wait_for(proc, err, "holding", 60)
                time.sleep(self.rng.uniform(0.0, 1.0))
            else:  # at any moment, its start included
                time.sleep(self.rng.uniform(0.3, 2.5))
            if plan.kill_prepare == "pause" and proc.poll() is None:
                self.freeze(r, proc, err, "pause_prepare", "in-transactions", ends_well=False)
                return [], False  # the task failed by heartbeat: what it wrote is its abort's to end
            if proc.poll() is None:
                self.inject(r, "kill_prepare", plan.kill_prepare)
            self.kill(proc)
        out = proc.stdout.read() if proc.stdout else ""
        code = proc.wait(300)
        self.leader_outcome(lk, code, err)
        for t in during:
            t.join()
        if code != 0 and not plan.kill_prepare:
            r.notes.append(f"prepare exit {code}")
        # A killed prepare may leave half a line: only whole lines are committables it reported.
        lines = [line for line in out.splitlines(keepends=True) if line.endswith("\n")]
        return [line.strip() for line in lines if line.strip()], code == 0

    @staticmethod
    def python_workers(root: int, timeout_s: float = 60.0) -> list[int]:
        """Spark's Python workers under ``root`` as soon as there are some (none after the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            workers = python_workers(root)
            if workers:
                return workers
            # A scan reads every process's stat. The worker struck lives over a second (its task's
            # first row sleeps 1 s, spark_actor.py; 2 s in the Airflow runs' DAG), and the kill
            # waits 0.2-0.6 s after the scan (0.3-1.5 s in airflow_soak.py): a scan 0.1 s late is early enough.
            time.sleep(0.1)
        return []

    def commit_phase(self, r: Run, plan: Plan, file: Path) -> None:
        commit = self.commit_argv(r, file)
        lk = self.leader_kill(r, plan, "commit")  # strikes the first commit that is not itself killed early
        patient = lk is not None and self.rng.random() < 0.5
        if plan.kill_commit_before:
            # Killed before its decision, then its retry: the commit holds just before appending its
            # decision, so the kill lands there on any machine (a random sleep from its start often
            # found it finished: it takes ~0.1 s once its clients connect).
            proc, err = self.spawn([*commit, "--hold-before-decision-ms", "3000"])
            self.wait_for(proc, err, "deciding")
            time.sleep(self.rng.uniform(0.05, 0.6))
            if proc.poll() is None:
                self.inject(r, "kill_commit", "before-retry")
            self.kill(proc)
        if plan.commit_end in ("kill_after_decision", "timeout_after_decision"):
            # Decided, k EndTxns done, killed; no retry.
            low = 1 if plan.commit_end == "timeout_after_decision" else 0
            argv = [*commit, "--stall-after-ends", str(self.rng.randint(low, r.count - 1))]

            def stalling(lk: LeaderKill | None) -> tuple[subprocess.Popen[str], Path, bool]:
                if lk is not None:
                    lk.before()
                proc, err = self.spawn(argv)
                if lk is not None:
                    lk.around(lambda: proc.poll() is None and "stalled" not in err.read_text(), err)
                self.wait_for(proc, err, "stalled")
                stalled = "stalled" in err.read_text()
                self.leader_outcome(lk, 0 if stalled else proc.poll(), err)  # the broker is back
                return proc, err, stalled

            proc, err, stalled = stalling(lk)
            if not stalled and lk is not None and lk.node is not None:
                # The leader kill failed it (DecisionLogUnavailableError past its budget): the task's
                # retry, the same stalling commit, so that the faults after its decision still strike.
                self.kill(proc)
                last = (err.read_text().strip().splitlines() or [""])[-1]
                r.notes.append(f"the stalling commit failed, retried: {last[:160]}")
                proc, err, stalled = stalling(None)
            if stalled and plan.resolve_in == "commit":  # the operator resolves while the commit hangs
                self.operator_resolves(r, "commit")
            self.kill(proc)
            if not stalled:  # the decision itself was refused: too close to the deadline, or a conflict
                r.notes.append(f"the stalling commit ended early: {err.read_text().strip().splitlines()[-1:]}")
                self.commit(r, file)
                return
            r.commit_decided = True
            if plan.commit_end == "kill_after_decision":
                self.inject(r, "kill_commit", "after-decision")
                r.status = "died-after-decision"  # the next run's recovery must roll it forward
                return
            self.inject(r, "timeout", "after-decision")
            time.sleep(TIMEOUT_MS["timeout_after_decision"] / 1000 + 3)
            # The broker has aborted the rest under a COMMIT in force: read-only commands must say so
            # before any recovery ran.
            self.check_truth(f"{r.run}: expired after its decision, before any recovery")
            p = self.call(self.cmd("recover", "--run", f"{r.run}/after"))
            r.status = "lost" if p.returncode == EXIT_LOST else "success"
            r.loss_reported |= p.returncode == EXIT_LOST
            r.notes.append(f"recovery after the timeout: exit {p.returncode}")
            return
        if plan.commit_end == "timeout":
            time.sleep(5)  # the prepare's 4 s transaction timeout has passed; the broker aborts it
            self.inject(r, "timeout", "before-commit")
        if plan.pause_commit:
            self.pause(r, commit, "pause_commit")
        if lk is not None:
            lk.before()
        proc, err = self.spawn([*commit[: -len(COMMIT_TIMEOUTS)], *PATIENT_COMMIT] if patient else commit)
        if lk is not None:
            lk.around(lambda: proc.poll() is None, err)
        during = []
        if plan.broker_in_commit:
            during.append(self.at_random(1.5, self.restart_broker, r, "commit"))
        if plan.resolve_in == "commit":
            during.append(self.at_random(1.0, self.operator_resolves, r, "commit"))
        code = proc.wait(300)
        self.leader_outcome(lk, code, err)  # the broker is back before any retry
        for t in during:
            t.join()
        if code in (0, EXIT_CONFLICT, EXIT_LOST, EXIT_ABORTED):
            self.report(r, code, err.read_text())
        else:
            r.notes.append(f"commit exit {code}: {err.read_text().strip().splitlines()[-1:]}")
            self.commit(r, file)  # the task's retry
        # A leader kill alone must not cost the run: the commit rode it out, or its retry succeeded.
        alone = not (plan.commit_end or plan.broker_in_commit or plan.resolve_in)
        if lk is not None and lk.node is not None and alone and r.status != "success":
            self.broken.append(Violation(r.run, f"{lk.kind} {lk.at}: the commit ended {r.status}: {r.notes}"))

    def pause(self, r: Run, argv: list[str], kind: str) -> None:
        """The actor's first try (a commit, an abort) stops itself (SIGSTOP) once its decision is read
        back, before any EndTxn: a frozen VM, a long GC, a black-holed host. Airflow's retry (the call
        that follows) finishes the run; this one resumes once the next run has ended (``resume_paused``)."""
        proc, err = self.spawn([*argv, "--pause-after-decision"])
        self.wait_for(proc, err, "paused", 120)
        deadline = time.monotonic() + 30
        while proc.poll() is None and not stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.poll() is None and stopped(proc.pid):
            self.inject(r, kind, "after-decision")
            self.paused.append((r, proc, err, len(self.runs), True))
        else:  # it never reached its decision (a broker fault in its way): the retry is the commit
            r.notes.append(f"the {kind} actor ended first: {err.read_text().strip().splitlines()[-1:]}")
            self.kill(proc)

    def freeze(
        self, r: Run, proc: subprocess.Popen[str], err: Path, kind: str, variant: str, ends_well: bool | None
    ) -> None:
        """SIGSTOP of a running actor's process group, from outside; it resumes a run later."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while proc.poll() is None and not stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.inject(r, kind, variant)
        self.paused.append((r, proc, err, len(self.runs), ends_well))

    def resume_paused(self, after: int | None = None) -> None:
        """SIGCONT the paused actors whose next run has ended (all, with ``after`` None): each must end
        well and write nothing that changes what happened (the truth check follows)."""
        for item in list(self.paused):
            r, proc, err, index, ends_well = item
            if after is not None and index > after:
                continue
            self.paused.remove(item)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
            try:
                code = proc.wait(300)
            except subprocess.TimeoutExpired:
                self.kill(proc)
                code = -9
            said = err.read_text().strip().splitlines()
            r.notes.append(f"the paused actor resumed after {len(self.runs) - index} run(s): exit {code}")
            # A decision void before the pause (an operator's ABORT came first): resumed, it says the run
            # was aborted as a whole (DecisionConflictError), as the run's own record and retry did.
            well = code == 0 or (
                code == EXIT_CONFLICT and r.status == "failed" and bool(said) and "DecisionConflictError" in said[-1]
            )
            if ends_well is not None and well != ends_well:
                self.broken.append(Violation(r.run, f"its paused actor, resumed later, exit {code}: {said[-3:]}"))
            if after is None:  # at the end; otherwise the check after the run under way follows at once
                self.check_truth(f"after the paused actor of {r.run} resumed")

    def clear_earlier(self, r: Run, what: str) -> None:
        """A user clears an earlier, committed run: its commit task, or the whole run (export again)."""
        if not self.committed:
            return
        old, old_file = self.rng.choice(self.committed)

        def commit(committables: Path, range_args: list[str]) -> subprocess.CompletedProcess[str]:
            argv = self.cmd("commit", "--run", old.run, "--committables", str(committables), *range_args)
            argv += COMMIT_TIMEOUTS
            p = self.call(argv)
            if p.returncode == 1 and "DecisionLogUnavailableError" in p.stderr:
                # The soak's 2 s budget passed (a broker still catching up after a fault, a loaded
                # machine): the user's next step is what the error says, the task's retry.
                r.notes.append(f"the {what} clear's commit: decision log unavailable, retried")
                p = self.call(argv)
            return p

        if what == "commit":
            p = commit(old_file, self.range_of(old.tag))
            fine = p.returncode == 0 and "already committed" in p.stdout
        else:  # the cleared export runs again: recovery, the same data (and source) prepared anew, then its commit
            self.recover(r)
            args = ["--count", str(old.count), "--records", str(old.records), "--topic", self.topic, "--tag", old.tag]
            again = f"{old.tag}-again-{r.tag}"
            p = self.call(self.cmd("prepare", *args, *self.source_args(old, self.dir / f"{again}.range.json")))
            (self.dir / f"{again}.jsonl").write_text(p.stdout)
            p = commit(self.dir / f"{again}.jsonl", self.range_of(again))
            fine = p.returncode == EXIT_CONFLICT and "second export of the run" in p.stderr
        self.inject(r, "clear", what)
        if not fine:
            self.broken.append(
                Violation(old.run, f"its {what} clear: exit {p.returncode} {p.stdout.strip()} {p.stderr[-500:]}")
            )

    def judge_success(self, r: Run) -> None:
        """The user's obvious next step after a success is nothing: nothing of the prefix may be open."""
        if r.status == "success":
            left = open_transactions(self.bootstrap, self.prefix)
            if left:
                self.broken.append(Violation(r.run, f"reported success with transactions open: {left}"))

    def settle(self) -> None:
        self.recover(Run("soak/final", "final"))

    def ask(self, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.cli(command, "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=REPO)  # fmt: skip

    @staticmethod
    def answer(proc: subprocess.Popen[str]) -> Answer:
        out, err = proc.communicate(timeout=300)
        try:
            report = json.loads(out)
        except ValueError:
            report = None
        return proc.returncode, report, err

    def check_truth(self, when: str) -> None:
        """What users are told against Kafka's truth: ``kafka2pc list --json`` and ``describe --json``
        (exit status, losses, open transactions) against a read_committed consumer and the open
        transactions (``checker.told``). A disagreement with a truth that did not move while the
        commands ran is a "truth" violation; if the truth moved (a marker still being written), ask
        again."""
        judged = [asdict(r) for r in self.runs]
        found: list[Violation] = []
        started = time.monotonic()
        source = (self.group, self.source)
        for _ in range(3):
            before = truth(self.bootstrap, self.topic, PREFIX, source)
            listing, describing = self.ask("list"), self.ask("describe")
            listed, described = self.answer(listing), self.answer(describing)
            found = told(before, judged, listed, described, PREFIX)
            if not found or truth(self.bootstrap, self.topic, PREFIX, source) == before:
                break
        if before.offsets is not None:  # nothing open: the group's offsets are final for every run so far
            self.truth_checks["offsets judged"] += 1
            for v in offsets_judged(before.visible, judged, before.offsets):
                if v.run not in {x.run for x in self.offsets_broken}:  # once per run, not at every later check
                    print(f"OFFSETS VIOLATION ({when}): {v.run}: {v.what}", flush=True)
                    self.offsets_broken.append(Violation(v.run, f"{when}: {v.what}", v.kind))
        self.truth_checks["checks"] += 1
        self.truth_checks["list exit 4 (a loss reported)"] += listed[0] == CLI_LOST
        self.truth_s += time.monotonic() - started
        for v in found:
            print(f"TRUTH VIOLATION ({when}): {v.run}: {v.what}", flush=True)
            self.told.append(Violation(v.run, f"{when}: {v.what}", "truth"))
        if found:  # the evidence: both answers, the truth, and Kafka's own list of every state
            evidence = {"when": when, "truth": asdict(before), "list": listed, "describe": described,
                        "kafka_list": self.tool(["list"], check=False)}  # fmt: skip
            (self.dir / f"truth-violation-{len(self.told)}.json").write_text(json.dumps(evidence, indent=1))

    def check(self, open_checks: bool = True, runs: list[Run] | None = None) -> tuple[list[Violation], dict[str, int]]:
        judged = [asdict(r) for r in (self.runs if runs is None else runs)]
        brokers = list(range(1, self.brokers + 1))
        return judge(self.bootstrap, self.topic, PREFIX, judged, self.tool, brokers, open_checks)

    def stop_spark(self) -> None:
        """The Spark actor's session (a JVM and its Python) ended; a later Spark prepare starts another."""
        if self._spark is not None:
            self.kill(self._spark)
            self._spark = None

    def close(self) -> None:
        self.stop_spark()
        self.kl.stop_cluster(self.dir / "kafka")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--enough", default="", metavar="N:K",
                    help="stop the protocol runs early once N have run and every kind has struck K times")  # fmt: skip
    ap.add_argument("--short", action="store_true", help="the fixed plans that strike every kind once (CI)")
    ap.add_argument("--airflow", type=int, default=0, help="then this many runs of a DAG on a standalone Airflow")
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
    unexpected: list[Violation] = []
    try:
        try:
            protocol_runs(soak, args.runs, args.short, stop, enough(args.enough))
            soak.stop_spark()  # the Airflow runs' Spark is their tasks' own
            if args.airflow and not stop["asked"] and not soak.first_violations:
                soak.settle()  # a loss the protocol runs reported is acknowledged before Airflow's runs
                run_airflow(soak, args.airflow, args.short, directory / "airflow", stop)
            soak.resume_paused()
            soak.settle()
            soak.check_truth("at the end, settled")
        except UnexpectedLoss as e:
            unexpected.append(Violation("-", f"recovery reports a loss that no tool reported when its run ended: {e}"))
        # Open transactions are judged only after a settled end (an unexpected loss stops recovery).
        violations, outcomes = soak.check(open_checks=not unexpected)
        violations = unexpected + soak.broken + violations + soak.told + soak.offsets_broken
    finally:
        if not args.keep_kafka:
            soak.close()
    result: dict[str, Any] = {
        "seed": args.seed,
        "runs": len(soak.runs),
        "seconds": round(time.monotonic() - started),
        "faults": dict(soak.faults),
        "variants": dict(Counter(f for r in soak.runs for f in r.faults if ":" in f)),
        "outcomes": outcomes,
        "leader_kills": dict(soak.leader_outcomes),
        "truth_checks": dict(soak.truth_checks),
        "repairs": dict(soak.repairs),
        "truth_seconds": round(soak.truth_s),
        # Kafka-sourced runs whose prepare took a range, by how they ended.
        "sourced": dict(Counter(r.status for r in soak.runs if r.source_end)),
        "violations": [asdict(v) for v in violations],
        "logs": str(directory),
    }
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if violations else 0


def enough(spec: str) -> tuple[int, int] | None:
    if not spec:
        return None
    runs, per_kind = spec.split(":")
    return int(runs), int(per_kind)


def protocol_runs(soak: Soak, runs: int, short: bool, stop: dict[str, bool], until: tuple[int, int] | None) -> None:
    for i in range(runs):
        if stop["asked"]:
            print(f"stopping after {i} runs (SIGTERM)", flush=True)
            return
        if until and i >= until[0] and all(soak.faults[k] >= until[1] for k in KINDS):
            print(f"stopping after {i} runs: every kind struck {until[1]} times or more", flush=True)
            return
        plan = SHORT_PLANS[i % len(SHORT_PLANS)] if short else Plan.draw(soak.rng)
        started = time.monotonic()
        r = soak.one_run(i, plan)
        if short and not any(SHORT_PLANS[j % len(SHORT_PLANS)].spark for j in range(i + 1, runs)):
            soak.stop_spark()  # no later run prepares with Spark: its idle session would only cost CPU
        soak.judge_success(r)
        soak.check_truth(f"after run {i}")  # before the next run's recovery acknowledges any loss
        print(progress(f"run {i:4d} {time.monotonic() - started:4.0f}s", r), flush=True)
        if soak.judge_each_run and (soak.told or soak.offsets_broken):
            soak.first_violations = soak.first_violations or soak.told + soak.offsets_broken
        if soak.first_violations:
            print(f"first violation found at run {i}: {soak.first_violations}", flush=True)
            return


def run_airflow(soak: Soak, runs: int, short: bool, home: Path, stop: dict[str, bool]) -> None:
    airflow = AirflowRuns(soak, home, quick=short)
    try:
        for j in range(runs):
            if stop["asked"]:
                break
            plan = AIRFLOW_SHORT_PLANS[j % len(AIRFLOW_SHORT_PLANS)] if short else AirflowPlan.draw(airflow.rng)
            r = airflow.one_run(j, plan)
            soak.judge_success(r)
            soak.check_truth(f"after Airflow run {j}")
            print(progress(f"airflow {j:3d}", r), flush=True)
    finally:
        airflow.close()


def progress(label: str, r: Run) -> str:
    return f"{label} {r.status:19s} {r.expected:5d} records  {','.join(r.faults) or 'none'}  {'; '.join(r.notes)}"


def render(result: dict[str, Any]) -> str:
    lines = [f"soak seed {result['seed']}: {result['runs']} runs in {result['seconds']} s", "faults injected:"]
    lines += [f"  {k:26s} {v}" for k, v in sorted(result["faults"].items())]
    lines += [f"    {k:32s} {v}" for k, v in sorted(result.get("variants", {}).items())]
    lines += ["outcomes:"] + [f"  {k:34s} {v}" for k, v in sorted(result["outcomes"].items())]
    sourced = result.get("sourced", {})
    lines.append(
        f"Kafka-sourced runs: {sum(sourced.values())} ({', '.join(f'{k} {v}' for k, v in sorted(sourced.items()))})"
    )
    repairs = result.get("repairs", {})
    lines.append(f"lost runs repaired: {', '.join(f'{k} {v}' for k, v in sorted(repairs.items())) or 'none'}")
    if result.get("leader_kills"):
        lines += ["the actor a leader kill struck:"]
        lines += [f"  {k:50s} {v}" for k, v in sorted(result["leader_kills"].items())]
    kinds = Counter(v.get("kind") for v in result["violations"])
    checks = result.get("truth_checks", {})
    lines.append(
        f"what users are told (list, describe) checked {checks.get('checks', 0)} times in "
        f"{result.get('truth_seconds', 0)} s; list reported a loss in {checks.get('list exit 4 (a loss reported)', 0)}"
        f"; the source group's offsets judged {checks.get('offsets judged', 0)} times"
    )
    lines.append(
        f"violations: {len(result['violations'])} (truth: {kinds['truth']}, offsets: {kinds['offsets']})"
        + (f" (replay with --seed {result['seed']})" if result["violations"] else "")
    )
    lines += [f"  [{v.get('kind', 'exactly-once')}] {v['run']}: {v['what']}" for v in result["violations"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
