"""The Spark prepare job on a real standalone cluster: a master and two workers, each its own JVM.

Local mode runs every task inside the driver's JVM; here the tasks run in executor processes
started by two workers, so the transactions are opened in processes other than the driver and
committed from the test process, as in production.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.spark.errors import ExecutorLostError
from airflow_provider_kafka2pc.spark.job import ExportResult, export_dataframe
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from tests.helpers.jvm_options import stop_driver_jvm
from tests.helpers.kafka import REPO, KafkaEnv, abort_open_now
from tests.helpers.spark_cluster import StandaloneCluster, standalone_cluster

pytestmark = pytest.mark.kafka

WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-standalone"), workers=WORKERS) as c:
        yield c


@pytest.fixture(scope="module")
def spark(cluster: StandaloneCluster) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as mp:
        # The driver reads PYSPARK_PYTHON once, when the context starts, and sends it with every
        # Python function: the executors run this venv's interpreter (spark.pyspark.python is only
        # read by spark-submit).
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        session = (
            SparkSession.builder.master(cluster.master_url)
            .appName("kafka2pc-cluster-tests")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            # The REST API of the UI tells which executor ran which task. Set explicitly: a session
            # that started this process's JVM earlier (spark.ui.enabled=false in local mode) left
            # its settings behind as JVM defaults.
            .config("spark.ui.enabled", "true")
            .config("spark.ui.port", "0")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.cores.max", str(WORKERS))
            .config("spark.task.maxFailures", "4")
            # Executors run in the workers' directories: the checkout must be on their path.
            .config("spark.executorEnv.PYTHONPATH", str(REPO))
            .getOrCreate()
        )
    try:
        # getOrCreate returns a session that is still active in this process whatever its master;
        # running these tests in local mode would prove nothing.
        assert session.sparkContext.master == cluster.master_url, (
            f"another SparkSession ({session.sparkContext.master}) is still active in this process"
        )
        _wait_for_executors(session, WORKERS)
        yield session
    finally:
        session.stop()
        stop_driver_jvm()  # its driver address and master must not become the next session's defaults


def _wait_for_executors(session: Any, n: int, timeout_s: float = 120) -> None:
    # Without this the first executor to register could run every task before the second arrives.
    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus()
    deadline = time.monotonic() + timeout_s
    while status.size() < n + 1:  # + the driver's block manager
        assert time.monotonic() < deadline, f"only {status.size() - 1} of {n} executors registered"
        time.sleep(0.2)
        status = session.sparkContext._jsc.sc().getExecutorMemoryStatus()


def _get_json(url: str, timeout_s: float = 120) -> Any:
    """The driver UI's answer, waited for: on a loaded machine its REST API answered a request after
    more than 10 s (seen in a full run), so a request that times out is asked again until the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.load(r)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


def _tasks_of_group(session: Any, group: str, successes: int, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Every task attempt of the write job in ``group`` (its last job: materializing the frame runs
    jobs before it), from the driver's REST API (index, attempt, executorId, status).

    The status store is fed by the listener bus, after the job has returned: poll until it has them all.
    """
    sc = session.sparkContext
    base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
    deadline = time.monotonic() + timeout_s
    while True:
        tasks: list[dict[str, Any]] = []
        for job in sorted(sc.statusTracker().getJobIdsForGroup(group))[-1:]:
            for stage in _get_json(f"{base}/jobs/{job}")["stageIds"]:
                for attempt in _get_json(f"{base}/stages/{stage}?details=true"):
                    tasks += attempt.get("tasks", {}).values()
        if sum(t["status"] == "SUCCESS" for t in tasks) >= successes:
            return tasks
        assert time.monotonic() < deadline, f"the status store shows {tasks}"
        time.sleep(0.2)


def _export(session: Any, df: Any, settings: ExportSettings) -> tuple[ExportResult, list[dict[str, Any]]]:
    group = f"export-{uuid.uuid4().hex[:8]}"
    session.sparkContext.setJobGroup(group, "kafka2pc export")
    result = export_dataframe(df, settings)
    return result, _tasks_of_group(session, group, result.partitions)


def _settings(env: KafkaEnv, topic: str, **kw: Any) -> ExportSettings:
    return ExportSettings(f"c{uuid.uuid4().hex[:8]}", env.config, topic, **kw)


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def _app_dirs(cluster: StandaloneCluster, app_id: str) -> list[Path]:
    return [d / app_id for d in cluster.worker_dirs if (d / app_id).is_dir()]


def test_export_on_two_workers_is_exactly_once(spark: Any, cluster: StandaloneCluster, kafka: KafkaEnv) -> None:
    rows = 20_000
    topic = kafka.topic(4)
    df = spark.range(rows, numPartitions=4).selectExpr(
        "cast(id as string) as key", "concat('value-', cast(id as string)) as value"
    )
    s = _settings(kafka, topic)
    result, tasks = _export(spark, df, s)

    # The tasks ran in two executors, one per worker, and none in the driver.
    done = [t for t in tasks if t["status"] == "SUCCESS"]
    assert sorted(t["index"] for t in done) == [0, 1, 2, 3]
    executors = {t["executorId"] for t in done}
    assert len(executors) == WORKERS and "driver" not in executors, tasks
    assert len(_app_dirs(cluster, spark.sparkContext.applicationId)) == WORKERS  # each worker started an executor

    assert result.records == rows and len(result.committables) == 4 and result.retried == ()
    assert [c.transactional_id for c in result.committables] == [s.transactional_id(i) for i in range(4)]
    assert kafka.read_committed(topic) == []  # prepared on the executors, not visible
    assert len(kafka.open_transactions(s.transactional_id_prefix)) == 4

    # The executors have finished; the transactions are committed from this process.
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="cluster1")
    records = kafka.read_committed(topic)
    assert len(records) == rows and len({r.key for r in records}) == rows
    assert {r.key for r in records} == {str(i).encode() for i in range(rows)}
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_task_failed_on_one_executor_is_fenced_by_its_retry(
    spark: Any, cluster: StandaloneCluster, kafka: KafkaEnv
) -> None:
    rows = 20_000
    topic = kafka.topic(2)
    df = spark.range(rows, numPartitions=4).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    # Partition 1's first attempt writes 3,000 records into its open transaction, then dies.
    s = _settings(kafka, topic, fail_first_attempt=(1, 3_000))
    result, tasks = _export(spark, df, s)

    failed = [t for t in tasks if t["status"] == "FAILED"]
    assert [(t["index"], t["attempt"]) for t in failed] == [(1, 0)], tasks
    assert "injected failure" in failed[0].get("errorMessage", "")
    assert "driver" not in {t["executorId"] for t in tasks}

    assert result.records == rows and len(result.committables) == 4 and result.retried == (1,)
    assert kafka.read_committed(topic) == []
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="cluster2")
    records = kafka.read_committed(topic)
    # The 3,000 records of the failed attempt were aborted when the retry fenced it: no duplicates.
    assert len(records) == rows and len({r.key for r in records}) == rows
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def _executor_pids(app_id: str, driver_url_part: str) -> list[int]:
    """The executor JVMs of the application, from their command lines in /proc: its app id and its
    driver's address (two clusters on one machine can hand out the same app id)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        backend = b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args
        if backend and app_id.encode() in args and any(driver_url_part.encode() in a for a in args):
            pids.append(int(cmdline.parent.name))
    return pids


def _export_and_kill_an_executor(
    spark: Any, kafka: KafkaEnv, topic: str, store: str, after_kill: Any = None
) -> tuple[ExportSettings, dict[str, Any], list[str]]:
    """Export 20,000 rows in 4 partitions, throttled by the broker (~150 s to write); SIGKILL one
    executor JVM once the write job has transactions open; ``after_kill`` runs then."""
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    rows = 20_000
    df = spark.range(rows, numPartitions=4).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    client_id = f"slow-{uuid.uuid4().hex[:6]}"
    kafka.set_producer_byte_rate(client_id, 2_000)  # ~150 s to write: time to kill an executor meanwhile
    s = ExportSettings(f"c{uuid.uuid4().hex[:8]}", {**kafka.config, "client.id": client_id}, topic)
    log = _log(kafka)
    aborts: list[str] = []
    outcome: dict[str, Any] = {}

    def abort_opened() -> bool:
        done, last = abort_open_now(kafka, s.transactional_id_prefix, log)
        aborts.append(last)
        return done

    def export() -> None:
        try:
            outcome["result"] = export_dataframe(df, s, window=WindowSettings(store=store), abort_opened=abort_opened)
        except BaseException as e:
            outcome["error"] = e

    writer = threading.Thread(target=export)
    writer.start()
    deadline = time.monotonic() + 120
    while len(kafka.open_transactions(s.transactional_id_prefix, settle_s=0)) < 2:  # the write job is writing
        assert time.monotonic() < deadline and writer.is_alive(), outcome
        time.sleep(0.2)
    sc = spark.sparkContext
    pids = _executor_pids(sc.applicationId, f"@127.0.0.1:{sc.getConf().get('spark.driver.port')}")
    assert len(pids) == WORKERS, pids
    os.kill(pids[0], signal.SIGKILL)
    if after_kill is not None:
        after_kill(client_id)
    writer.join(240)
    assert not writer.is_alive()
    outcome["log"] = log
    return s, outcome, aborts


def test_an_executor_lost_while_writing_a_local_checkpoint_aborts_the_run_whole_at_once(
    spark: Any, cluster: StandaloneCluster, kafka: KafkaEnv
) -> None:
    """The partitions it stored with the local checkpoint are gone and cannot be recomputed, so the
    job fails; the export aborts what was opened at once and names the cause. Nothing visible,
    nothing open."""
    topic = kafka.topic(4)
    s, outcome, aborts = _export_and_kill_an_executor(spark, kafka, topic, "checkpoint")
    error = outcome.get("error")
    assert isinstance(error, ExecutorLostError), repr(error)
    message = str(error)
    print(message)
    assert "an executor holding materialized partitions was lost during the write" in message
    assert "every transaction it opened was aborted at once: nothing of the run is visible" in message
    assert "checkpoint_dir" in message
    assert len(aborts) == 1
    assert kafka.open_transactions(s.transactional_id_prefix, settle_s=2) == []
    assert kafka.read_committed(topic) == []


def test_an_executor_lost_while_writing_staged_files_is_survived_exactly_once(
    spark: Any, cluster: StandaloneCluster, kafka: KafkaEnv
) -> None:
    """Staged Arrow files stay on the host's disk: the lost tasks are retried on another executor,
    which reads the same files and fences the lost attempts' transactions with init_transactions.
    The throttle is lifted after the kill so that the retries finish in seconds."""
    topic = kafka.topic(4)
    s, outcome, aborts = _export_and_kill_an_executor(
        spark, kafka, topic, "arrow", after_kill=lambda client_id: kafka.set_producer_byte_rate(client_id, 1e9)
    )
    result = outcome.get("result")
    assert result is not None, repr(outcome.get("error"))
    assert result.staged_bytes > 0 and result.retried != (), result.summary()
    assert result.records == 20_000 and len(result.committables) == 4
    assert aborts == []
    commit_prepared(result.committables, kafka.wire, outcome["log"], run="lost-executor")
    assert kafka.count_committed(topic) == (20_000, 20_000)
    assert kafka.open_transactions(s.transactional_id_prefix) == []
