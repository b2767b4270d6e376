"""Task logs a person can read: JVM output at its own level, third-party chatter kept quiet."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from airflow_provider_kafka2pc.spark.jvm_logs import level_of
from airflow_provider_kafka2pc.spark.progress import Progress
from airflow_provider_kafka2pc.txn.kafka.client_logs import LIBRDKAFKA_LOG, quiet_third_party_logs, with_log

INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


@pytest.mark.parametrize(
    ("line", "previous", "level"),
    [
        ("26/11/23 00:17:48 WARN Utils: Your hostname, vm, resolves to a loopback address", INFO, WARNING),
        ("26/11/23 00:17:48 ERROR Executor: Exception in task 0.0 in stage 0.0 (TID 0)", INFO, ERROR),
        ("26/11/23 00:17:48 INFO SparkContext: Running Spark version 4.2.0", ERROR, INFO),
        ("%4|1795393063.576|GETPID|rdkafka#producer-3| [thrd:main]: Coordinator load in progress", INFO, WARNING),
        ("%3|1795393063.576|FAIL|rdkafka#producer-1| [thrd:b]: Connect to ipv4#127.0.0.1:1 failed", INFO, ERROR),
        ("%6|1795393064.889|BGQUEUE|rdkafka#producer-9| [thrd:background]: Purging 1 events", ERROR, INFO),
        ("/venv/pyspark/sql/pandas/functions.py:777: FutureWarning: PySpark does not yet fully support", INFO, WARNING),
        ("WARNING: Using incubator modules: jdk.incubator.vector", INFO, WARNING),
        ("Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties", WARNING, INFO),
        # Continuation lines (a stack trace, a multi-line record) keep the level of their record.
        ("\tat org.apache.spark.api.python.BasePythonRunner.compute(PythonRunner.scala:1)", ERROR, ERROR),
        ('  File "/venv/pyspark/worker.py", line 3, in main', ERROR, ERROR),
        ("Caused by: java.net.ConnectException: Connection refused", ERROR, ERROR),
        ("Traceback (most recent call last):", WARNING, WARNING),
    ],
)
def test_jvm_output_keeps_the_level_it_states(line: str, previous: int, level: int) -> None:
    assert level_of(line, previous) == level


@pytest.fixture
def third_party_levels() -> Iterator[None]:
    names = ("kafka", "py4j")
    before = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in before.items():
        logging.getLogger(n).setLevel(level)


def test_kafka_python_and_py4j_log_from_warning_unless_the_user_chose(third_party_levels: None) -> None:
    logging.getLogger("kafka").setLevel(logging.NOTSET)
    logging.getLogger("py4j").setLevel(logging.DEBUG)  # the user's choice
    quiet_third_party_logs()
    assert not logging.getLogger("kafka.net.connection").isEnabledFor(INFO)
    assert logging.getLogger("kafka.net.connection").isEnabledFor(WARNING)
    assert logging.getLogger("py4j").level == logging.DEBUG


def test_everything_at_debug_keeps_kafka_python_at_debug(
    third_party_levels: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("kafka").setLevel(logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "level", logging.DEBUG)  # Airflow's logging_level = DEBUG
    quiet_third_party_logs()
    assert logging.getLogger("kafka.net.connection").isEnabledFor(logging.DEBUG)


def test_driver_side_librdkafka_clients_log_through_python_logging() -> None:
    config = {"bootstrap.servers": "b:9092"}
    assert with_log(config) == {"bootstrap.servers": "b:9092", "logger": LIBRDKAFKA_LOG}
    assert config == {"bootstrap.servers": "b:9092"}


def test_progress_line() -> None:
    p = Progress(partitions_done=3, partitions=8, running=2, failed_attempts=1, records=30_000, elapsed_s=6.0)
    assert p.describe() == (
        "prepare: 3 of 8 partitions done (2 running, 1 failed attempts), 30000 records written, 5000 records/s, 6 s"
    )
