"""Repair of runs that lost transactions after their COMMIT (DESIGN §6), on a real broker with a
10 s ``transaction.max.timeout.ms``: each run's commit ended half of its transactions and was
SIGKILLed, the broker aborted the rest at its cap, recovery recorded the run LOST. The repair
actor (``tests/helpers/repair_actor.py``, a process of its own, killed with SIGKILL where a test
says) exports the lost slots again and commits them. Judged by a read_committed consumer (every
key of the run once), the transactions left open (ListTransactions and Kafka's TransactionsCommand)
and ``kafka2pc list``'s exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import attempts_of
from tests.conftest import SHORT_TXN_MAX_TIMEOUT_MS
from tests.helpers.actors import sigkill, spawn, wait_for_line
from tests.helpers.kafka import REPO, KafkaEnv, kafka_local
from tests.helpers.lost_runs import record_lost

pytestmark = pytest.mark.kafka

RUN = "orders/manual__2026-11-28T10:00:00+00:00"
TXNS, LOST, RECORDS = 8, 4, 500  # per run: 4 of 8 transactions of 500 records lost
RACES = 20
KILL_POINTS = {"in-export": "holding", "after-decision": "decided", "in-commit": "stalled"}


@dataclass(frozen=True)
class Lost:
    env: KafkaEnv
    topics: dict[str, str]  # prefix -> its topic: one per test, for an open transaction holds back a
    # read_committed reader's last stable offset for every record after it (the races share one)
    decisions: str
    prefixes: dict[str, str]  # the test's name for a run -> its exporter's prefix

    def keys(self, prefix: str) -> Counter[bytes]:
        """Every key of the prefix a read_committed consumer sees, with how often, once the prefix's
        transactions are past PrepareCommit (EndTxn answers there; the markers that make each
        partition visible follow)."""
        self.env.open_transactions(prefix)
        mine = f"{prefix}/".encode()
        read = self.env.read_committed(self.topics[prefix])
        return Counter(r.key for r in read if r.key and r.key.startswith(mine))

    def expected(self, prefix: str, txns: int = TXNS, records: int = RECORDS) -> set[bytes]:
        return {f"{prefix}/{s}/{i}".encode() for s in range(txns) for i in range(records)}

    def repair(self, tmp: Path, prefix: str, *extra: str, records: int = RECORDS) -> tuple[subprocess.Popen[str], Path]:
        argv = [sys.executable, "-m", "tests.helpers.repair_actor", "--bootstrap", self.env.bootstrap,
                "--decision-topic", self.decisions, "--prefix", prefix, "--run", RUN, "--topic", self.topics[prefix],
                "--records", str(records), *extra]  # fmt: skip
        return spawn(argv, tmp, f"repair-{prefix}")

    def cli(self, command: str, prefix: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "airflow_provider_kafka2pc.cli", command, "--prefix", prefix, "--json",
             "--bootstrap-servers", self.env.bootstrap, "--decision-topic", self.decisions],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip

    def status(self, prefix: str) -> RunStatus:
        log = DecisionLog(self.env.config, topic=self.decisions)
        try:
            return log.read_for(prefix, RUN).runs[(prefix, RUN)].status
        finally:
            log.close()

    def left_open(self, prefix: str) -> list[str]:
        """Open per ListTransactions, and per Kafka's own TransactionsCommand."""
        listed = kafka_local().run_tool(self.env.directory, "transactions", ["list"]).stdout
        tool = [line.split()[0] for line in listed.splitlines()[1:] if line.startswith(f"{prefix}-")
                and any(s in line for s in ("Ongoing", "PrepareCommit", "PrepareAbort"))]  # fmt: skip
        return sorted(set(self.env.open_transactions(prefix)) | set(tool))


def _finish(proc: subprocess.Popen[str], err: Path, timeout_s: float = 180) -> tuple[int, dict[str, object], str]:
    out, _ = proc.communicate(timeout=timeout_s)
    text = err.read_text()
    return proc.returncode, (json.loads(out) if proc.returncode == 0 else {}), text


def _lose(env: KafkaEnv, tmp: Path, decisions: str, topics: dict[str, str], txns: int, lost: int,
          records: int) -> subprocess.Popen[str]:  # fmt: skip
    argv = [sys.executable, "-m", "tests.helpers.lost_runs", "--bootstrap", env.bootstrap, "--decision-topic",
            decisions, "--run", RUN, "--txns", str(txns), "--lost", str(lost), "--records", str(records),
            *(f"{p}:{t}" for p, t in topics.items())]  # fmt: skip
    proc, err = spawn(argv, tmp, "lose")
    wait_for_line(proc, err, "stalled\n", timeout_s=240)
    return proc


@pytest.fixture(scope="module")
def lost(kafka_short_timeout: KafkaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lost]:
    """Every run the module repairs, made LOST at once (one wait for the broker's cap)."""
    env, tmp = kafka_short_timeout, tmp_path_factory.mktemp("repair")
    tag = uuid.uuid4().hex[:6]
    names = ["main", "changed", "leased", *KILL_POINTS]
    prefixes = {n: f"rep{tag}_{n.replace('-', '_')}" for n in names} | {
        f"race{i}": f"rep{tag}_race{i}" for i in range(RACES)
    }
    decisions, race_topic = f"decisions_repair_{tag}", env.topic(4)
    big = {prefixes[n]: env.topic(4) for n in names}
    small = {p: race_topic for n, p in prefixes.items() if n.startswith("race")}
    # One after the other: on 2 cores, two of them at once left a run's first writes to time out.
    procs = [_lose(env, tmp, decisions, big, TXNS, LOST, RECORDS), _lose(env, tmp, decisions, small, 4, 2, 20)]
    for proc in procs:
        sigkill(proc)
    record_lost(env.config, decisions, prefixes.values(), RUN, SHORT_TXN_MAX_TIMEOUT_MS)  # the broker aborts the rest
    yield Lost(env, big | small, decisions, prefixes)


def test_a_lost_run_is_repaired_exactly_once_and_a_second_repair_does_nothing(lost: Lost, tmp_path: Path) -> None:
    prefix = lost.prefixes["main"]
    assert sum(lost.keys(prefix).values()) == (TXNS - LOST) * RECORDS  # half of it visible
    assert lost.cli("list", prefix).returncode == 4
    code, report, text = _finish(*lost.repair(tmp_path, prefix))
    assert code == 0, text[-3000:]
    assert report["status"] == "REPAIRED" and report["now"] is True, report
    seen = lost.keys(prefix)
    assert set(seen) == lost.expected(prefix) and set(seen.values()) == {1}, f"{len(seen)} keys, {seen.most_common(1)}"
    assert lost.left_open(prefix) == []
    listed = lost.cli("list", prefix)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    described = lost.cli("describe", prefix)
    assert described.returncode == 0, described.stdout + described.stderr
    [run] = [r for r in json.loads(described.stdout)["runs"] if r["run"] == RUN]
    assert run["status"] == "REPAIRED" and run["atomic"] is False, run
    assert run["repair"]["restored"] == LOST * RECORDS and run["repair"]["txns"] == LOST, run
    assert len(run["lost"]) == LOST  # what was lost stays on the record
    print(f"repaired: {report['note']}")
    # A second repair finds the run REPAIRED and writes nothing.
    code, again, text = _finish(*lost.repair(tmp_path, prefix))
    assert code == 0 and again["now"] is False and str(again["note"]).startswith("nothing to do"), (again, text)
    assert lost.keys(prefix) == seen and lost.left_open(prefix) == []


def test_a_changed_source_is_refused_before_anything_is_visible(lost: Lost, tmp_path: Path) -> None:
    prefix = lost.prefixes["changed"]
    before = lost.keys(prefix)
    code, _, text = _finish(*lost.repair(tmp_path, prefix, "--change-slot", str(TXNS - 1)))
    assert code == 14, text[-3000:]
    assert f"RepairRefusedError: repair of run {RUN} of exporter {prefix} refused" in text
    assert f"{prefix}-{TXNS - 1} (Spark partition {TXNS - 1}, on " in text
    assert "the same number of records, but different keys or values" in text
    assert "Nothing of the repair is visible: its 4 transaction(s) were aborted, and the run stays LOST" in text
    assert lost.keys(prefix) == before and lost.left_open(prefix) == []
    assert lost.cli("list", prefix).returncode == 4
    # The right records to another topic: the digest matches, the topic check refuses.
    other = lost.env.topic(4)
    code, _, text = _finish(*lost.repair(tmp_path, prefix, "--topic", other))
    assert code == 14, text[-3000:]
    assert "its re-export wrote to other topics than the run" in text
    assert (
        f"{prefix}-{TXNS - 1} (Spark partition {TXNS - 1}) wrote to {lost.topics[prefix]}; its re-export to {other}"
        in text
    )
    assert lost.keys(prefix) == before and lost.left_open(prefix) == []
    assert list(lost.env.read_committed(other)) == []
    # The source restored: the repair goes through.
    code, report, text = _finish(*lost.repair(tmp_path, prefix))
    assert code == 0 and report["status"] == "REPAIRED", text[-3000:]
    seen = lost.keys(prefix)
    assert set(seen) == lost.expected(prefix) and set(seen.values()) == {1}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_repair_killed_at_each_point_ends_exactly_once_after_a_rerun(lost: Lost, tmp_path: Path, point: str) -> None:
    prefix = lost.prefixes[point]
    flag = {"in-export": "--hold-in-export-ms", "after-decision": "--hold-after-decision-ms"}.get(point)
    extra = [flag, "60000"] if flag else ["--stall-after-ends", "2"]
    # A killed repair's lease lapses after its time to live: 3 s here, so that the rerun waits briefly.
    proc, err = lost.repair(tmp_path, prefix, *extra, "--lease-ttl-ms", "3000")
    wait_for_line(proc, err, KILL_POINTS[point])
    sigkill(proc)
    # The broker's view at the kill: the repair's transactions still open (in-commit: 2 of 4 ended).
    left = lost.env.open_transactions(prefix)
    # In the export, the killed slot's is open, and those of the slots that had begun.
    expected = {"in-export": range(1, LOST + 1), "after-decision": [LOST], "in-commit": [LOST - 2]}[point]
    assert len(left) in expected, left
    assert all(tid.startswith(f"{prefix}-{attempts_of(RUN)}") for tid in left), left
    visible_at_kill = sum(lost.keys(prefix).values())  # read_committed stops at the first open one
    if point != "in-export":  # its decision in force: acknowledging would call records lost that become visible
        acked = subprocess.run(
            [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "acknowledge", "--prefix", prefix, "--run", RUN,
             "--bootstrap-servers", lost.env.bootstrap, "--decision-topic", lost.decisions],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert acked.returncode == 2 and f"`kafka2pc resolve --prefix {prefix}`" in acked.stderr, acked.stderr
        assert lost.status(prefix) is RunStatus.LOST  # nothing written
    code, report, text = _finish(*lost.repair(tmp_path, prefix, "--lease-ttl-ms", "3000"))
    assert code == 0 and report["status"] == "REPAIRED", text[-3000:]
    # Died before its decision: the rerun exports again. After it: the rerun rolls it forward, exports nothing,
    # and says what it made visible itself (the killed try ended 2 of the 4 in the commit).
    assert report["now"] is True, report
    if point != "in-export":
        ended_here = LOST if point == "after-decision" else LOST - 2
        assert f"committed {ended_here} transaction(s) with {ended_here * RECORDS} records" in str(report["note"])
    seen = lost.keys(prefix)
    assert set(seen) == lost.expected(prefix) and set(seen.values()) == {1}, f"{len(seen)} keys after {point}"
    assert lost.left_open(prefix) == []
    assert lost.cli("list", prefix).returncode == 0
    print(f"killed {point} ({visible_at_kill} records visible at the kill); the rerun: {report['note'][:90]}")


def test_two_repairs_racing_give_one_result_20_times(lost: Lost, tmp_path: Path) -> None:
    """Two repairs of one run started together: the one whose lease came first holds the run and
    exports ("planned", held there by a barrier file), the other waits for it (its log says so),
    then reports the first's result; neither aborts the other's transactions."""
    outcomes: Counter[str] = Counter()
    for i in range(RACES):
        prefix = lost.prefixes[f"race{i}"]
        go = tmp_path / f"go{i}"
        procs = [lost.repair(tmp_path, prefix, "--export-after", str(go), records=20) for _ in range(2)]
        said: dict[int, str] = {}
        deadline = time.monotonic() + 120
        while len(said) < 2:  # one holds the run and exports, the other waits for it: each says so
            for n, (proc, err) in enumerate(procs):
                text = err.read_text()
                assert proc.poll() is None, text[-3000:]
                if "planned" in text:
                    said[n] = "planned"
                elif "waiting for the repair that holds it" in text:
                    said[n] = "waiting"
            assert time.monotonic() < deadline, said
            time.sleep(0.05)
        assert sorted(said.values()) == ["planned", "waiting"], said
        go.touch()
        results = [_finish(*p) for p in procs]
        assert [code for code, _, _ in results] == [0, 0], [text[-2000:] for _, _, text in results]
        winner, other = (results[n][1] for n in sorted(said, key=lambda n: said[n] != "planned"))
        assert winner["now"] is True and other["now"] is False, results
        assert str(other["note"]).startswith("nothing to do: run") and str(winner["decision"]) in str(other["note"])
        assert other["decision"] == winner["decision"], results
        seen = lost.keys(prefix)
        assert set(seen) == lost.expected(prefix, txns=4, records=20) and set(seen.values()) == {1}, i
        assert lost.env.open_transactions(prefix) == [] and lost.status(prefix) is RunStatus.REPAIRED
        outcomes["the second reported the first's result"] += 1
    # Kafka's own tool, once for all of them (a JVM per round would cost more than the races).
    listed = kafka_local().run_tool(lost.env.directory, "transactions", ["list"]).stdout
    races = tuple(f"{p}-" for n, p in lost.prefixes.items() if n.startswith("race"))
    assert not [t for t in listed.splitlines() if t.startswith(races) and ("Ongoing" in t or "Prepare" in t)], listed
    print(f"{RACES} races, both deciding each time, one result each: {dict(outcomes)}")


def test_recovery_during_a_repair_leaves_its_transactions_to_it(lost: Lost, tmp_path: Path) -> None:
    """A recovery pass over the whole exporter (a POOLING exporter's next DAG run, ``kafka2pc
    resolve``) while a repair exports, its first transaction half written and open: the repair's
    lease keeps recovery off its transactions; the repair then completes, every record once."""
    prefix = lost.prefixes["leased"]
    gate = tmp_path / "leased-gate"
    proc, err = lost.repair(tmp_path, prefix, "--hold-in-export-until", str(gate))
    try:
        wait_for_line(proc, err, "holding")
        # "holding" is the first slot's; the repair's other slots write beside it, in threads
        deadline = time.monotonic() + 120
        while len(before := lost.env.open_transactions(prefix)) < LOST and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(before) == LOST and all(f"-{attempts_of(RUN)}" in tid for tid in before), before
        recovered = subprocess.run(
            [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "resolve", "--prefix", prefix,
             "--bootstrap-servers", lost.env.bootstrap, "--decision-topic", lost.decisions],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        said = recovered.stdout + recovered.stderr
        assert f"left to the live repair of run {RUN}, which commits or aborts it" in said, said[-3000:]
        assert lost.env.open_transactions(prefix) == before  # nothing of the repair aborted
        gate.touch()
        code, report, text = _finish(proc, err)
    finally:
        if proc.poll() is None:
            sigkill(proc)
    assert code == 0 and report["status"] == "REPAIRED" and report["now"] is True, text[-3000:]
    seen = lost.keys(prefix)
    assert set(seen) == lost.expected(prefix) and set(seen.values()) == {1}
    assert lost.left_open(prefix) == []
