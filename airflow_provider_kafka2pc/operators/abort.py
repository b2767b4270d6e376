"""Phase two after a failure: Kafka2PCAbortOperator rolls a failed run back."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import TriggerRule
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.idempotent_retries import idempotent_retries
from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY
from airflow_provider_kafka2pc.operators.phase_two import PhaseTwoOperator, task_ids_of
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef


class Kafka2PCAbortOperator(PhaseTwoOperator):
    """Roll back a failed run: its prepared committables and the open transactions of its exporters.

    Runs once EVERY export that feeds it has finished (``trigger_rule="all_done"``) and skips
    itself unless one of them failed: an abort that fired on the first failure would miss what a
    still-running export prepares afterwards. ABORT is appended to the decision log and read back
    before any EndTxn; a transaction whose first decision is COMMIT is rolled forward, never
    aborted, and that is logged.

    :param export_task_ids: the export task(s) of the run.
    :param transactional_id_prefixes: the exporters' prefixes, to find transactions of a prepare
        that failed before it could push its committables (default: none).
    :param naming_strategy: their naming strategy; with INCREMENTING only this run's ids are aborted.
    :param retries: default 2, ``retry_delay`` 5 s (``operators/idempotent_retries.py``): a try whose
        worker host died, even one that would have skipped itself, must not fail a committed run.
    """

    template_fields: Sequence[str] = ("export_task_ids", "transactional_id_prefixes")

    def __init__(
        self,
        *,
        transactional_id_prefixes: str | Sequence[str] = (),
        naming_strategy: str | naming.NamingStrategy = naming.NamingStrategy.POOLING,
        trigger_rule: str = TriggerRule.ALL_DONE,
        retries: int | None = None,
        retry_delay: timedelta | float | None = None,
        **kwargs: Any,
    ) -> None:
        # Named here so that Airflow fills them from default_args before this default applies.
        super().__init__(trigger_rule=trigger_rule, **idempotent_retries(retries, retry_delay), **kwargs)
        self.transactional_id_prefixes = transactional_id_prefixes
        self.naming_strategy = naming.NamingStrategy(str(naming_strategy).upper())

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared
        from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of

        payloads = self.payloads(context)
        ti = context["ti"]
        failed = [t for t, p in payloads.items() if p is None and ti.xcom_pull(task_ids=t, key=SKIPPED_KEY) is None]
        if not failed:
            raise AirflowSkipException("every export of this run succeeded or was skipped: nothing to abort")
        # A handoff sensor stands in for a prepare that runs elsewhere: a submitted application may
        # have opened transactions whether or not the sensor ever ran.
        never_ran = {t: v for t, v in self._never_ran(context, failed).items() if not self._prepares_elsewhere(t)}
        if len(never_ran) == len(failed) and all(p is None for p in payloads.values()):
            # No prepare of this run started: it opened nothing, so there is nothing of it to end.
            raise AirflowSkipException(
                f"nothing to abort: export task(s) {sorted(never_ran)} never ran ({_states(never_ran)}), so this run "
                "prepared nothing; what an earlier run left open is ended by the exporter's next recovery"
            )
        ran = [t for t in failed if t not in never_ran]
        why = [f"export task(s) {ran} failed"] if ran else []
        if never_ran:
            why.append(f"export task(s) {sorted(never_ran)} never ran ({_states(never_ran)})")
        self.log.info("%s: aborting the run", ", ".join(why))
        hook = Kafka2PCHook(self.kafka2pc_conn_id)
        refs: dict[str, TxnRef] = {}
        for p in payloads.values():
            if p is not None:
                refs.update((c.transactional_id, ref_of(c)) for c in p.committables)
        try:  # a bounded first contact: an unreachable broker is one line, within the connect timeout
            wire = hook.wire_client()
        except BrokerUnavailableError as e:
            raise BrokerUnavailableError(
                f"abort of run {decision_run(context)}: {e}. Nothing was aborted: clear this task once Kafka is "
                "back; otherwise what this run left open ends at its broker deadline at the latest"
            ) from None
        decision_log = hook.decision_log()
        try:
            run_key = (
                naming.sanitize_run_key(context["run_id"])
                if self.naming_strategy is naming.NamingStrategy.INCREMENTING
                else None
            )
            prefixes = task_ids_of(self.transactional_id_prefixes)
            for prefix in prefixes:
                if run_key is None and (holder := hook.take_turn(prefix, self.dag_id, context["run_id"])) is not None:
                    # Another run holds the POOLING ids: what is open under them is its, not ours.
                    self.log.warning("not aborting open transactions of %s: run %s holds it", prefix, holder.run_id)
                    continue
                for s in TransactionInspector(wire).describe_prefix(prefix):
                    parsed = naming.parse_transactional_id(s.transactional_id)
                    if run_key is not None and (parsed is None or parsed.run_key != run_key):
                        continue  # another run's transaction: INCREMENTING runs may overlap
                    # The broker's current holder of the id: newer than any committable of it.
                    refs[s.transactional_id] = ref_of(s)
            if not refs:
                self.log.info("nothing to abort")
                return {"committed": 0, "aborted": 0, "lost": 0}
            exporters = sorted({p.prefix for p in payloads.values() if p is not None} | set(prefixes))
            try:
                report = abort_prepared(
                    list(refs.values()), wire, decision_log, decision_run(context), self.max_workers, prefixes=exporters
                )
            except Exception as e:
                # Last, so that it is the line a user reads first: the run's state and what to click.
                shows = " or ".join(f"`kafka2pc list --prefix {p}`" for p in exporters)
                self.log.error(
                    "kafka2pc: abort of run %s failed (%s): %d transaction(s) may still be open; none of the run is "
                    "visible unless a COMMIT decision rules it. Next: clear this abort task once Kafka answers; "
                    "otherwise they end at their broker deadline at the latest%s",
                    decision_run(context),
                    type(e).__name__,
                    len(refs),
                    f" ({shows} shows them)" if shows else "",
                )
                raise
        finally:
            decision_log.close()
            wire.close()
        if any(self._prepares_elsewhere(t) for t in failed):
            for prefix in exporters:
                try:
                    hook.retire_handoffs(prefix, decision_run(context))
                except Exception as e:  # inert once the run is aborted: only space
                    self.log.info("kafka2pc: the handoff records of %s stay in the decision topic: %s", prefix, e)
        return self.counts(report)

    def _prepares_elsewhere(self, task_id: str) -> bool:
        from airflow_provider_kafka2pc.sensors.handoff import Kafka2PCHandoffSensor

        dag = getattr(self, "dag", None)
        task = dag.task_dict.get(task_id) if dag is not None else None
        return isinstance(task, Kafka2PCHandoffSensor)

    def _never_ran(self, context: Context, task_ids: Sequence[str]) -> dict[str, str]:
        """Which of ``task_ids`` never ran in this DAG run (upstream_failed, skipped, removed), with
        their states, as the scheduler says (Task SDK ``get_task_states``); empty when it cannot say."""
        try:
            states = context["ti"].get_task_states(
                dag_id=self.dag_id, task_ids=list(task_ids), run_ids=[context["run_id"]]
            )
            of_run = dict(states.get(context["run_id"]) or {})
        except Exception as e:  # unknown: treat them as failed, as before (abort what is there)
            self.log.debug("cannot read the export tasks' states: %s", e)
            return {}
        named = {t: str(getattr(of_run.get(t), "value", of_run.get(t))) for t in task_ids}
        return {t: state for t, state in named.items() if state in NEVER_RAN_STATES}


# An export task in one of these states did not run in this DAG run: it prepared nothing.
NEVER_RAN_STATES = frozenset({"upstream_failed", "skipped", "removed"})


def _states(tasks: dict[str, str]) -> str:
    return ", ".join(sorted(set(tasks.values())))
