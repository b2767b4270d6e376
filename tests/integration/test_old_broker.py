"""A broker older than Kafka 3.0 (a real 2.8, in ZooKeeper mode) is refused before anything is written.

Kafka 2.8 accepts every transaction the prepare opens, then refuses the batched FindCoordinator,
DescribeTransactions and ListTransactions that end and recover them from another process: the
transactions would stay open and hold back every read_committed reader. So the export's pre-flight
and the ``kafka2pc`` command refuse it at once, naming the broker's version and the version needed.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from airflow_provider_kafka2pc.txn.kafka.broker_support import UnsupportedBrokerError
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession
from tests.conftest import _start
from tests.helpers.kafka import OLD_KAFKA_VERSION, REPO, KafkaEnv, partition_ends

pytestmark = pytest.mark.kafka

NAMED = f"Kafka {OLD_KAFKA_VERSION.rsplit('.', 1)[0]}, by its API versions"  # "Kafka 2.8, by ..."
NEEDED = "kafka2pc needs Kafka 3.0 or newer"


@pytest.fixture(scope="module")
def old_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """One Kafka 2.8 broker and its ZooKeeper for this module, stopped by pid even on failure."""
    yield from _start(tmp_path_factory, "kafka28", 1, kafka_version=OLD_KAFKA_VERSION)


def test_an_export_and_the_cli_refuse_kafka_2_8_before_any_transaction(old_kafka: KafkaEnv) -> None:
    topic, prefix = old_kafka.topic(partitions=2), f"p{uuid.uuid4().hex[:8]}"
    decision_topic = f"decisions_{uuid.uuid4().hex[:8]}"

    # The operator's first step on the driver (ExportOperator._prepare): the export's pre-flight.
    clients = KafkaClients(old_kafka.config, decision_topic, timeout_s=10)
    with pytest.raises(UnsupportedBrokerError) as refused, PrepareSession(clients, prefix, "run-1") as session:
        session.check_export_access(topic)
    message = str(refused.value)
    assert "FindCoordinator up to v3 (v4 needed), DescribeTransactions and ListTransactions not at all" in message
    assert NAMED in message and NEEDED in message and "nothing was written" in message

    cli = subprocess.run(
        [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "list", "--prefix", prefix,
         "--bootstrap-servers", old_kafka.bootstrap],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 3, cli.stderr
    assert cli.stderr.startswith("kafka2pc: error: the Kafka broker at ") and "Traceback" not in cli.stderr
    assert NAMED in cli.stderr and NEEDED in cli.stderr

    # Judged on the broker: no record in the topic, even read_uncommitted; no transactional id was
    # ever looked up or initialised (the transaction log is made by the first such request); no
    # decision topic.
    assert partition_ends(old_kafka, topic) == {0: 0, 1: 0}
    topics = set(AdminClient(old_kafka.config).list_topics(timeout=10).topics)
    assert "__transaction_state" not in topics and decision_topic not in topics, topics
