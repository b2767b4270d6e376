"""The Spark prepare job through Spark Connect: the DataFrame is a client-side plan, and the job runs
in a separate Spark Connect server process (pyspark's own spark-connect jar, ``local[2, 4]``).

The partition function is pickled by the client and run by the server's Python workers, so the
server's Python must be able to import this package, and be the same Python version as the client.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kafka2pc.spark.job import export_dataframe
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from tests.helpers.kafka import KafkaEnv
from tests.helpers.registry import RegistryEnv
from tests.helpers.spark_cluster import ConnectServer, connect_server

pytestmark = pytest.mark.kafka

CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    # Spark's slot check of a barrier stage wider than the server: refused after one retry a second
    # later, not after its default 40 of 15 s.
    fast_check = {
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    }
    with connect_server(tmp_path_factory.mktemp("spark-connect"), conf=fast_check) as s:
        yield s


@pytest.fixture(scope="module")
def spark(server: ConnectServer) -> Iterator[Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # The builder marks the whole process as "Connect mode" in os.environ and never unmarks it for
    # a remote server; a classic session created later in this process would then fail to start.
    was_set = CONNECT_MODE in os.environ
    session = SparkSession.builder.remote(server.url).getOrCreate()
    try:
        assert isinstance(session, ConnectSession), type(session)
        yield session
    finally:
        session.stop()
        if not was_set:
            os.environ.pop(CONNECT_MODE, None)


def _settings(env: KafkaEnv, topic: str, **kw: Any) -> ExportSettings:
    return ExportSettings(f"sc{uuid.uuid4().hex[:8]}", env.config, topic, **kw)


def _log(env: KafkaEnv) -> DecisionLog:
    return DecisionLog(env.config, topic=f"decisions_{uuid.uuid4().hex[:8]}")


def test_export_through_spark_connect_is_exactly_once(
    spark: Any, kafka: KafkaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from pyspark.core.context import SparkContext
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

    rows = 20_000
    topic = kafka.topic(4)
    df = spark.range(rows, numPartitions=4).selectExpr(
        "cast(id as string) as key", "concat('value-', cast(id as string)) as value"
    )
    assert isinstance(df, ConnectDataFrame)
    s = _settings(kafka, topic)
    caplog.set_level(logging.INFO, logger="airflow_provider_kafka2pc")
    result = export_dataframe(df, s)
    # The client is not the driver: staging cannot serve, and no checkpoint is taken either. One barrier
    # stage computes the frame, dealt over the server's two task slots, before any transaction opens.
    assert (
        "kafka2pc computes the frame in the write job's barrier stage, before any transaction opens, on each "
        "task's own executor (Spark Connect: the client cannot see where the executors run): the source is "
        "shuffled into 2 partition(s), one per task slot" in caplog.text
    )
    assert "checkpoint" not in caplog.text
    assert result.staged_bytes == 0
    # No Spark context in this process: the tasks ran in the server.
    assert SparkContext._active_spark_context is None

    assert result.records == rows and len(result.committables) == 2 and result.retried == ()
    assert [c.transactional_id for c in result.committables] == [s.transactional_id(i) for i in range(2)]
    assert kafka.read_committed(topic) == []  # prepared, not visible
    assert len(kafka.open_transactions(s.transactional_id_prefix)) == 2

    commit_prepared(result.committables, kafka.wire, _log(kafka), run="connect1")
    records = kafka.read_committed(topic)
    assert len(records) == rows and {r.key for r in records} == {str(i).encode() for i in range(rows)}
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_failed_task_is_fenced_by_its_retry_through_spark_connect(spark: Any, kafka: KafkaEnv) -> None:
    """A checkpoint (asked for) is written by plain tasks, which Spark retries one by one; a barrier
    stage's failed task fails its job instead (``test_spark_export.py``)."""
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    rows = 10_000
    topic = kafka.topic(2)
    df = spark.range(rows, numPartitions=2).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    s = _settings(kafka, topic, fail_first_attempt=(1, 2_000))
    result = export_dataframe(df, s, window=WindowSettings(store="checkpoint"))
    assert result.records == rows and len(result.committables) == 2
    assert result.retried == (1,)  # the server retried partition 1 with the same transactional id
    assert kafka.read_committed(topic) == []
    commit_prepared(result.committables, kafka.wire, _log(kafka), run="connect2")
    records = kafka.read_committed(topic)
    assert len(records) == rows and len({r.key for r in records}) == rows
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_barrier_stage_wider_than_the_server_is_refused_by_name_with_nothing_opened(
    spark: Any, kafka: KafkaEnv
) -> None:
    """The client reads the server's slots from the splits spark.range takes: a session whose
    spark.sql.leafNodeDefaultParallelism (4) is above the server's 2 cores makes it ask for 4. Spark's
    slot check refuses the stage before any task runs; the export names it and the way out."""
    from airflow_provider_kafka2pc.spark.errors import BarrierSlotsError

    topic = kafka.topic(2)
    df = spark.range(4_000, numPartitions=2).selectExpr("cast(id as string) as key", "cast(id as string) as value")
    s = _settings(kafka, topic)
    spark.conf.set("spark.sql.leafNodeDefaultParallelism", "4")
    try:
        with pytest.raises(BarrierSlotsError) as e:
            export_dataframe(df, s)
    finally:
        spark.conf.unset("spark.sql.leafNodeDefaultParallelism")
    said = str(e.value)
    assert "Spark refused the barrier stage of 4 task(s)" in said and "store='checkpoint'" in said, said
    assert "nothing of the run is visible" in said
    assert kafka.read_committed(topic, timeout_s=2) == []
    assert kafka.open_transactions(s.transactional_id_prefix) == []


def test_a_registry_format_from_a_connect_builder_session_is_exactly_once(
    server: ConnectServer, spark: Any, kafka: KafkaEnv, schema_registry: RegistryEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session from Spark Connect's own builder leaves the process out of "Connect mode", where
    ``pyspark.sql.functions`` makes classic columns; the registry format frames the value with
    Connect's (classic ones were refused: "'Column' object is not callable")."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from airflow_provider_kafka2pc.registry.formats import JsonSchemaFormat
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats

    rows = 600
    monkeypatch.delenv(CONNECT_MODE, raising=False)  # as in a process that never used the generic builder
    session = ConnectSession.builder.remote(server.url).create()
    try:
        df = session.range(rows, numPartitions=2).selectExpr(
            "concat('order-', cast(id as string)) as key",
            "named_struct('id', id, 'name', concat('n', cast(id as string))) as value",
        )
        topic = kafka.topic(2)
        s = _settings(kafka, topic)
        result = export_dataframe(df, s, formats=RecordFormats(schema_registry.settings(), value=JsonSchemaFormat()))
        assert result.records == rows
        assert kafka.read_committed(topic, timeout_s=2) == []
        commit_prepared(result.committables, kafka.wire, _log(kafka), run="connect4")
    finally:
        session.stop()
    records = kafka.read_committed(topic)
    values = JSONDeserializer(None, schema_registry_client=schema_registry.confluent_client())
    decoded = {r.key: values(r.value, SerializationContext(topic, MessageField.VALUE)) for r in records}
    assert len(records) == rows
    assert decoded == {f"order-{i}".encode(): {"id": i, "name": f"n{i}"} for i in range(rows)}
    assert kafka.open_transactions(s.transactional_id_prefix) == []
