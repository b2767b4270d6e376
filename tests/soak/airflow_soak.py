"""The soak's Airflow mode: runs of the e2e DAG (recover → prepare with Spark → commit | abort) on a
real standalone Airflow, with the faults an Airflow deployment meets, on the soak's own Kafka,
prefix and topic, judged by the same checker as the protocol runs.

Faults, drawn per run (``AirflowPlan``): a SIGKILL of the process group of a running task
(``airflow worker -- <ti id>``, with its Spark JVM and Python workers), a Spark Python worker
SIGKILLed mid-task (``local[2, 4]``: Spark retries the task), a clear over the REST API of the
running prepare or commit (Airflow stops it and runs it again) or of a whole earlier run that had
succeeded, a broker stopped and started during the run. The user's obvious next step for a failed
run is one clear of its failed tasks over the API.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import REPO
from tests.soak.checker import Violation
from tests.soak.spark_actor import kill_all

if TYPE_CHECKING:
    from tests.soak.harness import Run, Soak

DAG_ID = "e2e_kafka2pc"
DAGS = REPO / "tests" / "e2e" / "dags"
RUN_TIMEOUT_S = 600.0
# How long after a task's process starts a fault may strike: within what the task usually takes,
# start-up included (the prepare starts Spark).
STRIKE_WITHIN_S = {"recover": 4.0, "prepare": 25.0, "commit": 5.0}


@dataclass(frozen=True)
class AirflowPlan:
    kill: str = ""  # "" | "recover" | "prepare" | "commit"
    spark: bool = False
    clear: str = ""  # "" | "prepare" | "commit": cleared while it runs
    clear_earlier: bool = False  # a whole earlier run that had succeeded, cleared after this one
    broker: bool = False

    @classmethod
    def draw(cls, rng: random.Random) -> AirflowPlan:
        return cls(
            kill=rng.choice(["", "recover", "prepare", "commit"]),
            spark=rng.random() < 0.4,
            clear=rng.choice(["", "prepare", "commit"]),
            clear_earlier=rng.random() < 0.3,
            broker=rng.random() < 0.3,
        )


AIRFLOW_SHORT_PLANS = (
    AirflowPlan(kill="prepare", broker=True),
    AirflowPlan(spark=True, kill="commit"),
    AirflowPlan(kill="recover", clear="commit"),  # the commit is cleared in the user's rerun
    AirflowPlan(clear="prepare", clear_earlier=True),
)


def task_process(ti_id: str) -> int | None:
    """The pid of the task process Airflow runs for this task instance try, if it is alive."""
    title = f"airflow worker -- {ti_id}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if (d / "cmdline").read_bytes().startswith(title):
                    return int(d.name)
    return None


def task_process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class AirflowRuns:
    """One standalone Airflow for the whole soak; each ``one_run`` is one DAG run and its faults."""

    def __init__(self, soak: Soak, home: Path, quick: bool = False) -> None:
        self.soak = soak
        self.rng = random.Random(soak.seed + 2)
        self.quick = quick  # strike as soon as the task runs (the short mode must not miss)
        conn = {"conn_type": "kafka2pc", "host": soak.bootstrap, "extra": {"decision_topic": soak.decisions}}
        env = {
            "AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps(conn),
            "E2E_PREFIX": soak.prefix,
            "E2E_TOPIC": soak.topic,
            "E2E_COMMIT_RETRIES": "1",
            # A failed Spark task is retried, as on a cluster; a worker exists only while its task runs.
            "E2E_SPARK_CONF": json.dumps({"spark.master": "local[2, 4]", "spark.python.worker.reuse": "false"}),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        self.af = StandaloneAirflow(home, DAGS, env, dag_ids=[DAG_ID])
        self.af.start()
        self.af.unpause(DAG_ID)
        self.succeeded: list[tuple[Run, str]] = []
        self.settled = threading.Event()  # the run under way reached its end: faults still waiting give up

    def close(self) -> None:
        self.af.stop()

    # -- faults -----------------------------------------------------------------------------
    def task_pid(self, run_id: str, task: str) -> int | None:
        """The task's process as soon as it exists (in the user's rerun, too), or None if it never ran.

        A try's id is known while it is scheduled or queued, and its process carries it in its
        title from the fork on: watching /proc for it cannot miss a task that lasts a second.
        """
        while not self.settled.is_set():
            ti = self.af.task_instance(DAG_ID, run_id, task)
            if ti["state"] in ("scheduled", "queued", "running") and ti.get("id"):
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:
                    pid = task_process(str(ti["id"]))
                    if pid is not None:
                        return pid
                    time.sleep(0.02)
            else:
                time.sleep(0.3)
        return None

    def kill_task(self, r: Run, run_id: str, task: str, delay_s: float) -> None:
        pid = self.task_pid(run_id, task)
        time.sleep(delay_s)
        try:
            if pid is None:
                raise ProcessLookupError
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            r.notes.append(f"{task} ended before the kill")
            return
        self.soak.inject(r, f"kill_{task}", "airflow")

    def kill_spark_workers(self, r: Run, run_id: str, delay_s: float) -> None:
        """Every Python worker under way (partition 0's first row takes 2 s): its tasks fail, Spark retries."""
        pid = self.task_pid(run_id, "prepare")
        workers = self.soak.python_workers(pid, timeout_s=120) if pid is not None else []
        if workers:
            time.sleep(delay_s)
            kill_all(workers)
            r.notes.append("Spark workers were killed")

    def clear_running(self, r: Run, run_id: str, task: str, delay_s: float) -> None:
        pid = self.task_pid(run_id, task)
        time.sleep(delay_s)
        if pid is None or not task_process_alive(pid):
            r.notes.append(f"{task} ended before the clear")
            return
        self.af.clear_tasks(DAG_ID, run_id, [task])
        self.soak.inject(r, "clear", f"airflow-{task}-running")

    def restart_broker(self, r: Run, delay_s: float) -> None:
        if not self.settled.wait(delay_s):  # only while the run is under way
            self.soak.restart_broker(r, "airflow")

    # -- one run ----------------------------------------------------------------------------
    def one_run(self, i: int, plan: AirflowPlan) -> Run:
        from tests.soak.harness import Run

        rows, partitions = self.rng.randint(200, 3000), self.rng.randint(1, 4)
        tag = f"af{i}"
        conf = {"tag": f"{tag}/", "rows": rows, "partitions": partitions, "sleep_s": 2 if plan.spark else 0}
        run_id = self.af.trigger(DAG_ID, conf=conf)
        r = Run(run=f"{DAG_ID}/{run_id}", tag=tag, expected=rows, count=partitions, records=rows // partitions)
        self.soak.runs.append(r)
        # Each fault on a thread of its own, its moment drawn here so that a seed replays the plan.
        faults = []
        if plan.kill:
            kill = (r, run_id, plan.kill, self.moment(STRIKE_WITHIN_S[plan.kill]))
            faults.append(threading.Thread(target=self.kill_task, args=kill, daemon=True))
        if plan.spark:
            spark = (r, run_id, self.moment(0.3))
            faults.append(threading.Thread(target=self.kill_spark_workers, args=spark, daemon=True))
        if plan.clear:
            clear = (r, run_id, plan.clear, self.moment(STRIKE_WITHIN_S[plan.clear]))
            faults.append(threading.Thread(target=self.clear_running, args=clear, daemon=True))
        if plan.broker:
            delay = self.rng.uniform(3.0, 25.0)
            faults.append(threading.Thread(target=self.restart_broker, args=(r, delay), daemon=True))
        self.settled.clear()
        for t in faults:
            t.start()
        state = self.af.wait_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
        if state == "failed":  # the user's next step: clear the failed tasks once
            r.notes.append(f"failed ({self.failed_tasks(run_id)}), cleared by the user")
            self.af.clear_run(DAG_ID, run_id, only_failed=True)
            self.wait_rerun(run_id)
            state = self.af.wait_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
        self.settled.set()
        for t in faults:
            t.join()
        r.status = "success" if state == "success" else "failed"
        if r.status == "failed":
            r.notes.append(f"failed again ({self.failed_tasks(run_id)})")
        self.count_spark_failure(r, run_id)
        if r.status == "success":
            self.succeeded.append((r, run_id))
        if plan.clear_earlier and self.succeeded:
            self.clear_earlier(r)
        return r

    def moment(self, within_s: float) -> float:
        return 0.0 if self.quick else self.rng.uniform(0.0, within_s)

    def failed_tasks(self, run_id: str) -> str:
        states = self.af.task_states(DAG_ID, run_id)
        return ", ".join(f"{t}={s}" for t, s in states.items() if s not in ("success", "skipped"))

    def wait_rerun(self, run_id: str) -> None:
        """A cleared run leaves its terminal state before it runs again."""
        deadline = time.monotonic() + 30
        while self.af.run_state(DAG_ID, run_id) in ("success", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)

    def count_spark_failure(self, r: Run, run_id: str) -> None:
        if "Spark workers were killed" not in r.notes:
            return
        with contextlib.suppress(Exception):  # no payload: the prepare failed, or was cleared
            payload: Any = self.af.xcom(DAG_ID, run_id, "prepare")
            if isinstance(payload, str):
                payload = json.loads(payload)
            if payload.get("summary", {}).get("retried_partitions"):
                self.soak.inject(r, "spark_task_failure", "airflow")

    def clear_earlier(self, r: Run) -> None:
        """A whole earlier, successful run cleared: it must end as it was, nothing exported twice."""
        old, old_run_id = self.rng.choice(self.succeeded)
        self.af.clear_run(DAG_ID, old_run_id)
        self.soak.inject(r, "clear", "airflow-run")
        self.wait_rerun(old_run_id)
        state = self.af.wait_run(DAG_ID, old_run_id, timeout=RUN_TIMEOUT_S)
        if state != "success":
            why = f"cleared after it had succeeded, it ended {state}: {self.failed_tasks(old_run_id)}"
            self.soak.broken.append(Violation(old.run, why))
