"""Kafka2PCCreateTopicOperator: the explicit step that makes an export's topic on a fresh cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook

if TYPE_CHECKING:
    from airflow.sdk import Context


class Kafka2PCCreateTopicOperator(BaseOperator):
    """Create ``topic`` unless it exists; an existing topic is left exactly as it is.

    The export never creates data topics (a mistyped ``topic=`` fails instead of exporting into a
    new topic): put this task before the export group where a fresh cluster must get the topic. It
    needs Create on the topic only when the topic is missing (docs/acls.md).

    :param topic: the topic's name.
    :param partitions: its partitions, when it is created.
    :param replication_factor: its replication factor when created; None takes the broker's
        ``default.replication.factor``.
    :param topic_config: topic settings when created (``retention.ms``...).
    :returns: (XCom) the topic, its partitions, and whether this task created it.
    """

    template_fields: Sequence[str] = ("topic",)

    def __init__(
        self,
        *,
        topic: str,
        partitions: int,
        replication_factor: int | None = None,
        topic_config: Mapping[str, str] | None = None,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.topic_config = dict(topic_config or {})
        self.kafka2pc_conn_id = kafka2pc_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_kafka2pc.txn.kafka.data_topic import create_topic_if_missing

        hook = Kafka2PCHook(self.kafka2pc_conn_id)
        hook.check_connection()
        made = create_topic_if_missing(
            hook.get_config(), self.topic, self.partitions, self.replication_factor, self.topic_config
        )
        self.log.info("kafka2pc: %s", made.describe())
        return {"topic": made.name, "partitions": made.partitions, "created": made.created}
