"""A crashed prepare says how far it got and what happens next (``dag.test()``, real Spark and Kafka).

The Spark driver JVM is SIGKILLed while the export's last partition hangs (the others prepared):
the prepare's last kafka2pc line says how many partitions were prepared and that the abort task
aborts them; the abort task does; clearing the run (here: the next run) exports exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_dag_runs import E2E_DAG, PARTITIONS, conf, exactly_once, scenario, visible_keys
from tests.helpers.airflow_dagtest import DagTester
from tests.helpers.kafka import KafkaEnv

pytestmark = pytest.mark.kafka


def spark_jvms(pgid: int) -> list[int]:
    """The Spark driver JVMs of one process group (the dag.test run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ProcessLookupError):
            continue
        if b"java" in cmdline and b"org.apache.spark.deploy.SparkSubmit" in cmdline:
            found.append(int(entry.name))
    return found


def kafka2pc_lines(log: str) -> list[str]:
    return [m[1] for m in re.finditer(r"\] (kafka2pc[^\n]*?) \[airflow", log)]


def test_spark_jvm_killed_mid_prepare_the_log_says_how_far_and_the_abort_ends_it(
    kafka: KafkaEnv, dag_tester: DagTester
) -> None:
    env, prefix, topic = scenario(kafka, "prepare_hangs")
    proc, log = dag_tester.start(E2E_DAG, "e2e_kafka2pc", conf("crash"), env)
    # Until the driver has reported every partition but the hanging one as prepared.
    deadline = time.monotonic() + 300
    while f"prepare: {PARTITIONS - 1} of {PARTITIONS} partitions done" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.5)
    assert len(kafka.open_transactions(prefix, settle_s=0)) >= PARTITIONS - 1
    jvms = spark_jvms(proc.pid)
    assert len(jvms) == 1, jvms
    killed = time.monotonic()
    os.kill(jvms[0], signal.SIGKILL)
    assert proc.wait(timeout=300) == 0
    ended = time.monotonic() - killed
    print(f"JVM killed {killed - deadline + 300:.0f} s after the start; the run ended {ended:.0f} s later")
    text = log.read_text(errors="replace")
    lines = [ln for ln in kafka2pc_lines(text) if "prepare of run" in ln]
    assert lines, text[-4000:]
    last = lines[-1]
    print(f"the prepare's last kafka2pc line:\n  {last}")
    done = f"{PARTITIONS - 1} of {PARTITIONS} partition(s) were written and prepared at the last progress report"
    assert re.search(rf"failed \(\w+\) {re.escape(done)}", last), last
    assert "The abort task of this run aborts what it opened once every export has finished" in last
    assert "Next: after the abort task, clear the whole DAG run." in last
    result = json.loads(next(ln for ln in reversed(text.splitlines()) if ln.startswith('{"run_id"')))
    assert (result["state"], result["tasks"]["prepare"], result["tasks"]["abort"]) == ("failed", "failed", "success")
    assert kafka.open_transactions(prefix) == []  # the abort task ended what the crash left
    assert not any(k.startswith("crash-") for k in visible_keys(kafka, topic))

    started = time.monotonic()
    again = dag_tester.run(E2E_DAG, "e2e_kafka2pc", conf("crash"), {**env, "E2E_FAULT": ""})
    assert again.state == "success", again.log
    print(f"the next run took {time.monotonic() - started:.0f} s")
    exactly_once(visible_keys(kafka, topic), "crash")
    assert kafka.open_transactions(prefix) == []
