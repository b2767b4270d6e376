"""The Spark prepare job on real pyspark (local mode with task retries) and the real broker."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.spark.errors import SchemaError
from airflow_provider_kafka2pc.spark.job import export_dataframe
from airflow_provider_kafka2pc.spark.window import WindowSettings
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.errors import WindowRefusedError
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from tests.helpers.kafka import KafkaEnv

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run in this venv, like the driver
    # local[2, 4]: two cores, and a failed task is retried up to 4 times, as on a cluster.
    session = (
        SparkSession.builder.master("local[2, 4]")
        .appName("kafka2pc-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    session.stop()


def _settings(env: KafkaEnv, topic: str, **kw: Any) -> ExportSettings:
    return ExportSettings(f"s{uuid.uuid4().hex[:8]}", env.config, topic, **kw)


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def test_a_job_faster_than_the_first_progress_poll_still_reports_every_partition(spark: Any, kafka: KafkaEnv) -> None:
    """The last report must find the job's stages though no poll ever saw them active."""
    topic = kafka.topic(3)
    df = spark.range(300, numPartitions=3).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    seen: list[Any] = []
    settings = _settings(kafka, topic, delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    export_dataframe(df, settings, on_progress=seen.append, progress_interval_s=3600)
    assert len(seen) == 1  # only the last report: the job was over long before the first poll
    assert (seen[0].partitions_done, seen[0].partitions, seen[0].records) == (3, 3, 300)
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None  # the caller's group is back


def test_one_million_rows_exactly_once(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic(4)
    df = spark.range(1_000_000, numPartitions=4).selectExpr(
        "cast(id as string) as key", "concat('value-', cast(id as string)) as value"
    )
    s = _settings(kafka, topic)
    result = export_dataframe(df, s)
    assert result.records == 1_000_000 and len(result.committables) == 4
    assert result.counts_by_topic == {topic: 1_000_000}
    assert kafka.read_committed(topic) == []  # prepared, not visible
    assert len(kafka.open_transactions(s.transactional_id_prefix)) == 4

    commit_prepared(result.committables, kafka.wire, _log(kafka), run="m1")
    records = kafka.read_committed(topic, timeout_s=120)
    keys = {r.key for r in records}
    assert len(records) == 1_000_000 and len(keys) == 1_000_000
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_failed_task_is_fenced_by_its_retry_and_the_result_is_exactly_once(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic(2)
    df = spark.range(20_000, numPartitions=2).selectExpr(
        "cast(cast(id as string) as binary) as key", "cast(id as string) as value"
    )
    s = _settings(kafka, topic, fail_first_attempt=(1, 3_000))
    result = export_dataframe(df, s)
    assert result.records == 20_000 and len(result.committables) == 2
    assert result.retried == (1,)  # partition 1 succeeded on a later attempt, with the same id
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="f1")
    records = kafka.read_committed(topic)
    assert len(records) == 20_000 and len({r.key for r in records}) == 20_000
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_empty_partitions_open_no_transaction(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic(1)
    df = spark.range(10, numPartitions=5).where("id < 3").selectExpr("cast(id as string) as value")
    s = _settings(kafka, topic)
    result = export_dataframe(df, s)
    assert result.records == 3 and len(result.committables) == result.partitions <= 3
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="e1")
    assert sorted(r.value for r in kafka.read_committed(topic)) == [b"0", b"1", b"2"]
    assert kafka.open_transactions(s.transactional_id_prefix) == []


@pytest.mark.parametrize(
    "select, message",
    [
        (["cast(id as string) as key"], "'value' column is required"),
        (["cast(id as string) as value", "id as extra"], "unexpected column"),
        (["id as value"], "must be binary or string"),
        (["cast(id as string) as value", "id as topic"], "'topic' must be string"),
    ],
)
def test_bad_schema_is_refused_before_anything_is_written(
    spark: Any, kafka: KafkaEnv, select: list[str], message: str
) -> None:
    topic = kafka.topic(1)
    s = _settings(kafka, topic)
    with pytest.raises(SchemaError, match=message):
        export_dataframe(spark.range(10).selectExpr(*select), s)
    assert kafka.open_transactions(s.transactional_id_prefix) == []
    assert kafka.read_committed(topic) == []


def test_oversized_record_fails_the_prepare_and_the_abort_leaves_nothing(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic(2)
    # 2 MB value on row 500 of 1000: larger than the producer's message.max.bytes (1 MB).
    df = spark.range(1000, numPartitions=2).selectExpr(
        "cast(id as string) as key", "if(id = 500, repeat('x', 2000000), cast(id as string)) as value"
    )
    s = _settings(kafka, topic)
    with pytest.raises(Exception, match=r"MSG_SIZE_TOO_LARGE|too large"):
        export_dataframe(df, s)
    # What the abort task does: resolve every open transaction of the prefix without a decision.
    recover(kafka.wire, s.transactional_id_prefix, _log(kafka))
    assert kafka.open_transactions(s.transactional_id_prefix) == []
    assert kafka.read_committed(topic) == []


@pytest.mark.parametrize("guarantee", [DeliveryGuarantee.AT_LEAST_ONCE, DeliveryGuarantee.NONE])
def test_non_transactional_guarantees_write_everything_without_transactions(
    spark: Any, kafka: KafkaEnv, guarantee: DeliveryGuarantee
) -> None:
    topic = kafka.topic(2)
    df = spark.range(5000, numPartitions=3).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    s = _settings(kafka, topic, delivery_guarantee=guarantee)
    result = export_dataframe(df, s)
    assert result.committables == () and result.records == 5000
    assert len(kafka.read_committed(topic)) == 5000
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_records_without_a_topic_fail_clearly(spark: Any, kafka: KafkaEnv) -> None:
    topic = kafka.topic(1)
    df = spark.range(4, numPartitions=1).selectExpr(
        "cast(id as string) as value", f"if(id = 2, null, '{topic}') as topic"
    )
    s = ExportSettings(f"s{uuid.uuid4().hex[:8]}", kafka.config, None)
    with pytest.raises(Exception, match="no topic"):
        export_dataframe(df, s)
    recover(kafka.wire, s.transactional_id_prefix, _log(kafka))
    assert kafka.read_committed(topic) == []
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_the_native_and_the_python_writer_write_the_same_records_from_spark(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """One Spark partition (so the order per Kafka partition is the job's), string keys, binary
    values with tombstones: the same records, partitions and order on both paths; the driver says
    which path it takes."""
    import logging

    df = spark.range(30_000, numPartitions=1).selectExpr(
        "concat('k', cast(id % 977 as string)) AS key",
        "if(id % 101 = 0, NULL, cast(cast(id as string) as binary)) AS value",
    )
    seen = {}
    for writer in ("python", "native"):
        topic = kafka.topic(4)
        # The package's logger: the writer line is the job's, the batch line the write job's.
        with caplog.at_level(logging.INFO, logger="airflow_provider_kafka2pc"):
            result = export_dataframe(df, _settings(kafka, topic, writer=writer))
        commit_prepared(result.committables, kafka.wire, _log(kafka), run=f"spark-{writer}")
        records = kafka.read_committed(topic)
        seen[writer] = {p: [(r.key, r.value) for r in records if r.partition == p] for p in range(4)}
        assert any(m.startswith(f"kafka2pc writer: {writer}") for m in caplog.messages)
    assert sum(len(v) for v in seen["native"].values()) == 30_000
    assert seen["native"] == seen["python"]
    from airflow_provider_kafka2pc.spark.versions import has_arrow_byte_bound
    from airflow_provider_kafka2pc.spark.write_job import ARROW_MAX_BYTES_PER_BATCH

    # The session's own default, as the line reads it: 64 MiB on 4.2, 256 MiB on 4.0 (measured)
    bounds = (
        f"10000 records or {spark.conf.get(ARROW_MAX_BYTES_PER_BATCH)}"
        if has_arrow_byte_bound(spark.version)
        else "10000 records, no byte bound"
    )
    assert any(m.startswith(f"kafka2pc Arrow batches to the writers: {bounds}") for m in caplog.messages)


def _batch_rows(df: Any) -> list[int]:
    """The row counts of the Arrow batches Spark hands a ``mapInArrow`` function, in order."""
    import pyarrow as pa

    def sizes(batches: Iterator[Any]) -> Iterator[Any]:
        yield pa.RecordBatch.from_pylist(
            [{"rows": b.num_rows} for b in batches], schema=pa.schema([("rows", pa.int64())])
        )

    return [r["rows"] for r in df.mapInArrow(sizes, "rows long").collect()]


def test_the_byte_bound_the_guide_gives_turns_sparks_per_row_check_off_and_the_log_says_which_applies(
    spark: Any,
) -> None:
    """The user guide's tuning: 10,000 records of 8,000 bytes (80 MB) in one partition come in two
    batches under a byte bound of 64 MiB (4.2's default; 4.0's is 256 MiB, so it is set here), in one
    of 10,000 (the record bound) with the bound at Int.MaxValue, for which Spark skips its check; the
    task log line says which. Spark 3.5 has no byte bound: one batch of 10,000, and the line says to
    lower the record bound."""
    from airflow_provider_kafka2pc.spark.versions import has_arrow_byte_bound
    from airflow_provider_kafka2pc.spark.write_job import (
        ARROW_BYTES_UNCHECKED,
        ARROW_MAX_BYTES_PER_BATCH,
        arrow_batch_bounds,
    )

    df = spark.range(10_000, numPartitions=1).selectExpr("repeat('x', 8000) AS value")
    if not has_arrow_byte_bound(spark.version):
        assert _batch_rows(df) == [10_000]
        assert arrow_batch_bounds(spark).startswith(f"10000 records, no byte bound (Spark {spark.version} has no ")
        return
    try:
        spark.conf.set(ARROW_MAX_BYTES_PER_BATCH, "67108864b")
        bounded = _batch_rows(df)
        assert len(bounded) == 2 and sum(bounded) == 10_000
        assert arrow_batch_bounds(spark).startswith("10000 records or 67108864b, the bytes checked after every row")
        spark.conf.set(ARROW_MAX_BYTES_PER_BATCH, str(ARROW_BYTES_UNCHECKED))
        assert _batch_rows(df) == [10_000]
        assert arrow_batch_bounds(spark).startswith("10000 records, bytes unchecked")
    finally:
        spark.conf.unset(ARROW_MAX_BYTES_PER_BATCH)


def test_the_cache_manager_surface_tells_a_whole_stored_frame_from_one_that_is_not(spark: Any) -> None:
    """The private Spark calls behind spark/cache_manager.py, on the pinned Spark: an upgrade that
    moves them fails here (stored_already would then answer None: a staging pass, never a
    computation inside the window)."""
    from airflow_provider_kafka2pc.spark.cache_manager import stored_already

    def frame() -> Any:
        return spark.range(400, numPartitions=4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")

    cached = frame().cache()
    try:
        assert stored_already(cached) is None  # cached lazily: nothing loaded yet
        cached.count()
        loaded = stored_already(cached)
        assert loaded is not None and loaded.partitions == 4, loaded
        assert loaded.how.startswith("a cached frame, every partition loaded (Disk Memory Deserialized")
        assert stored_already(frame()) == loaded  # the same plan is the same cached query
        assert stored_already(cached.select("value", "key")) is None  # a plan on top computes
    finally:
        cached.unpersist()
    memory_only = frame().persist(__import__("pyspark").StorageLevel.MEMORY_ONLY)
    try:
        memory_only.count()
        assert stored_already(memory_only) is None  # an evicted partition would be recomputed
    finally:
        memory_only.unpersist()
    checkpoint = frame().localCheckpoint()
    assert stored_already(checkpoint) is not None and stored_already(checkpoint).how == "a checkpoint"  # type: ignore[union-attr]
    assert stored_already(frame()) is None


def test_the_physical_plan_surface_tells_a_plain_scan_of_columnar_files_from_a_computed_frame(
    spark: Any, tmp_path: Any
) -> None:
    """The private Spark calls behind spark/file_scan.py, on the pinned Spark: an upgrade that moves
    them fails here (plain_file_scan would then answer None: a staging pass, never a computation
    inside the window)."""
    from pyspark.sql import functions as F

    from airflow_provider_kafka2pc.spark.file_scan import file_splits, plain_file_scan

    rows = spark.range(400, numPartitions=4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    rows.write.parquet(str(tmp_path / "p"))
    rows.write.orc(str(tmp_path / "o"))
    rows.write.json(str(tmp_path / "j"))
    parquet = spark.read.parquet(str(tmp_path / "p"))
    scan = plain_file_scan(parquet)
    assert scan is not None and scan.how.startswith("a plain scan of parquet files"), scan
    assert scan.partitions == parquet.rdd.getNumPartitions()
    kept = parquet.where("value <> '7'").selectExpr("concat('k-', key) AS key", "CAST(value AS BINARY) AS value")
    assert plain_file_scan(kept) is not None  # kept, renamed, cast, filtered: still a scan
    orc = plain_file_scan(spark.read.orc(str(tmp_path / "o")))
    assert orc is not None and "orc" in orc.how
    upper = F.udf(lambda v: v.upper())
    parquet.createOrReplaceTempView("kafka2pc_scan")  # a scalar subquery in SQL: Spark 3.5 has no DataFrame.scalar
    computed = {
        "a range": rows,
        "a text format": spark.read.json(str(tmp_path / "j")),
        "an aggregation": parquet.groupBy("key").agg(F.max("value").alias("value")),
        "a join": parquet.join(parquet.select("key"), "key"),
        "a shuffle": parquet.repartition(3),
        "a Python UDF": parquet.select("key", upper("value").alias("value")),
        "a sort": parquet.orderBy("value"),
        "a subquery": spark.sql("SELECT * FROM kafka2pc_scan WHERE value = (SELECT max(value) FROM kafka2pc_scan)"),
    }
    for what, frame in computed.items():
        assert plain_file_scan(frame) is None, what
        assert file_splits(frame) is None, what
    # The splits each partition reads (what a repair's refusal names): every file once, as listed.
    splits = file_splits(kept)
    assert splits is not None and sorted(splits) == list(range(kept.rdd.getNumPartitions())), splits
    files = {Path(f.path.removeprefix("file:")).resolve(): f for s in splits.values() for f in s}
    listed = {p.resolve(): p.stat() for p in (tmp_path / "p").glob("*.parquet")}
    assert set(files) == set(listed), (files, listed)
    for path, f in files.items():
        assert (f.start, f.length, f.size) == (0, listed[path].st_size, listed[path].st_size), f
        assert f.modified_ms == listed[path].st_mtime_ns // 1_000_000, (f, listed[path].st_mtime_ns)


def test_a_cached_frame_and_a_parquet_scan_are_written_as_stored_and_a_computed_one_is_staged_first(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """All exactly once; the log says which way each went and the staging leaves no file. A scan
    is sized before writing only for a rate the user states, and store='arrow' stages it."""
    import logging
    from pathlib import Path

    from airflow_provider_kafka2pc.spark.window import WindowSettings

    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    staging_root = Path(spark.conf.get("spark.local.dir", None) or __import__("tempfile").gettempdir())
    before = set(staging_root.glob(f"kafka2pc-stage-{os.getpid()}-*"))
    said = {
        "cached": "writes a cached frame, every partition loaded",
        "parquet": "writes a plain scan of parquet files (1 scan(s)) as they are stored",
        "parquet-rated": "materialized the frame in",  # sized: a pass before any transaction
        "parquet-arrow": "bytes of Arrow files in",
        "computed": "bytes of Arrow files in",
    }
    for tag, text in said.items():
        topic = kafka.topic(4)
        df = spark.range(20_000, numPartitions=4).selectExpr(
            f"concat('{tag}-', CAST(id AS STRING)) AS key", "CAST(id AS STRING) AS value"
        )
        window = WindowSettings()
        if tag == "cached":
            df = df.cache()
            df.count()
        elif tag.startswith("parquet"):
            df.write.parquet(str(tmp_path / tag))
            df = spark.read.parquet(str(tmp_path / tag))
            if tag == "parquet-rated":
                window = WindowSettings(write_records_per_s=1_000_000)
            elif tag == "parquet-arrow":
                window = WindowSettings(store="arrow")
        s = _settings(kafka, topic)
        caplog.clear()
        try:
            result = export_dataframe(df, s, window=window)
        finally:
            if tag == "cached":
                df.unpersist()
        assert text in caplog.text, (tag, caplog.text)
        assert (result.staged_bytes > 0) == text.startswith("bytes of Arrow"), tag
        if tag == "parquet-rated":
            assert "20000 records" in caplog.text
            assert "plain scan of parquet files (1 scan(s)), read by the write job" in caplog.text
        if tag == "parquet":
            assert "not sized before writing" not in caplog.text  # no rate at all: nothing to size for
        commit_prepared(result.committables, kafka.wire, _log(kafka), run=tag)
        assert kafka.count_committed(topic, f"{tag}-".encode()) == (20_000, 20_000)
        assert kafka.open_transactions(s.transactional_id_prefix) == []
    assert set(staging_root.glob(f"kafka2pc-stage-{os.getpid()}-*")) == before


def test_staging_tasks_that_cannot_write_the_directory_fall_back_to_a_checkpoint_and_say_why(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Executors that cannot see the driver's staging directory (another user, another /tmp) fail the
    staging job before any transaction opens; the export then stores the frame with a checkpoint."""
    import logging

    from airflow_provider_kafka2pc.spark import staging

    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    monkeypatch.setattr(staging, "staging_directory", lambda _spark: str(tmp_path / "not-there"))
    topic = kafka.topic(2)
    df = spark.range(2_000, numPartitions=2).selectExpr("concat('fb-', CAST(id AS STRING)) AS key", "'v' AS value")
    s = _settings(kafka, topic)
    result = export_dataframe(df, s)
    assert (
        "kafka2pc stores the frame with a checkpoint instead of staging Arrow files: the staging tasks could not "
        f"write it: kafka2pc staging directory unusable ({tmp_path / 'not-there'}): No such file or directory"
    ) in caplog.text
    assert result.staged_bytes == 0 and len(result.committables) == 2
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="fallback")
    assert kafka.count_committed(topic, b"fb-") == (2_000, 2_000)
    assert kafka.open_transactions(s.transactional_id_prefix) == []


# The barrier job (``spark/barrier_job.py``): the one pass that serves executors on other hosts,
# forced here with store='barrier' on the local session (tests/integration/test_netns_cluster.py
# runs it where the executors really are on other hosts).


def test_a_computed_frame_is_computed_by_the_barrier_tasks_then_written_exactly_once(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """8 partitions after a shuffle on 2 task slots: shuffled into 2 barrier tasks, each staging
    its share in a file of its executor before any transaction opens; nothing visible until the
    commit, then every key once."""
    import logging

    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    topic = kafka.topic(4)
    df = (
        spark.range(40_000, numPartitions=8)
        .repartition(8, "id")
        .selectExpr("concat('k-', CAST(id AS STRING)) AS key", "CAST(id * 2 AS STRING) AS value")
    )
    s = _settings(kafka, topic)
    result = export_dataframe(df, s, window=WindowSettings(store="barrier"))
    assert "barrier stage, before any transaction opens" in caplog.text, caplog.text
    assert "transactions open from" in caplog.text
    assert result.records == 40_000 and len(result.committables) == 2  # one per task slot
    assert kafka.read_committed(topic, timeout_s=5) == []
    assert len(kafka.open_transactions(s.transactional_id_prefix)) == 2
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="b1")
    assert kafka.count_committed(topic, b"k-") == (40_000, 40_000)
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_run_the_tasks_find_too_big_for_the_budget_opens_nothing(spark: Any, kafka: KafkaEnv) -> None:
    """Every task learns every size at the barrier and refuses alike: no transaction, no record."""
    topic = kafka.topic(2)
    df = spark.range(10_000, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    s = _settings(kafka, topic)
    with pytest.raises(WindowRefusedError, match=r"refused before any transaction opened: writing 10000 records"):
        export_dataframe(df, s, window=WindowSettings(store="barrier", write_records_per_s=1))
    assert kafka.open_transactions(s.transactional_id_prefix) == []
    assert kafka.describe(s.transactional_id(0), s.transactional_id(1)) == {
        s.transactional_id(0): None,
        s.transactional_id(1): None,
    }  # never initialised


def test_a_repair_never_deals_its_partitions_again_in_a_barrier_stage(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """A repair writes the run's own Spark partitions (``only_slots``): where the export would take
    the barrier stage (forced here, as executors on other hosts force it), the repair stores them with
    a checkpoint instead, so partition 2's records stay in slot 2 and no other slot opens."""
    import logging

    from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
    from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
    from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    topic = kafka.topic(2)
    df = spark.range(800, numPartitions=4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    s = _settings(kafka, topic)
    result = export_dataframe(df, s, window=WindowSettings(store="barrier"), only_slots=(2,))
    assert "stores the repair's partitions with a checkpoint" in caplog.text, caplog.text
    assert [(c.transactional_id, c.records) for c in result.committables] == [(s.transactional_id(2), 200)]
    assert result.committables[0].digest is not None
    TransactionResolver(kafka.wire).resolve([ref_of(c) for c in result.committables], Intent.ABORT)
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_failed_barrier_task_fails_the_job_at_once_and_what_it_opened_is_aborted(spark: Any, kafka: KafkaEnv) -> None:
    """Spark does not run a failed barrier result stage again ("Could not recover from a failed
    barrier ResultStage"): the job fails at the first failed task, with its error, and what the
    tasks opened is aborted at once. Nothing visible, nothing open."""
    from dataclasses import replace

    from tests.helpers.kafka import abort_open_now

    topic = kafka.topic(2)
    df = spark.range(20_000, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    s = replace(_settings(kafka, topic), fail_first_attempt=(0, 3_000))  # slot 0 fails after 3,000 records
    log = _log(kafka)
    aborted: list[bool] = []

    def abort_opened() -> bool:
        done, _ = abort_open_now(kafka, s.transactional_id_prefix, log)
        aborted.append(done)
        return done

    with pytest.raises(Exception, match=r"injected failure in partition 0, attempt 0"):
        export_dataframe(df, s, window=WindowSettings(store="barrier"), abort_opened=abort_opened)
    assert aborted == [True]
    assert kafka.open_transactions(s.transactional_id_prefix) == []
    assert kafka.count_committed(topic, timeout_s=10) == (0, 0)
