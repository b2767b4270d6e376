"""The emulated cluster of issue 38: hosts as Linux network namespaces (tests/helpers/netns.py).

A Spark standalone master, two workers and three Kafka brokers each run on a host of their own; the
driver (this test process) runs in the root namespace and reaches the hosts through the bridge. The
tests prove what the emulation promises: executors on two hosts with their own addresses and private
local directories, blocks fetched from one host by another, every host reaching the brokers, and
nothing left behind once a network is destroyed; then the export on it, and host faults: a broker
host cut off the network during the commit, a Spark worker host killed during the write.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import netns, spark_cluster
from tests.helpers.jvm_options import stop_driver_jvm
from tests.helpers.kafka import REPO, KafkaEnv, kafka_local, kafka_on_hosts
from tests.helpers.spark_cluster import NetnsSparkCluster

pytestmark = pytest.mark.kafka

WORKERS = ("spark1", "spark2")
BROKERS = ("kafka1", "kafka2", "kafka3")  # node ids 1, 2, 3


@pytest.fixture(scope="module")
def netns_spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsSparkCluster]:
    """The master URL (``.master_url``), the hosts (``.network.hosts``) and kill_host, cut_link,
    restore_link. A prefix of its own: another run's network on this machine is not ours to touch."""
    with spark_cluster.netns_spark_cluster(
        # Two cores a worker: this module's classic session and its Spark Connect server hold one
        # executor (one core, 512 MB) on every worker each.
        tmp_path_factory.mktemp("netns"),
        f"k2t{secrets.token_hex(2)}",
        WORKERS,
        cores=2,
        others=BROKERS,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def host_kafka(netns_spark_cluster: NetnsSparkCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """Three brokers, each on a host of its own (KRaft: each is a controller too); the root namespace
    and every Spark host reach them through the bridge."""
    with kafka_on_hosts(netns_spark_cluster.network, BROKERS, tmp_path_factory.mktemp("kafka-hosts")) as env:
        yield env


@pytest.fixture(scope="module")
def spark(netns_spark_cluster: NetnsSparkCluster) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYSPARK_PYTHON", sys.executable)  # read once, when the context starts
        session = (
            SparkSession.builder.master(netns_spark_cluster.master_url)
            .appName("kafka2pc-netns-tests")
            .config("spark.driver.host", netns_spark_cluster.driver_host)
            .config("spark.driver.bindAddress", netns_spark_cluster.driver_host)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.cores.max", str(len(WORKERS)))
            .config("spark.executorEnv.PYTHONPATH", str(REPO))
            .getOrCreate()
        )
    try:
        assert session.sparkContext.master == netns_spark_cluster.master_url, (
            f"another SparkSession ({session.sparkContext.master}) is still active in this process"
        )
        yield session
    finally:
        session.stop()
        stop_driver_jvm()  # its driver address and master must not become the next session's defaults


def test_executors_run_on_two_hosts_with_private_dirs_and_reach_the_broker(
    netns_spark_cluster: NetnsSparkCluster, spark: Any, host_kafka: KafkaEnv
) -> None:
    local_dir = str(netns_spark_cluster.network.host(WORKERS[0]).local_dir)  # the same path on every host
    topic = host_kafka.topic(partitions=len(WORKERS))
    bootstrap = host_kafka.bootstrap

    def on_host(index: int, _: Iterator[int]) -> Iterator[dict[str, Any]]:
        import socket

        from confluent_kafka import Consumer, Producer, TopicPartition
        from pyspark import BarrierTaskContext

        name = socket.gethostname()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((bootstrap.split(":")[0], 9))  # no packet: the route's source address
            address = s.getsockname()[0]
        Path(local_dir, f"marker-{name}").write_text(name)
        BarrierTaskContext.get().barrier()  # every host has written its marker before any lists
        listing = sorted(os.listdir(local_dir))
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, key=name.encode(), value=address.encode(), partition=index)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{name}", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, index, 0)])
        message = consumer.poll(30)
        consumer.close()
        read = None if message is None or message.error() else (message.key() or b"").decode()
        yield {
            "host": name,
            "address": address,
            "env_ip": os.environ.get("SPARK_LOCAL_IP"),
            "listing": listing,
            "read": read,
        }

    started = time.monotonic()
    rdd = spark.sparkContext.parallelize(range(len(WORKERS)), len(WORKERS))
    rows = rdd.barrier().mapPartitionsWithIndex(on_host).collect()
    print(f"barrier job on {len(WORKERS)} hosts: {time.monotonic() - started:.1f}s")

    # A barrier stage runs its tasks at once: with one core per executor, one task on each host.
    assert sorted(r["host"] for r in rows) == sorted(WORKERS)
    for r in rows:
        host = netns_spark_cluster.network.host(r["host"])
        assert r["address"] == host.address and r["env_ip"] == host.address, r
        # Its own marker only, next to the executor's spark-* dir (SPARK_LOCAL_DIRS is the private dir).
        assert [f for f in r["listing"] if f.startswith("marker-")] == [f"marker-{r['host']}"], r
        assert any(f.startswith("spark-") for f in r["listing"]), r
        assert r["read"] == r["host"], r
    assert os.listdir(local_dir) == []  # the root namespace sees no host's files
    # And the root namespace reads both records at the same address, read_committed.
    records = host_kafka.read_committed(topic)
    assert sorted((rec.key, rec.value) for rec in records) == sorted(
        (w.encode(), netns_spark_cluster.network.host(w).address.encode()) for w in WORKERS
    )


def test_shuffle_blocks_are_fetched_from_the_other_host(netns_spark_cluster: NetnsSparkCluster, spark: Any) -> None:
    def map_side(_: Iterator[int]) -> Iterator[tuple[int, frozenset[str]]]:
        import socket

        name = socket.gethostname()
        return iter([(key, frozenset([name])) for key in range(4)])

    def reduce_side(pairs: Iterator[tuple[int, frozenset[str]]]) -> Iterator[tuple[int, list[str], str]]:
        import socket

        return iter([(key, sorted(hosts), socket.gethostname()) for key, hosts in pairs])

    started = time.monotonic()
    rdd = spark.sparkContext.parallelize(range(len(WORKERS)), len(WORKERS))
    rows = (
        rdd.barrier()
        .mapPartitions(map_side)  # one map task on each host
        .reduceByKey(lambda a, b: a | b, len(WORKERS))
        .mapPartitions(reduce_side)
        .collect()
    )
    print(f"shuffle between hosts: {time.monotonic() - started:.1f}s")
    # Every key's blocks came from both hosts: each reduce task read one block from a host it is not on.
    assert sorted(key for key, _, _ in rows) == [0, 1, 2, 3]
    for _, hosts, reducer in rows:
        assert hosts == sorted(WORKERS) and reducer in WORKERS


def test_host_faults_and_stop_leave_nothing_behind(tmp_path: Path) -> None:
    """Without Spark: a host killed, a link cut and restored, a network destroyed twice, and one whose
    owner died reaped, each checked with ip and /proc."""
    prefix = f"k2t{secrets.token_hex(2)}"
    network = netns.create(prefix, ("h1", "h2"), tmp_path, owner_pid=os.getpid())
    try:
        h1 = network.host("h1")
        server = subprocess.Popen(
            network.command("h1", [sys.executable, "-m", "http.server", "--bind", h1.address, "8000"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # A second process that forks a child of its own: killing the host takes the whole tree.
        sleeper = subprocess.Popen(network.command("h1", ["sh", "-c", "sleep 600 & sleep 600"]), start_new_session=True)
        fetch = f"import socket; socket.create_connection(('{h1.address}', 8000), timeout=2).close()"
        deadline = time.monotonic() + 20
        while True:  # from the other host, through the bridge
            try:
                network.run("h2", [sys.executable, "-c", fetch])
                break
            except netns.NetnsError:
                assert time.monotonic() < deadline, "h2 never reached h1's server"
                time.sleep(0.2)

        network.cut_link("h1")
        with pytest.raises(OSError):
            socket.create_connection((h1.address, 8000), timeout=1).close()
        network.restore_link("h1")
        socket.create_connection((h1.address, 8000), timeout=5).close()

        running = network.pids("h1")
        assert server.pid in running and sleeper.pid in running and len(running) >= 3, running
        assert network.kill_host("h1") == len(running)
        assert server.wait(5) == -9 and sleeper.wait(5) == -9
        assert network.pids("h1") == []
        network.run("h2", ["true"])  # the other host lives on
    finally:
        network.destroy()
        network.destroy()  # idempotent
    assert netns.leftovers(prefix, tmp_path) == []
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout

    # A creator that died before its finalizer: its network is an orphan, reaped by the next one.
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = netns.create(prefix, ("h1",), tmp_path / "orphan", owner_pid=dead.pid)
    orphan_sleep = subprocess.Popen(orphan.command("h1", ["sleep", "600"]), start_new_session=True)
    deadline = time.monotonic() + 30
    while orphan_sleep.pid not in orphan.pids("h1"):  # a host's process, not one still on its way in
        assert orphan_sleep.poll() is None and time.monotonic() < deadline, "the sleep never entered h1"
        time.sleep(0.05)
    assert prefix in netns.reap_orphans()
    assert orphan_sleep.wait(5) == -9
    assert netns.leftovers(prefix, tmp_path / "orphan") == []


# The export itself on the emulated cluster: the executors run on other hosts than the driver, so
# the default way is the barrier stage (spark/barrier_job.py), never the slower checkpoint.


def _export_settings(env: KafkaEnv, topic: str, **producer: Any) -> Any:
    import uuid

    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

    return ExportSettings(f"x{uuid.uuid4().hex[:8]}", {**env.config, **producer}, topic)


def test_an_export_whose_executors_are_on_other_hosts_takes_the_barrier_and_commits_exactly_once(
    spark: Any,
    netns_spark_cluster: NetnsSparkCluster,
    host_kafka: KafkaEnv,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """Prepared by executors on two worker hosts, committed by a process on a third host that took
    no part in the prepare (the master's), from the committables alone, as a commit task on another
    Airflow worker would."""
    import json
    import logging
    import uuid

    from airflow_provider_kafka2pc.spark.job import export_dataframe

    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    topic = host_kafka.topic(4)
    df = spark.range(60_000, numPartitions=6).selectExpr(
        "concat('h-', CAST(id AS STRING)) AS key", "CAST(id * 3 AS STRING) AS value"
    )
    s = _export_settings(host_kafka, topic)
    result = export_dataframe(df, s)  # the defaults: store="auto"
    assert "executors run on other hosts than the driver" in caplog.text, caplog.text
    assert "barrier stage, before any transaction opens" in caplog.text
    assert "checkpoint" not in caplog.text.split("barrier stage")[0].split("writer:")[-1]
    assert result.records == 60_000 and len(result.committables) == len(WORKERS)  # one per task slot
    assert host_kafka.read_committed(topic, timeout_s=5) == []
    committables = tmp_path / "committables.jsonl"
    committables.write_text("".join(c.to_json() + "\n" for c in result.committables))
    command = [sys.executable, "-m", "tests.helpers.phase_two", "commit", "--bootstrap", host_kafka.bootstrap]
    command += ["--decision-topic", f"d{uuid.uuid4().hex[:8]}", "--run", "netns-1", "--committables", str(committables)]
    said = netns_spark_cluster.network.run(netns_spark_cluster.master, command, timeout=120)
    assert json.loads(said.splitlines()[-1])["resolutions"] == len(WORKERS), said
    assert host_kafka.count_committed(topic, b"h-") == (60_000, 60_000)
    assert host_kafka.open_transactions(s.transactional_id_prefix) == []


def test_an_export_through_a_spark_connect_server_on_the_cluster_takes_the_barrier_and_commits_exactly_once(
    netns_spark_cluster: NetnsSparkCluster,
    host_kafka: KafkaEnv,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """A Spark Connect server whose executors run on the two worker hosts: the client (this process)
    is not the driver and sees no executor, and still no checkpoint is taken. One barrier stage over
    the server's task slots computes, agrees and writes; nothing is visible until the commit."""
    import logging

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    gateway = netns_spark_cluster.driver_host
    conf = {
        "spark.driver.host": gateway,
        "spark.driver.bindAddress": gateway,
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": str(len(WORKERS)),
    }
    was_set = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    with spark_cluster.connect_server(
        tmp_path, netns_spark_cluster.master_url, conf, env={"SPARK_LOCAL_IP": gateway}
    ) as server:
        session = ConnectSession.builder.remote(server.url).getOrCreate()
        try:
            caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
            topic = host_kafka.topic(4)
            df = session.range(40_000, numPartitions=5).selectExpr(
                "concat('sc-', CAST(id AS STRING)) AS key", "CAST(id * 7 AS STRING) AS value"
            )
            s = _export_settings(host_kafka, topic)
            result = export_dataframe(df, s)  # the defaults: store="auto", no checkpoint_dir
            apps = [a for a in netns_spark_cluster.spark.state()["activeapps"] if a["name"] == "kafka2pc-connect-tests"]
        finally:
            session.stop()
            if not was_set:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    assert "Spark Connect: the client cannot see where the executors run" in caplog.text, caplog.text
    assert f"shuffled into {len(WORKERS)} partition(s), one per task slot" in caplog.text
    assert "checkpoint" not in caplog.text
    # The server's executors ran on both worker hosts (each worker keeps a directory per application).
    assert len(apps) == 1, apps
    assert all((worker / apps[0]["id"]).is_dir() for worker in netns_spark_cluster.spark.worker_dirs)
    assert result.records == 40_000 and len(result.committables) == len(WORKERS)
    assert host_kafka.read_committed(topic, timeout_s=5) == []
    assert len(host_kafka.open_transactions(s.transactional_id_prefix)) == len(WORKERS)
    log = DecisionLog(host_kafka.config, topic=f"decisions_sc_{s.transactional_id_prefix}")
    try:
        commit_prepared(result.committables, host_kafka.wire, log, run="netns-connect")
    finally:
        log.close()
    assert host_kafka.count_committed(topic, b"sc-") == (40_000, 40_000)
    assert host_kafka.open_transactions(s.transactional_id_prefix) == []


@pytest.fixture(scope="module")
def lost_on_cluster(spark: Any, host_kafka: KafkaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two runs exported by the cluster's executors, each LOST after its COMMIT ended half of its
    transactions (the broker aborted the rest at their 30 s timeout, waited for once for both):
    a plain scan of Parquet files, written as stored, and a computed frame, which the barrier
    stage dealt round-robin over the 2 task slots (its dealing recorded as the operator does)."""
    import uuid
    from types import SimpleNamespace

    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import Decided, decide_commit
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
    from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
    from tests.helpers.lost_runs import record_lost

    files, records, timeout_ms, run = 4, 500, 30_000, "orders/manual__netns-repair"
    tag = uuid.uuid4().hex[:6]
    decisions = f"decisions_nrep_{tag}"
    source = tmp_path_factory.mktemp("netns-repair") / "orders"  # one file system: every host reads it
    spark.range(files * records, numPartitions=files).selectExpr(
        f"concat('{tag}/', CAST(id AS STRING)) AS key", "CAST(id AS STRING) AS value"
    ).write.parquet(str(source))
    # One Spark partition per small file, in the run and in its repair alike.
    spark.conf.set("spark.sql.files.openCostInBytes", str(128 * 1024 * 1024))
    window = WindowSettings(handover_ms=1_000)
    runs = SimpleNamespace(
        run=run, window=window, env=host_kafka, decisions=decisions, records=files * records,
        parquet=lambda: spark.read.parquet(str(source)),
        computed=lambda: spark.range(files * records, numPartitions=6).selectExpr(
            f"concat('{tag}c/', CAST(id AS STRING)) AS key", "CAST(id * 3 AS STRING) AS value"
        ),
        keys={"parquet": tag.encode(), "computed": f"{tag}c/".encode()},
        settings={
            how: ExportSettings(f"nrep{tag}{how[0]}", host_kafka.config, topic=host_kafka.topic(4),
                                transaction_timeout_ms=timeout_ms)
            for how in ("parquet", "computed")
        },
        results={},
    )  # fmt: skip
    log = DecisionLog(host_kafka.config, topic=decisions)
    try:
        for how, frame in (("parquet", runs.parquet), ("computed", runs.computed)):
            s = runs.settings[how]

            def dealt(dealing: Any, prefix: str = s.transactional_id_prefix) -> None:
                assert log.record_dealt(prefix, run, dealing)

            runs.results[how] = export_dataframe(frame(), s, window=window, record_dealing=dealt)
            cs = sorted(runs.results[how].committables, key=lambda c: int(c.transactional_id.rsplit("-", 1)[1]))
            assert all(c.digest and c.digest.startswith("xxh64t:") for c in cs), cs
            with WireClient(host_kafka.config) as wire:
                assert isinstance(decide_commit(cs, wire, log, run, end_txn_timeout_s=2), Decided)
                TransactionResolver(wire).resolve([ref_of(c) for c in cs[: len(cs) // 2]], Intent.COMMIT)
        prefixes = [s.transactional_id_prefix for s in runs.settings.values()]
        record_lost(host_kafka.config, decisions, prefixes, run, timeout_ms)  # the broker aborted the rest
        yield runs
    finally:
        log.close()
        spark.conf.unset("spark.sql.files.openCostInBytes")


def _repair_on_cluster(runs: Any, how: str, frame: Any = None) -> Any:
    from airflow_provider_kafka2pc.spark.repair_export import repair_exporter
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
    from airflow_provider_kafka2pc.txn.two_phase.repair import repair_lost_run

    s, frame = runs.settings[how], frame or getattr(runs, how)
    log = DecisionLog(runs.env.config, topic=runs.decisions)
    try:
        with WireClient(runs.env.config) as wire:
            again = repair_exporter(lambda plan: frame(), s, window=runs.window)
            return repair_lost_run(wire, log, s.transactional_id_prefix, runs.run, again)
    finally:
        log.close()


def test_a_parquet_run_that_lost_transactions_after_its_commit_is_repaired_on_the_cluster(
    lost_on_cluster: Any,
) -> None:
    """A plain scan of Parquet files keeps its digest (hashed in the write job: nothing is staged or
    dealt). The repair, on the same cluster, exports the 2 lost Spark partitions again and commits
    them: every key once, nothing open. (Issue 40 at local[2] is ``test_repair_spark.py``.)"""
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus

    runs, env = lost_on_cluster, lost_on_cluster.env
    prefix, topic, key = (
        runs.settings["parquet"].transactional_id_prefix,
        runs.settings["parquet"].topic,
        runs.keys["parquet"],
    )
    assert len(runs.results["parquet"].committables) == 4  # one per file: written as stored, not dealt
    assert env.count_committed(topic, key) == (runs.records // 2, runs.records // 2)
    report = _repair_on_cluster(runs, "parquet")
    assert report.record.status is RunStatus.REPAIRED and report.repaired_now, report
    assert report.record.repair is not None and report.record.repair.restored == runs.records // 2, report.record
    assert env.count_committed(topic, key) == (runs.records, runs.records)
    assert env.open_transactions(prefix) == []


def test_a_computed_run_dealt_by_the_barrier_stage_is_repaired_on_the_cluster(lost_on_cluster: Any) -> None:
    """The barrier stage dealt the computed frame round-robin over the cluster's 2 task slots and
    hashed each slot's rows; the run recorded the dealing. One slot's transaction was lost: the
    repair deals the recomputed frame over 2 slots again, writes only the lost one, proves it the
    same records by its digest and commits it: every key once, nothing open."""
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.errors import RepairRefusedError
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
    from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing

    runs, env = lost_on_cluster, lost_on_cluster.env
    s, key = runs.settings["computed"], runs.keys["computed"]
    assert len(runs.results["computed"].committables) == len(WORKERS)  # one per task slot: dealt
    log = DecisionLog(env.config, topic=runs.decisions)
    try:
        assert log.dealing(s.transactional_id_prefix, runs.run) == Dealing(len(WORKERS), 6)  # from 6 partitions
    finally:
        log.close()
    visible = env.count_committed(s.topic, key)
    assert visible[0] == visible[1] and 0 < visible[0] < runs.records, visible
    # The same rows in 5 partitions would be dealt otherwise: refused before anything is written.
    refused = r"dealt the run's 6 Spark partition\(s\) over 2 task slot\(s\), and this frame has 5"
    with pytest.raises(RepairRefusedError, match=refused):
        _repair_on_cluster(runs, "computed", lambda: runs.computed().repartition(5))
    assert env.count_committed(s.topic, key) == visible and env.open_transactions(s.transactional_id_prefix) == []
    report = _repair_on_cluster(runs, "computed")
    assert report.record.status is RunStatus.REPAIRED and report.repaired_now, report
    assert report.record.repair is not None and report.record.repair.restored == runs.records - visible[0]
    assert env.count_committed(s.topic, key) == (runs.records, runs.records)
    assert env.open_transactions(s.transactional_id_prefix) == []


def _cut_during_commit(
    cluster: NetnsSparkCluster, env: KafkaEnv, host: str, committables: Any, decisions: str, run: str
) -> str:
    """Cut ``host`` off, commit at once, restore the link 20 s later; what the commit did."""
    import threading

    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    def commit() -> None:
        with env.new_wire() as wire:
            commit_prepared(committables, wire, DecisionLog(env.config, topic=decisions), run=run)

    cluster.cut_link(host)
    restore = threading.Timer(20, cluster.restore_link, (host,))
    restore.start()
    started = time.monotonic()
    try:
        try:
            commit()
            outcome = "committed while it was cut off"
        except Kafka2PCError as e:  # named; then the user's next step once the host is back
            outcome = f"{type(e).__name__} ({e}), then committed by the next try"
            restore.join()
            commit()
    finally:
        restore.cancel()
        cluster.restore_link(host)  # idempotent: the link is up whatever happened
    return f"{outcome} in {time.monotonic() - started:.1f}s"


def _wait_rejoined(cluster: NetnsSparkCluster, env: KafkaEnv, host: str, topics: list[str]) -> None:
    """The broker on ``host`` answers again, and every broker, itself included, reports the same
    leaders and full ISRs for ``topics``: it has read the metadata it missed while cut off."""
    from tests.helpers.kafka import wait_brokers_agree

    address = cluster.network.host(host).address
    port = int(next(b for b in env.bootstrap.split(",") if b.startswith(f"{address}:")).split(":")[1])
    kl = kafka_local()
    deadline = time.monotonic() + 60
    while True:
        try:
            if kl.metadata_broker_ids(port, host=address) == {1, 2, 3}:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the broker on {host} did not rejoin"
        time.sleep(0.5)
    wait_brokers_agree(env, topics)


def test_a_broker_host_cut_off_as_the_commit_starts_ends_exactly_once(
    spark: Any, netns_spark_cluster: NetnsSparkCluster, host_kafka: KafkaEnv
) -> None:
    """A broker host's link goes down as the commit starts (its connections hang: no reset, unlike a
    killed process) and comes back 20 s later; twice: the host coordinating the run's first
    transaction, then the host leading the decision log's protocol partition. Each commit ends exactly
    once: by itself (two brokers of three still answer, and another takes over the cut one's
    coordinators once the controller fences it) or with a named failure, after which the user's next
    step (the commit task again) finishes it. Nothing is left open and the host rejoins."""
    import uuid

    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from tests.helpers.kafka import partition_leader

    decisions = f"d{uuid.uuid4().hex[:8]}"
    DecisionLog(host_kafka.config, topic=decisions).ensure_topic()  # as the export task leaves it
    for target in ("transaction coordinator", "decision log leader"):
        topic = host_kafka.topic(4)
        df = spark.range(20_000, numPartitions=4).selectExpr(
            "concat('c-', CAST(id AS STRING)) AS key", "CAST(id AS STRING) AS value"
        )
        s = _export_settings(host_kafka, topic)
        result = export_dataframe(df, s)
        tids = [c.transactional_id for c in result.committables]
        if target == "transaction coordinator":
            node = host_kafka.wire.find_transaction_coordinators(tids)[tids[0]].node_id
        else:
            node = partition_leader(host_kafka, decisions, 0)
        host = BROKERS[node - 1]
        run = f"cut-{s.transactional_id_prefix}"
        said = _cut_during_commit(netns_spark_cluster, host_kafka, host, result.committables, decisions, run)
        print(f"{target} {host} (node {node}) cut as the commit started: {said}")
        # Judged once the host is back and has caught up, and the transactions are complete. A broker
        # that was cut off still answers, for a few seconds after it rejoins, as the coordinator it
        # was: DescribeTransactions and ListTransactions sent to it show the run's transactions as
        # they stood when its link went down ("Ongoing"), until it learns that another broker took
        # its partitions of the transaction log over (seen in CI). And EndTxn answers once the
        # coordinator has decided (PrepareCommit); the markers that make each partition's records
        # visible follow, and reach a partition that moved away from the cut broker later (seen in
        # CI: 15,013 of 20,000 keys read right after the commit returned, the rest once complete).
        # And a rejoined broker answers Metadata as the leader it was of the partitions that moved
        # (seen in CI: 19,925 of 20,000 read, though every replica's log held all the records and both
        # commit markers): a reader sent to it stops at its stale last stable offset.
        _wait_rejoined(netns_spark_cluster, host_kafka, host, [topic, decisions, "__transaction_state"])
        settled = time.monotonic() + 30
        while True:
            states = {tid: st.state if st else None for tid, st in host_kafka.describe(*tids).items()}
            left = host_kafka.open_transactions(s.transactional_id_prefix)
            if (states == dict.fromkeys(tids, "CompleteCommit") and not left) or time.monotonic() > settled:
                break
            time.sleep(0.5)
        assert states == dict.fromkeys(tids, "CompleteCommit"), f"30 s after {host} rejoined: {states}"
        assert left == [], f"still listed open 30 s after {host} rejoined"
        assert host_kafka.count_committed(topic, b"c-") == (20_000, 20_000)


def test_a_worker_host_killed_while_writing_leaves_nothing_visible_and_nothing_open(
    spark: Any, netns_spark_cluster: NetnsSparkCluster, host_kafka: KafkaEnv
) -> None:
    """Every process of one worker host SIGKILLed while its transaction is open (the writers are
    throttled by a broker quota so that the kill lands in the write): the barrier job fails at once,
    the driver aborts what the tasks opened, nothing of the run is visible. Last in the module: the
    host stays dead."""
    import threading
    import uuid

    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from tests.helpers.kafka import abort_open_now

    topic = host_kafka.topic(2)
    client_id = f"slow-{uuid.uuid4().hex[:6]}"
    # ~11 MB per writer: the broker throttles each 1 MB produce request for up to its quota window
    # (11 s), so a write takes minutes and the kill lands in it even when one host's task starts
    # long after the other's (with 2.2 MB, a CI run saw one writer prepared before the other opened).
    # The values are digests, which lz4 cannot shrink: 'v' * 100 went out as 0.5 MB per writer, and
    # a CI run saw both writers prepared before the kill, and the export succeed.
    host_kafka.set_producer_byte_rate(client_id, 50_000)
    df = spark.range(160_000, numPartitions=2).selectExpr(
        "concat('z-', CAST(id AS STRING)) AS key",
        "concat(unhex(sha2(CAST(id AS STRING), 512)), unhex(sha2(CAST(-1 - id AS STRING), 512))) AS value",
    )
    s = _export_settings(host_kafka, topic, **{"client.id": client_id})
    log = DecisionLog(host_kafka.config, topic=f"d{uuid.uuid4().hex[:8]}")
    aborted: list[bool] = []

    def abort_opened() -> bool:
        done, _ = abort_open_now(host_kafka, s.transactional_id_prefix, log)
        aborted.append(done)
        return done

    failure: list[BaseException] = []

    def export() -> None:
        try:
            export_dataframe(df, s, window=WindowSettings(store="barrier"), abort_opened=abort_opened)
        except BaseException as e:
            failure.append(e)

    worker = threading.Thread(target=export)
    worker.start()
    deadline = time.monotonic() + 120
    while len(host_kafka.open_transactions(s.transactional_id_prefix, settle_s=0)) < len(WORKERS):
        assert time.monotonic() < deadline and worker.is_alive(), f"the write never opened both: {failure}"
        time.sleep(0.2)
    killed = netns_spark_cluster.kill_host(WORKERS[1])
    assert killed > 0
    worker.join(180)
    assert not worker.is_alive() and failure, "the export did not fail after its host was killed"
    assert aborted == [True]
    assert host_kafka.open_transactions(s.transactional_id_prefix) == []
    assert host_kafka.count_committed(topic, b"z-", timeout_s=10) == (0, 0)


def test_a_commit_host_black_holed_after_its_decision_changes_nothing_when_it_comes_back(
    netns_spark_cluster: NetnsSparkCluster, host_kafka: KafkaEnv, tmp_path: Path
) -> None:
    """Issue 46's scenario on hosts: the commit runs on a worker host; once its COMMIT is read back the
    host is black-holed (every packet dropped: its EndTxn hangs, nothing is refused). The commit is
    retried from elsewhere and commits; the next run recovers, prepares on the same ids (new epochs)
    and commits; then the host's packets flow again and its commit goes on with what it read before
    the hole. It must not call the run lost: it proves the commit from the markers and exits 0; Kafka
    shows both runs once, the run's record stays COMMITTED, and nothing is open."""
    import uuid

    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
    from tests.helpers.actors import spawn, wait_for_line
    from tests.integration.test_decisions_broker import prepare, settle, write_committables

    net, env = netns_spark_cluster.network, host_kafka
    prefix, topic, decisions = f"bh{uuid.uuid4().hex[:8]}", env.topic(4), f"d{uuid.uuid4().hex[:8]}"
    log = DecisionLog(env.config, topic=decisions)
    first = prepare(env, prefix, 2, topic, records=3000, tag="run1")
    path = write_committables(tmp_path, first)
    argv = [sys.executable, "-m", "tests.helpers.phase_two", "commit", "--bootstrap", env.bootstrap,
            "--decision-topic", decisions, "--run", "run-1", "--committables", path,
            "--hold-after-decision-ms", "1000", "--end-txn-timeout", "600"]  # fmt: skip
    zombie, err = spawn(net.command(WORKERS[0], argv), tmp_path, "black-holed-commit")
    try:
        wait_for_line(zombie, err, "decided")
        net.black_hole(WORKERS[0])
        try:
            assert commit_prepared(first, env.wire, log, "run-1").committed  # the retry, elsewhere
            settle(env, prefix, log)  # the next run's recovery sensor
            second = prepare(env, prefix, 2, topic, records=3000, tag="run2")
            assert commit_prepared(second, env.wire, log, "run-2").committed
            assert zombie.poll() is None, err.read_text()[-3000:]  # still hanging in the hole
        finally:
            net.end_black_hole(WORKERS[0])
        zombie.communicate(timeout=600)
    finally:
        if zombie.poll() is None:
            os.killpg(zombie.pid, 9)
            zombie.wait(30)
    said = err.read_text()
    assert zombie.returncode == 0, said[-3000:]
    assert "committed by another process" in said and "TransactionLost" not in said, said[-3000:]
    keys = [r.key for r in env.read_committed(topic)]
    assert len(keys) == 12_000 and len(set(keys)) == 12_000
    state = DecisionLog(env.config, topic=decisions).read()
    assert state.runs[(prefix, "run-1")].status is RunStatus.COMMITTED and state.overruled == {}
    assert recover(env.wire, prefix, log, run="run-3").done
    assert env.open_transactions(prefix) == []
