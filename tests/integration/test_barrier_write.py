"""The barrier job (``spark/barrier_job.py``): the one pass that serves executors on other hosts,
forced here with ``store='barrier'`` on a local session (the emulated cluster's test runs it
where the executors really are elsewhere). Judged by a read_committed count and the transactions
left open."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kafka2pc.spark.job import export_dataframe
from airflow_provider_kafka2pc.spark.window import WindowSettings
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.protocol.errors import WindowRefusedError
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from tests.helpers.kafka import KafkaEnv

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2, 4]")
        .appName("kafka2pc-barrier-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    session.stop()


def _settings(env: KafkaEnv, topic: str) -> ExportSettings:
    return ExportSettings(f"b{uuid.uuid4().hex[:8]}", env.config, topic)


def test_a_computed_frame_is_computed_by_the_barrier_tasks_then_written_exactly_once(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """8 partitions after a shuffle on 2 task slots: shuffled into 2 barrier tasks, each staging
    its share in a file of its executor before any transaction opens; nothing visible until the
    commit, then every key once."""
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
    commit_prepared(
        result.committables, kafka.wire, DecisionLog(kafka.config, topic=f"d{uuid.uuid4().hex[:8]}"), run="b1"
    )
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


def test_a_failed_barrier_task_fails_the_job_at_once_and_what_it_opened_is_aborted(spark: Any, kafka: KafkaEnv) -> None:
    """Spark does not run a failed barrier result stage again ("Could not recover from a failed
    barrier ResultStage"): the job fails at the first failed task, with its error, and what the
    tasks opened is aborted at once. Nothing visible, nothing open."""
    from dataclasses import replace

    from tests.helpers.kafka import abort_open_now

    topic = kafka.topic(2)
    df = spark.range(20_000, numPartitions=2).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    s = replace(_settings(kafka, topic), fail_first_attempt=(0, 3_000))  # slot 0 fails after 3,000 records
    log = DecisionLog(kafka.config, topic=f"d{uuid.uuid4().hex[:8]}")
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
