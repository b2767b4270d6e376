"""A data topic made on purpose: the explicit step a DAG shows before its export, which never
creates data topics itself (a typo in ``topic=`` must fail, not export into a new topic)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, Kafka2PCError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataTopic:
    """What the step found or made: the topic, its partitions, and whether this call created it."""

    name: str
    partitions: int
    created: bool

    def describe(self) -> str:
        how = "created" if self.created else "exists already, left as it is"
        return f"topic {self.name} {how}: {self.partitions} partition(s)"


def create_topic_if_missing(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    replication_factor: int | None = None,
    topic_config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> DataTopic:
    """Create ``topic`` unless it exists; an existing topic is never changed. Describe is asked
    first (Write on the topic implies it), Create only when the topic is missing (docs/acls.md).
    ``replication_factor`` None: the broker's ``default.replication.factor``."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    if partitions < 1:
        raise ValueError(f"a topic needs at least one partition, not {partitions}")
    bootstrap = config.get("bootstrap.servers")
    admin = AdminClient(with_log(connection_only(config)))
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap} within {timeout_s:g} s: {e}") from e
    if topic in md.topics and md.topics[topic].error is None:
        return DataTopic(topic, len(md.topics[topic].partitions), created=False)
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(topic_config or {}),
    )
    try:
        admin.create_topics([new], operation_timeout=timeout_s, request_timeout=timeout_s)[topic].result()
    except KafkaException as e:
        err = e.args[0]
        if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # another actor made it meanwhile
            md = admin.list_topics(topic, timeout=timeout_s)
            return DataTopic(topic, len(md.topics[topic].partitions), created=False)
        named = authorization_error_of(err.name(), config, topic, "Create")
        if named is not None:
            raise named from None
        raise Kafka2PCError(f"could not create topic {topic!r} on {bootstrap}: {err.str()}") from e
    _await_leaders(admin, topic, partitions, timeout_s)
    log.info("created topic %s: %d partition(s)", topic, partitions)
    return DataTopic(topic, partitions, created=True)


def _await_leaders(admin: Any, topic: str, partitions: int, timeout_s: float) -> None:
    """A new topic's partitions take writes once they have leaders: the next task writes at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(topic, timeout=timeout_s).topics[topic]
        if md.error is None and len(md.partitions) == partitions and all(p.leader >= 0 for p in md.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(f"topic {topic!r} was created, but has no leader after {timeout_s:g} s")
        time.sleep(0.1)


__all__ = ["DataTopic", "create_topic_if_missing"]
