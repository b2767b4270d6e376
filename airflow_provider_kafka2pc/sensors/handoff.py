"""Kafka2PCHandoffSensor: the prepare of a run whose Spark application runs outside the task."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.exceptions import HandoffWaitError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.decided_run import skip_or_fail
from airflow_provider_kafka2pc.operators.payload import ExportPayload
from airflow_provider_kafka2pc.triggers.handoff import Kafka2PCHandoffTrigger
from airflow_provider_kafka2pc.txn.protocol import naming

if TYPE_CHECKING:
    from airflow.sdk import Context


class Kafka2PCHandoffSensor(BaseSensorOperator):
    """Wait for this DAG run's Spark application to hand off its prepared transactions, check them
    against the broker, and push them as an export task's XCom.

    The application calls ``airflow_provider_kafka2pc.spark.application.export_from_application``
    with this DAG's id and run id (templated into its arguments by the task that submits it:
    ``SparkSubmitOperator``, ``SparkKubernetesOperator``, a Databricks or EMR job). Put this sensor
    where the export task would be, downstream of the submit task (``submit >> handoff``: a driver
    restarted while the submit waits is then over before anything is accepted): the commit and
    abort take it as their ``export_task_ids``. It accepts the first driver attempt to hand off
    whose transactions the broker still holds open at their producer epochs (each attempt writes
    ids of its own; the commit aborts what the others left open); a
    handoff that names another exporter or run, or that cannot be read, fails the task by name
    (nothing is committed; the abort task ends what is open). A run that never hands off fails at
    ``timeout``, and its abort task ends whatever the application left open. A run already decided
    (a clear) skips, as the export task does.
    """

    template_fields: Sequence[str] = ("transactional_id_prefix",)
    ui_color = "#e1ecfd"

    def __init__(
        self,
        *,
        transactional_id_prefix: str,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        naming_strategy: str | naming.NamingStrategy = naming.NamingStrategy.INCREMENTING,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 5.0,
        timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.transactional_id_prefix = transactional_id_prefix
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self.naming_strategy = naming.NamingStrategy(str(naming_strategy).upper())
        if self.naming_strategy is not naming.NamingStrategy.INCREMENTING:
            raise ValueError(
                f"{self.task_id}: naming_strategy must be INCREMENTING: a submitted application writes new ids every "
                "run (export_from_application refuses POOLING)"
            )
        self.deferrable = deferrable

    def run_key(self, context: Context) -> str | None:
        if self.naming_strategy is naming.NamingStrategy.INCREMENTING:
            return naming.sanitize_run_key(context["run_id"])
        return None

    def poke(self, context: Context) -> bool | PokeReturnValue:
        prefix, run = naming.validate_prefix(self.transactional_id_prefix), decision_run(context)
        found = Kafka2PCHook(self.kafka2pc_conn_id).accept_handoff(
            prefix, run, self.naming_strategy, self.run_key(context)
        )
        if found.decided is not None:
            skip_or_fail(context, prefix, run, found.decided, self.log)
        if found.handoff is None:
            self.log.info("kafka2pc: %s", found.waiting)
            return False
        h = found.handoff
        if found.stale:
            self.log.warning("kafka2pc: ignored attempt(s) %s: their transactions were fenced or ended", found.stale)
        self.log.info(
            "kafka2pc: accepted attempt %s of run %s: %d transaction(s), %d records, open on the broker",
            h.attempt,
            run,
            len(h.committables),
            h.records,
        )
        payload = ExportPayload(
            conn_id=self.kafka2pc_conn_id,
            prefix=prefix,
            naming_strategy=self.naming_strategy.value,
            run_key=h.run_key,
            delivery_guarantee="EXACTLY_ONCE",
            committables=h.committables,
            summary={**h.summary, "attempt": h.attempt},
            attempt_tag=h.attempt_tag,
        )
        return PokeReturnValue(is_done=True, xcom_value=payload.to_xcom())

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=Kafka2PCHandoffTrigger(
                transactional_id_prefix=self.transactional_id_prefix,
                run=decision_run(context),
                naming_strategy=self.naming_strategy.value,
                run_key=self.run_key(context),
                kafka2pc_conn_id=self.kafka2pc_conn_id,
                poke_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if event.get("status") != "ready":
            raise HandoffWaitError(
                f"waiting for the handoff of {self.transactional_id_prefix} failed: {event.get('message', event)}"
            )
        found = self.poke(context)  # again, in the task: the committables are pushed from here
        if isinstance(found, PokeReturnValue) and found.is_done:
            return found.xcom_value
        self.execute(context)  # the attempt was fenced between the trigger's look and this one: wait again
        return None
