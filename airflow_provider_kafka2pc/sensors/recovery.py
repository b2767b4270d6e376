"""Kafka2PCRecoverySensor: before a new prepare, resolve whatever an earlier run left open."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, conf

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.exceptions import RecoveryError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.failure_lines import recovery_failure_line
from airflow_provider_kafka2pc.operators.idempotent_retries import idempotent_retries
from airflow_provider_kafka2pc.triggers.recovery import Kafka2PCRecoveryTrigger, waiting_message
from airflow_provider_kafka2pc.txn.protocol import naming

if TYPE_CHECKING:
    from airflow.sdk import Context


# What the user fixes in the connection (or its ACLs), by class name: the deferred path has only the name.


class Kafka2PCRecoverySensor(BaseSensorOperator):
    """Wait until no transaction of the exporter is open, resolving each one by the decision log.

    For every open transaction of ``transactional_id_prefix``: a COMMIT decision for the same
    (transactional id, producer id, epoch) commits it (a commit task died after deciding);
    anything else is aborted (a prepare or a commit died before deciding). Transactions the
    broker is still completing are polled again. Deferrable (default: ``[operators]
    default_deferrable``) or poking. ``retries`` and ``retry_delay`` default to 2 and 5 s (given
    ones, ``default_args`` included, win): see ``operators/idempotent_retries.py``.
    """

    template_fields: Sequence[str] = ("transactional_id_prefix",)
    ui_color = "#e1ecfd"

    def __init__(
        self,
        *,
        transactional_id_prefix: str,
        kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
        naming_strategy: str | naming.NamingStrategy = naming.NamingStrategy.POOLING,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 5.0,
        retries: int | None = None,
        retry_delay: timedelta | float | None = None,
        repair_lost: bool = True,
        **kwargs: Any,
    ) -> None:
        # Named here so that Airflow fills them from default_args before this default applies.
        super().__init__(
            poke_interval=poke_interval,
            **idempotent_retries(retries, retry_delay),
            **kwargs,
        )
        self.transactional_id_prefix = transactional_id_prefix
        self.kafka2pc_conn_id = kafka2pc_conn_id
        self.naming_strategy = naming.NamingStrategy(str(naming_strategy).upper())
        self.deferrable = deferrable
        self.repair_lost = repair_lost

    def failure_line(self, error: BaseException, cause: str = "") -> str:
        """What a failed recovery leaves and the next click (``operators/failure_lines.py``)."""
        return recovery_failure_line(self.transactional_id_prefix, self.kafka2pc_conn_id, error, cause)

    def run_key(self, context: Context) -> str | None:
        """INCREMENTING runs may overlap: recovery aborts only this run's undecided leftovers."""
        if self.naming_strategy is naming.NamingStrategy.INCREMENTING:
            return naming.sanitize_run_key(context["run_id"])
        return None

    @property
    def takes_turns(self) -> bool:
        return self.naming_strategy is naming.NamingStrategy.POOLING

    def poke(self, context: Context) -> bool:
        naming.validate_prefix(self.transactional_id_prefix)
        hook = Kafka2PCHook(self.kafka2pc_conn_id)
        if self.takes_turns:
            holder = hook.take_turn(self.transactional_id_prefix, self.dag_id, context["run_id"])
            if holder is not None:
                self.log.info(waiting_message(self.transactional_id_prefix, holder))
                return False
        result = hook.recover(
            self.transactional_id_prefix, decision_run(context), self.run_key(context), self.repair_lost
        )
        self.log.info("recovery of %s: %s", self.transactional_id_prefix, result.describe())
        return result.done

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            except Exception as e:
                # Last, so that it is the line a user reads first: the state and what to click.
                self.log.error("kafka2pc: %s", self.failure_line(e))
                raise
        # Every pass, the first included, runs in the triggerer: the worker slot is freed at once.
        self.defer(
            trigger=Kafka2PCRecoveryTrigger(
                transactional_id_prefix=self.transactional_id_prefix,
                run=decision_run(context),
                kafka2pc_conn_id=self.kafka2pc_conn_id,
                turn=(self.dag_id, context["run_id"]) if self.takes_turns else None,
                run_key=self.run_key(context),
                poke_interval=self.poke_interval,
                spare_own_loss=self.repair_lost,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        if event.get("status") != "success":
            error = RecoveryError(f"recovery of {self.transactional_id_prefix} failed: {event.get('message', event)}")
            self.log.error("kafka2pc: %s", self.failure_line(error, str(event.get("error") or "")))
            raise error
        self.log.info(
            "recovery of %s done after %s pass(es) in the triggerer: %s",
            self.transactional_id_prefix,
            event.get("passes"),
            event.get("summary"),
        )
