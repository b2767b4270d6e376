"""Phase two: Kafka2PCCommitOperator decides the run and commits it (the abort is ``operators/abort.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, TriggerRule
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_kafka2pc.dag_run import decision_run
from airflow_provider_kafka2pc.exceptions import ConnectionMismatchError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.failure_lines import commit_failure_line
from airflow_provider_kafka2pc.operators.lineage import topics_lineage
from airflow_provider_kafka2pc.operators.payload import SKIPPED_KEY, ExportPayload
from airflow_provider_kafka2pc.operators.phase_two import PhaseTwoOperator, members_of
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.protocol.repair_announcement import topic_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kafka2pc.txn.protocol.committable import Committable
    from airflow_provider_kafka2pc.txn.protocol.records import RunRecord
    from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
    from airflow_provider_kafka2pc.txn.two_phase.commit_progress import CommitProgress
    from airflow_provider_kafka2pc.txn.two_phase.ruling import CommitReport
    from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard


# The alias the commit reports its topics' assets through (a topic is only known at run time).
KAFKA2PC_ASSET_ALIAS = "kafka2pc"


def topic_asset(bootstrap_servers: str, topic: str) -> Asset:
    """A topic as an asset: ``kafka://{first bootstrap server}/{topic}``."""
    return Asset(topic_uri(bootstrap_servers, topic))


class Kafka2PCCommitOperator(PhaseTwoOperator):
    """Commit the transactions prepared by one or more export tasks of this DAG run, as one decision.

    Checks that every committable is one of its exporter's ids for this run, appends ONE COMMIT
    decision for the whole run and reads the log back before the first EndTxn (the first decision
    wins: an earlier ABORT aborts the whole run and fails with ``DecisionConflictError``), commits
    in parallel, classifies every outcome by the broker's own state (DESIGN §5), records outcomes
    and collapses the run into its run record. Idempotent: a retry, or a clear of this task,
    finishes what is left, and a clear of a finished run answers from its run record. A
    transaction that can no longer commit fails the task with ``TransactionLostError``; if nothing
    was decided yet, the whole run is aborted first, so no part of it becomes visible.

    Once every transaction of the run ended committed, it emits an asset event for each topic it
    made visible (``topic_asset``: ``kafka://{bootstrap}/{topic}``, extra: run, records,
    transactions) through the asset alias ``asset_alias``; a topic asset the user declared among
    ``outlets`` gets the same extra instead. Schedule downstream DAGs on those assets.

    :param export_task_ids: the export task(s) whose committables to commit.
    :param asset_alias: the alias the topic assets are emitted through; None emits none.
    :param commit_headroom_ms: refuse to start (and abort the run whole) when a transaction has less
        than this before its broker deadline; derived from the timeout and the run's size when None
        (``txn.protocol.window.commit_headroom_ms``).
    """

    def __init__(
        self,
        *,
        asset_alias: str | None = KAFKA2PC_ASSET_ALIAS,
        commit_headroom_ms: int | None = None,
        trigger_rule: str = TriggerRule.NONE_FAILED,
        **kwargs: Any,
    ) -> None:
        outlets = kwargs.pop("outlets", None)
        outlets = [] if outlets is None else list(outlets) if isinstance(outlets, list | tuple) else [outlets]
        if asset_alias is not None:
            outlets.append(AssetAlias(asset_alias))
        # none_failed: an export that skipped itself because the run already reached its decision (a
        # cleared run) leaves the commit to answer from the decision log, green, not skipped with it.
        super().__init__(outlets=outlets, trigger_rule=trigger_rule, **kwargs)
        self.asset_alias = asset_alias
        self.commit_headroom_ms = commit_headroom_ms
        self._visible: tuple[str, tuple[str, ...]] | None = None  # (bootstrap, topics) once committed
        self._repairs: list[dict[str, Any]] = []  # the repairs whose records this task made visible, for lineage

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

        try:
            payloads = self.payloads(context)
        except (MalformedCommittableError, ConnectionMismatchError) as e:
            self.log.error(
                "kafka2pc: run %s: no decision was written: the exports' XCom was refused (%s). Next: check the "
                "export tasks' XCom, then clear the whole DAG run; what the run left open is ended by its abort "
                "task or the exporter's next recovery, at the latest at its broker deadline.",
                decision_run(context),
                type(e).__name__,
            )
            raise
        self._skip_unless_only_finished_exports_skipped(context, payloads)
        present = [p for p in payloads.values() if p is not None]
        committables = [c for p in present for c in p.committables]
        if not committables:
            skipped = self._skipped_exports(context, payloads)
            finished = sorted({str(v["prefix"]) for v in skipped if v.get("prefix")})
            if finished:
                # The prefixes whose export repaired the run in this clear: its records became visible now.
                repaired_now = {str(v["prefix"]) for v in skipped if v.get("repaired_now")}
                return self._answer_finished(context, finished, repaired_now)
            self.log.info("nothing to commit: the exports of this run prepared no transactions")
            return {"committed": 0, "records": 0}
        from airflow_provider_kafka2pc.txn.two_phase.commit_progress import CommitProgress

        hook = Kafka2PCHook(self.kafka2pc_conn_id)
        run = decision_run(context)
        progress = CommitProgress.of(run, [p.prefix for p in present], committables, [p.summary for p in present])
        progress.first_try = int(getattr(context["ti"], "try_number", 0) or 0) <= 1
        try:
            guard = self._offsets_guard(hook, present)
            sources = {p.prefix: p.source for p in present if p.source is not None and p.offsets_committable()}
            members = [members_of(p, context) for p in present]
            report = self.resolve(committables, members, hook, run, progress, guard, sources)
        except Exception as e:
            # Last, so that it is the line a user reads first: the run's state and what to click.
            self.log.error("kafka2pc: %s", commit_failure_line(progress, e))
            raise
        if not report.note:  # a finished run (a clear) said so first, in the core's own line
            self._log_window(present, run)
        if report.committed:
            self._end_other_attempts(hook, present, run)
        counts = self.counts(report)
        counts["records"] = sum(c.records for c in committables)
        if report.committed:
            bootstrap = str(hook.get_config()["bootstrap.servers"])
            self._visible = (bootstrap, tuple(sorted({t for c in committables for t in c.counts_by_topic})))
            self.emit_asset_events(context, committables, bootstrap)
        return counts

    def _end_other_attempts(self, hook: Kafka2PCHook, payloads: Sequence[ExportPayload], run: str) -> None:
        """A handed-off run: abort, now, what the application's other driver attempts left open (each
        wrote ids of its own: one still running, or killed, holds read_committed readers back until
        its broker deadline). One recovery pass over the run's ids; the COMMIT covers the accepted
        attempt's. Then the run's handoff records are retired. A failure leaves them to the next
        recovery and the deadline, never fails the run."""
        for p in payloads:
            if p.attempt_tag is None:
                continue
            try:
                result = hook.recover(p.prefix, run, p.run_key)
            except Exception as e:
                self.log.warning(
                    "kafka2pc: run %s is committed; other attempts' open transactions of exporter %s are left to the "
                    "next recovery or their broker deadline: %s",
                    run,
                    p.prefix,
                    e,
                )
                continue
            if result.plan.abort:
                self.log.info(
                    "kafka2pc: aborted %d transaction(s) that other attempts of run %s left open",
                    len(result.plan.abort),
                    run,
                )
            try:
                hook.retire_handoffs(p.prefix, run)
            except Exception as e:  # the records are inert once the run is decided: only space
                self.log.info("kafka2pc: run %s's handoff records stay in the decision topic: %s", run, e)

    def _skip_unless_only_finished_exports_skipped(
        self, context: Context, payloads: Mapping[str, ExportPayload | None]
    ) -> None:
        """``none_failed`` lets the commit run after a skipped upstream, for one reason only: an export
        that skipped itself because the run already reached its decision. Any other skip (a gate's
        veto, a branch not taken, a short circuit) still stops the commit, as ``all_success`` did."""
        ti = context["ti"]
        finished = {t for t, p in payloads.items() if p is None and ti.xcom_pull(task_ids=t, key=SKIPPED_KEY)}
        unexplained = [t for t, p in payloads.items() if p is None and t not in finished]
        others = sorted(set(self.upstream_task_ids) - set(payloads))
        if others:
            try:
                states = ti.get_task_states(dag_id=self.dag_id, task_ids=others, run_ids=[context["run_id"]])
                of_run = dict(states.get(context["run_id"]) or {})
            except Exception as e:  # unknown: a commit must not run past a gate it cannot see
                raise AirflowSkipException(f"cannot read the states of upstream tasks {others}: {e}") from e
            unexplained += [t for t in others if str(getattr(of_run.get(t), "value", of_run.get(t))) == "skipped"]
        if unexplained:
            raise AirflowSkipException(
                f"upstream task(s) {sorted(unexplained)} were skipped (a gate, a branch not taken, or an export "
                "with nothing to do): nothing is committed. The exports' transactions stay prepared until the "
                "exporter's next recovery ends them, or at the latest their broker deadline."
            )

    def _skipped_exports(
        self, context: Context, payloads: Mapping[str, ExportPayload | None]
    ) -> list[Mapping[str, Any]]:
        """What the exports that pushed no committables said instead: each skipped itself because the
        run already reached its decision (a cleared run), or repaired the run; their state is in the
        decision log, not in an XCom."""
        ti = context["ti"]
        skipped = [ti.xcom_pull(task_ids=t, key=SKIPPED_KEY) for t, p in payloads.items() if p is None]
        return [v for v in skipped if isinstance(v, Mapping)]

    def _answer_finished(
        self,
        context: Context,
        prefixes: Sequence[str],
        repaired_now: frozenset[str] | set[str] = frozenset(),
    ) -> dict[str, Any]:
        """A clear of a finished run: green, with its records' answer first ("already committed: …");
        a LOST one fails loudly. Writes nothing; emits asset events only for a run its export has just
        repaired (the restored records became visible now), saying so."""
        from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import answer_from_run_records

        run = decision_run(context)
        decision_log = Kafka2PCHook(self.kafka2pc_conn_id).decision_log()
        try:
            records = [rec for p in prefixes if (rec := decision_log.read_for(p, run).run_status(p, run)) is not None]
        finally:
            decision_log.close()
        final = [r for r in records if r.status is not RunStatus.DECIDED]
        if len(final) != len(prefixes):  # the exports skip only for final records: a race with a commit
            unfinished = sorted(set(prefixes) - {r.prefix for r in final})
            raise Kafka2PCError(
                f"run {run} is decided but not finished for exporter(s) {unfinished}: its COMMIT is in force and "
                "EndTxns are missing. Next: clear the whole DAG run: its recovery task rolls the run forward, and "
                "this task then answers from the run's record"
            )
        report = answer_from_run_records(run, final)
        repaired = [r for r in final if r.prefix in repaired_now and r.status is RunStatus.REPAIRED]
        if repaired:
            bootstrap = str(Kafka2PCHook(self.kafka2pc_conn_id).get_config()["bootstrap.servers"])
            for rec in repaired:
                self._emit_repaired(context, rec, bootstrap)
        return {"committed": 0, "records": 0, "already": report.note}

    def _log_window(self, payloads: Sequence[ExportPayload], run: str) -> None:
        """The run's window, first record to last EndTxn: what read_committed readers of its partitions
        waited for (the exports report their first record's time)."""
        import time

        firsts = [int(f) for p in payloads if (f := p.summary.get("first_write_ms"))]
        if not firsts:
            return
        now = int(time.time() * 1000)
        self.log.info(
            "window of run %s: first record %s, last EndTxn %s: %.1f s (writing %s s)",
            run,
            time.strftime("%H:%M:%S", time.gmtime(min(firsts) / 1000)),
            time.strftime("%H:%M:%S", time.gmtime(now / 1000)),
            (now - min(firsts)) / 1000,
            " + ".join(str(p.summary.get("write_s", "?")) for p in payloads),
        )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage outputs: the topics this commit made visible (none unless it committed)."""
        if self._visible is None:
            return topics_lineage("", ())
        return topics_lineage(*self._visible, repairs=self._repairs)

    def emit_asset_events(self, context: Context, committables: Sequence[Committable], bootstrap: str) -> None:
        """One event per topic the run made visible; Airflow records them when this task succeeds."""
        records: dict[str, int] = {}
        transactions: dict[str, int] = {}
        for c in committables:
            for topic, n in c.counts_by_topic.items():
                records[topic] = records.get(topic, 0) + n
                transactions[topic] = transactions.get(topic, 0) + 1
        self._emit(context, bootstrap, records, transactions, {})

    def _emit_repaired(self, context: Context, rec: RunRecord, bootstrap: str) -> None:
        """The events of a run repaired in this clear (``txn/protocol/repair_announcement.py``): per
        topic the records its repair restored, and the repair; once per topic, whatever clears
        follow (``kafka2pc repair`` may have announced some topics already)."""
        from airflow_provider_kafka2pc.txn.protocol.repair_announcement import (
            lineage_repair,
            repaired_extra,
            restored_by_topic,
        )

        extra, restored = repaired_extra(rec), restored_by_topic(rec)
        before = self._announced(bootstrap, restored, rec)
        shares = {t: share for t, share in restored.items() if t not in before}
        if before:
            self.log.info(
                "run %s of exporter %s: its repair (decision %s) was announced before for topic(s) %s: no asset "
                "event for them again%s",
                rec.run,
                rec.prefix,
                extra["decision"],
                ", ".join(sorted(before)),
                "" if shares else ", and no lineage facet",
            )
        if not shares:
            return
        records = {topic: share.records for topic, share in shares.items()}
        transactions = {topic: share.transactions for topic, share in shares.items()}
        self._emit(context, bootstrap, records, transactions, {"repaired": extra})
        self._repairs.append(lineage_repair(rec))
        # Lineage names the topics the repair made visible, as for a commit.
        self._visible = (bootstrap, tuple(sorted({*(self._visible[1] if self._visible else ()), *records})))

    def _announced(self, bootstrap: str, topics: Iterable[str], rec: RunRecord) -> set[str]:
        """The topics whose asset events carry ``rec``'s repair already: a clear of this task alone
        finds the export's XCom of its repair again."""
        from airflow_provider_kafka2pc.operators.asset_history import announced_repairs

        assert rec.repair is not None
        found: set[str] = set()
        for topic in topics:
            try:
                if rec.repair.decision_id in announced_repairs(topic_asset(bootstrap, topic), rec.repair.at_ms):
                    found.add(topic)
            except Exception as e:  # cannot ask: an event twice is better than none
                self.log.warning("cannot read the asset events of topic %s (%s): announcing the repair", topic, e)
        return found

    def _emit(
        self,
        context: Context,
        bootstrap: str,
        records: Mapping[str, int],
        transactions: Mapping[str, int],
        more: Mapping[str, Any],
    ) -> None:
        declared = {o.uri for o in self.outlets if isinstance(o, Asset)}
        events = context["outlet_events"]
        for topic in sorted(records):
            asset = topic_asset(bootstrap, topic)
            extra: dict[str, Any] = {
                "run": decision_run(context),
                "records": records[topic],
                "transactions": transactions[topic],
                **more,
            }
            if asset.uri in declared:
                events[asset].extra.update(extra)
            elif self.asset_alias is not None:
                events[AssetAlias(self.asset_alias)].add(asset, extra=extra)
            else:
                continue
            self.log.info(
                "asset event for %s: run %s, %d records in %d transaction(s)",
                asset.uri,
                extra["run"],
                records[topic],
                transactions[topic],
            )

    @staticmethod
    def _offsets_guard(hook: Kafka2PCHook, payloads: Sequence[ExportPayload]) -> SourceGuard | None:
        """For exports with a Kafka source: their groups did not move, and move with the output."""
        from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard

        sources = [(p.source, c) for p in payloads if p.source is not None and (c := p.offsets_committable())]
        return SourceGuard(hook.get_config(), sources) if sources else None

    def resolve(
        self,
        committables: Sequence[Committable],
        prefixes: Sequence[str | naming.Members],
        hook: Kafka2PCHook,
        run: str,
        progress: CommitProgress | None = None,
        guard: SourceGuard | None = None,
        sources: Mapping[str, SourceRange] | None = None,
    ) -> CommitReport:
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

        wire, decision_log = hook.wire_client(), hook.decision_log()
        try:
            return commit_prepared(
                committables,
                wire,
                decision_log,
                run,
                max_workers=self.max_workers,
                prefixes=prefixes,
                headroom_ms=self.commit_headroom_ms,
                progress=progress,
                guard=guard,
                sources=sources,
            )
        finally:
            decision_log.close()
            wire.close()


# The abort operator was in this module in 0.1.0: DAGs that import it from here keep working.
from airflow_provider_kafka2pc.operators.abort import Kafka2PCAbortOperator  # noqa: E402

__all__ = ["KAFKA2PC_ASSET_ALIAS", "Kafka2PCAbortOperator", "Kafka2PCCommitOperator", "topic_asset"]
