"""Lines that say nothing about the run go to DEBUG; everything else keeps its level."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_kafka2pc.spark import jvm_logs
from airflow_provider_kafka2pc.txn.kafka.client_logs import LIBRDKAFKA_LOG


@pytest.mark.parametrize(
    ("logger", "line"),
    [
        (jvm_logs.log, "26/11/25 22:29:05 WARN NativeCodeLoader: Unable to load native-hadoop library"),
        (jvm_logs.log, "WARNING: Using incubator modules: jdk.incubator.vector"),
        (jvm_logs.log, "26/11/25 22:29:03 WARN Utils: Your hostname, vm, resolves to a loopback address: 127.0.0.1"),
        (jvm_logs.log, "26/12/06 13:49:07 ERROR ContextCleaner: Error cleaning broadcast 1"),  # Spark's stop
        (LIBRDKAFKA_LOG, "GETPID [rdkafka#producer-4] [thrd:main]: Failed to acquire idempotence PID from broker "
         "127.0.0.1:1/1: Broker: Coordinator load in progress: retrying"),
    ],
)  # fmt: skip
def test_start_up_chatter_and_retries_that_resolve_themselves_are_debug(
    logger: logging.Logger, line: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.warning("%s", line)
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        logger.warning("%s", line)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("DEBUG", line)]


def test_a_real_problem_keeps_its_level(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        jvm_logs.log.warning("26/11/25 22:29:05 WARN TaskSetManager: Lost task 3.0 in stage 1.0: ExecutorLostFailure")
        LIBRDKAFKA_LOG.error("FAIL [rdkafka#producer-1]: 127.0.0.1:1/1: Connect to ipv4#127.0.0.1:1 failed")
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
