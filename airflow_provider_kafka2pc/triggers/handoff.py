"""Kafka2PCHandoffTrigger: the handoff sensor's wait, run by the triggerer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from airflow.triggers.base import TriggerEvent

from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.triggers.exporter_trigger import ExporterTrigger
from airflow_provider_kafka2pc.txn.protocol import naming


class Kafka2PCHandoffTrigger(ExporterTrigger):
    """Fire once the run's Spark application has handed off an attempt the broker holds open, or the
    run is already decided; the task then checks again and pushes the committables."""

    def __init__(
        self,
        transactional_id_prefix: str,
        run: str,
        naming_strategy: str,
        run_key: str | None,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        poke_interval: float = 5.0,
    ) -> None:
        super().__init__(
            kafka2pc_conn_id,
            transactional_id_prefix=transactional_id_prefix,
            run=run,
            naming_strategy=naming_strategy,
            run_key=run_key,
            poke_interval=poke_interval,
        )
        self.transactional_id_prefix = transactional_id_prefix
        self.run_name = run
        self.naming_strategy = naming_strategy
        self.run_key = run_key
        self.poke_interval = poke_interval

    async def run(self) -> AsyncIterator[TriggerEvent]:
        looks = 0
        try:
            hook = await self.hook()
            strategy = naming.NamingStrategy(self.naming_strategy)
            while True:
                looks += 1
                found = await asyncio.to_thread(
                    hook.accept_handoff, self.transactional_id_prefix, self.run_name, strategy, self.run_key
                )
                if found.handoff is not None or found.decided is not None:
                    yield TriggerEvent({"status": "ready", "looks": looks})
                    return
                self.log.info("handoff of %s, look %d: %s", self.transactional_id_prefix, looks, found.waiting)
                await asyncio.sleep(self.poke_interval)
        except Exception as e:  # handed to the task, which fails with the message
            yield TriggerEvent({"status": "error", "looks": looks, "message": f"{type(e).__name__}: {e}"})
