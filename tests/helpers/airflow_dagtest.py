"""Running DAGs with ``dag.test()`` against the real local Kafka, one subprocess per run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.dag_test_forks import DagTestForks, ForkedRun
from tests.helpers.kafka import REPO, KafkaEnv

RUNNER = REPO / "scripts" / "dag_test.py"
EXAMPLE_DAG = REPO / "dags" / "kafka2pc_example.py"
# The task states of a run of the example DAG that exported and committed.
EXAMPLE_DAG_COMMITTED = {
    "create_topic": "success",
    "orders.recover": "success",
    "orders.prepare": "success",
    "orders.commit": "success",
    "orders.abort": "skipped",
}


def airflow_base_env(home: Path, dags_folder: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }


def kafka2pc_connection(kafka: KafkaEnv) -> dict[str, str]:
    return {"AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps({"conn_type": "kafka2pc", "host": kafka.bootstrap})}


def migrate(home: Path, dags_folder: Path) -> None:
    env = {**os.environ, **airflow_base_env(home, dags_folder)}
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@dataclass
class DagRunResult:
    run_id: str
    state: str
    tasks: dict[str, str]
    tries: dict[str, int]
    seconds: float
    log: Path

    def task(self, task_id: str) -> str:
        return self.tasks[task_id]


Run = subprocess.Popen[bytes] | ForkedRun


@dataclass
class DagTester:
    home: Path
    dags_folder: Path
    logs: Path
    # One fork server per DAG folder (tests/helpers/dag_test_forks.py); KAFKA2PC_TEST_DAG_FORKS=0
    # starts every run as a process of its own.
    _forks: dict[Path, DagTestForks] = field(default_factory=dict, repr=False)

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return {**os.environ, **airflow_base_env(self.home, self.dags_folder), **extra}

    def start(self, dag_file: Path, dag_id: str, conf: Mapping[str, Any], env: Mapping[str, str]) -> tuple[Run, Path]:
        """Start a run in its own process group: a fork of the folder's server, or, for a run
        that changes Airflow's configuration, a process of its own."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{dag_id}-{time.time_ns()}.log"
        log.touch()  # a test reads it from the start
        # dag.test() serializes the DAGs of the folder it runs from: the DAG file's own.
        run_env = {**self.env(env), "AIRFLOW__CORE__DAGS_FOLDER": str(dag_file.parent)}
        if os.environ.get("KAFKA2PC_TEST_DAG_FORKS", "1") != "0" and not any(k.startswith("AIRFLOW__") for k in env):
            forked = self._server(dag_file.parent).fork(dag_file, dag_id, dict(conf), run_env, log)
            if forked is not None:
                return forked, log
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(RUNNER), str(dag_file), dag_id, json.dumps(dict(conf))],
                env=run_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a test can kill Spark's JVM with it
            )
        return proc, log

    def _server(self, folder: Path) -> DagTestForks:
        if folder not in self._forks:
            env = {**self.env({}), "AIRFLOW__CORE__DAGS_FOLDER": str(folder)}
            tag = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
            self._forks[folder] = DagTestForks(env, self.logs / f"fork-server-{folder.name}-{tag}.log")
        return self._forks[folder]

    def close(self) -> None:
        for server in self._forks.values():
            server.close()

    def run(
        self, dag_file: Path, dag_id: str, conf: Mapping[str, Any], env: Mapping[str, str], timeout_s: float = 600
    ) -> DagRunResult:
        proc, log = self.start(dag_file, dag_id, conf, env)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise AssertionError(f"dag.test of {dag_id} did not finish in {timeout_s} s; log: {log}") from None
        return self.result(proc, log)

    @staticmethod
    def result(proc: Run, log: Path) -> DagRunResult:
        """The ended run's result, as its runner's last line says it."""
        lines = log.read_text(errors="replace").splitlines()
        last = next((ln for ln in reversed(lines) if ln.startswith('{"run_id"')), None)
        if proc.returncode != 0 or last is None:
            raise AssertionError(
                f"dag.test crashed (exit {proc.returncode}); tail of {log}:\n" + "\n".join(lines[-60:])
            )
        data = json.loads(last)
        return DagRunResult(data["run_id"], data["state"], data["tasks"], data["tries"], data["seconds"], log)

    def kill_when(self, proc: Run, log: Path, condition: Callable[[], bool], timeout_s: float = 300) -> None:
        """SIGKILL the whole run (Airflow, Spark's JVM, Python workers) once ``condition`` holds."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {proc.returncode}) before it could be killed; log: {log}")
            if time.monotonic() > deadline:
                kill_group(proc)
                raise AssertionError(f"condition not reached in {timeout_s} s; log: {log}")
            time.sleep(0.5)
        kill_group(proc)

    def asset_events(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The asset events a DAG run's tasks emitted, as the metadata DB recorded them."""
        code = (
            "import json, sys\n"
            "from sqlalchemy import select\n"
            "from airflow.models.asset import AssetEvent, AssetModel\n"
            "from airflow.utils.session import create_session\n"
            "with create_session() as s:\n"
            "    rows = s.execute(select(AssetModel.uri, AssetEvent.source_task_id, AssetEvent.extra)\n"
            "        .join(AssetModel, AssetEvent.asset_id == AssetModel.id)\n"
            "        .where(AssetEvent.source_dag_id == sys.argv[1], AssetEvent.source_run_id == sys.argv[2]))\n"
            f"    print({RESULT_MARK!r} + json.dumps([{{'uri': u, 'task_id': t, 'extra': e}} for u, t, e in rows]))\n"
        )
        return list(json.loads(self.python(code, [dag_id, run_id], f"read the asset events of {dag_id} {run_id}")))

    def fail_running_runs(self, dag_id: str) -> list[str]:
        """Mark the DAG's runs still "running" in the DB as failed: the scheduler's part, for a killed dag.test.

        A run killed with SIGKILL stays "running" in the metadata DB. On a real Airflow the scheduler
        fails its task (heartbeat timeout) and then the run; ``dag.test()`` has no scheduler, and a
        POOLING exporter's next run waits for every earlier run the DB still calls live.
        """
        code = (
            "import json, sys\n"
            "from sqlalchemy import select\n"
            "from airflow.models.dagrun import DagRun\n"
            "from airflow.utils.session import create_session\n"
            "from airflow.utils.state import DagRunState\n"
            "with create_session() as s:\n"
            "    running = DagRun.dag_id == sys.argv[1], DagRun.state == DagRunState.RUNNING\n"
            "    ids = []\n"
            "    for dr in s.scalars(select(DagRun).where(*running)):\n"
            "        dr.state = DagRunState.FAILED\n"
            "        ids.append(dr.run_id)\n"
            f"print({RESULT_MARK!r} + json.dumps(ids))\n"
        )
        return list(json.loads(self.python(code, [dag_id], f"fail the running runs of {dag_id}")))

    def python(self, code: str, args: list[str], what: str, timeout_s: float = 120) -> str:
        """What ``python -c code *args`` printed last on a line of its own that starts with
        ``RESULT_MARK`` (the mark taken off), with the tester's environment; its failure fails the test
        (``what`` it could not do). A fork of a server already up (Airflow imported), if there is one;
        else a process of its own."""
        if os.environ.get("KAFKA2PC_TEST_DAG_FORKS", "1") != "0" and self._forks:
            self.logs.mkdir(parents=True, exist_ok=True)
            log = self.logs / f"python-{time.time_ns()}.log"
            run = next(iter(self._forks.values())).fork_python(code, args, self.env({}), log)
            if run is not None:
                try:
                    code_exit = run.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    kill_group(run)
                    raise AssertionError(f"cannot {what}: no end in {timeout_s:.0f} s; log: {log}") from None
                output = log.read_text(errors="replace")
                if code_exit != 0:
                    raise AssertionError(f"cannot {what} (exit {code_exit}):\n{output[-3000:]}")
                return _result(output, what)
        done = subprocess.run(
            [sys.executable, "-c", code, *args], env=self.env({}), capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise AssertionError(f"cannot {what}:\n{done.stderr[-3000:]}")
        return _result(done.stdout, what)


# The line of DagTester.python's program that carries its result (a forked one's output is mixed
# with the log lines Airflow writes to stderr).
RESULT_MARK = "kafka2pc-test-result: "


def _result(output: str, what: str) -> str:
    lines = [line.removeprefix(RESULT_MARK) for line in output.splitlines() if line.startswith(RESULT_MARK)]
    if not lines:
        raise AssertionError(f"cannot {what}: no result line in\n{output[-3000:]}")
    return lines[-1]


def kill_group(proc: Run) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
