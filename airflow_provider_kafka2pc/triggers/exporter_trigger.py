"""ExporterTrigger: what the kafka2pc triggers share, waiting on one exporter's state in Kafka."""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import BaseTrigger

from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook


class ExporterTrigger(BaseTrigger):
    """A trigger of one exporter. It carries names only (``serialize``): the connection, and its
    secrets, is looked up again where the trigger runs (``hook``). Each look at Kafka uses blocking
    clients, so subclasses run it in a worker thread: the triggerer's event loop, shared with every
    other trigger, never waits on Kafka."""

    def __init__(self, kafka2pc_conn_id: str, **names: Any) -> None:
        super().__init__()
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self._names = {**names, "kafka2pc_conn_id": kafka2pc_conn_id}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self._names)

    async def hook(self) -> Kafka2PCHook:
        conn = await Kafka2PCHook.aget_connection(self.kafka2pc_conn_id)
        return Kafka2PCHook(self.kafka2pc_conn_id, connection=conn)
