"""Kafka2PCRecoveryTrigger: the recovery sensor's wait, run by the triggerer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from airflow.triggers.base import TriggerEvent

from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.triggers.exporter_trigger import ExporterTrigger

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.records import Lease


def waiting_message(prefix: str, holder: Lease) -> str:
    return (
        f"waiting: exporter {prefix!r} uses POOLING transactional ids, and DAG run {holder.run_id} of "
        f"{holder.dag_id} (queued first, still live) is using them; runs of one exporter take turns, "
        "backfills included"
    )


class Kafka2PCRecoveryTrigger(ExporterTrigger):
    """Resolve the prefix's open transactions until none is left, then fire."""

    def __init__(
        self,
        transactional_id_prefix: str,
        run: str,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        poke_interval: float = 5.0,
        turn: tuple[str, str] | list[str] | None = None,
        run_key: str | None = None,
        spare_own_loss: bool = False,
    ) -> None:
        self.turn = tuple(turn) if turn else None  # (dag_id, run_id): a POOLING run waits its turn
        super().__init__(
            kafka2pc_conn_id,
            transactional_id_prefix=transactional_id_prefix,
            run=run,
            poke_interval=poke_interval,
            turn=list(self.turn) if self.turn else None,
            run_key=run_key,
            spare_own_loss=spare_own_loss,
        )
        self.spare_own_loss = spare_own_loss
        self.run_key = run_key
        self.transactional_id_prefix = transactional_id_prefix
        self.run_name = run
        self.poke_interval = poke_interval

    async def run(self) -> AsyncIterator[TriggerEvent]:
        passes = 0
        try:
            hook = await self.hook()
            while True:
                passes += 1
                if self.turn is not None:
                    holder = await asyncio.to_thread(hook.take_turn, self.transactional_id_prefix, *self.turn)
                    if holder is not None:
                        self.log.info(waiting_message(self.transactional_id_prefix, holder))
                        await asyncio.sleep(self.poke_interval)
                        continue
                result = await asyncio.to_thread(
                    hook.recover, self.transactional_id_prefix, self.run_name, self.run_key, self.spare_own_loss
                )
                self.log.info("recovery of %s, pass %d: %s", self.transactional_id_prefix, passes, result.describe())
                if result.done:
                    yield TriggerEvent(
                        {
                            "status": "success",
                            "prefix": self.transactional_id_prefix,
                            "passes": passes,
                            "summary": result.describe(),
                        }
                    )
                    return
                await asyncio.sleep(self.poke_interval)
        except Exception as e:  # handed to the task, which fails with the message
            yield TriggerEvent(
                {
                    "status": "error",
                    "prefix": self.transactional_id_prefix,
                    "passes": passes,
                    "message": f"{type(e).__name__}: {e}",
                    "error": type(e).__name__,  # the task's last line names the next step by it
                }
            )
