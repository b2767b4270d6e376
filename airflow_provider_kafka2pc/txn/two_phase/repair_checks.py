"""What a repair's re-export must prove before its COMMIT (DESIGN §6, steps 3 and 4).

``check_same``: every lost slot exported again, each new transaction with the records and the
digest its lost one held; else all are aborted and the refusal names each difference, and what
changed in the files the run read when it recorded them (``txn.protocol.source_files``).
``check_committable``: the commit's own checks (every new transaction open under its own producer,
with the commit's headroom before its broker deadline) and the topics each lost one wrote to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.decisions import slot_of
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, RepairRefusedError
from airflow_provider_kafka2pc.txn.protocol.outcome import Observation
from airflow_provider_kafka2pc.txn.protocol.record_digest import describe_difference
from airflow_provider_kafka2pc.txn.protocol.records import LostTxn, topics_of
from airflow_provider_kafka2pc.txn.protocol.source_files import Splits, explain_changes
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, check_current_producers
from airflow_provider_kafka2pc.txn.two_phase.doomed import commit_headroom, doomed_of
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan
from airflow_provider_kafka2pc.txn.two_phase.ruling import partitions_of, ref_of

log = logging.getLogger(__name__)


def check_same(
    plan: RepairPlan,
    committables: Sequence[Committable],
    wire: WireClient,
    decision_log: DecisionLog,
    actor: str,
    files_now: Callable[[], Splits | None] | None,
) -> None:
    """Every lost slot exported again, each with the records it lost: else nothing becomes visible."""
    expected = _lost_by_new_id(plan)
    got = {c.transactional_id: c for c in committables}
    problems = [f"{tid}: not exported again" for tid in sorted(set(expected) - set(got))]
    problems += [f"{tid}: not a transaction this repair asked for" for tid in sorted(set(got) - set(expected))]
    for tid, c in sorted(got.items()):
        lost = expected.get(tid)
        if lost is None:
            continue
        was = lost.covered
        if c.digest is None:
            problems.append(f"{was.transactional_id}: the re-export recorded no digest")
        elif (c.records, c.digest) != (was.records, was.digest):
            assert was.digest is not None  # plan_repair refused a lost transaction without one
            where = ", ".join(was.partitions) or "its partitions"
            problems.append(
                f"{was.transactional_id} (Spark partition {slot_of(tid)}, on {where}): "
                + describe_difference(was.digest, c.digest)
            )
    if not problems:
        return
    if committables:
        abort_prepared(committables, wire, decision_log, f"repair of {plan.run}", actor=actor)
    changes = explain_changes(_recorded_files(decision_log, plan), files_now and files_now(), plan.slots)
    why = (
        f"what changed in the files it read: {'; '.join(changes)}"
        if changes
        else "its data changed, or its partitioning did (another cluster size or parallelism splits files and "
        "coalesces shuffles differently: repair with the run's Spark settings), or its key and value formats did "
        "(a run exported with registry formats is framed again with the same formats and registry)"
    )
    raise RepairRefusedError(
        f"repair of run {plan.run} of exporter {plan.prefix} refused: the source no longer gives the records the "
        f"run lost, Spark partition by Spark partition ({'; '.join(problems)}): {why}. "
        f"Nothing of the repair is visible: its {len(committables)} transaction(s) "
        f"were aborted, and the run stays LOST. Restore the source to what run {plan.run} read and repair again, "
        f"or acknowledge the loss (`kafka2pc acknowledge --prefix {plan.prefix} --run {plan.run}`)"
    )


def _recorded_files(decision_log: DecisionLog, plan: RepairPlan) -> Splits | None:
    """The files the run recorded it read; None when it recorded none or the log cannot say now
    (the refusal then names no file)."""
    try:
        return decision_log.source_files(plan.prefix, plan.run)
    except Kafka2PCError as e:
        log.warning("repair of %s: the files the run read cannot be read back: %s", plan.run, e)
        return None


def _lost_by_new_id(plan: RepairPlan) -> dict[str, LostTxn]:
    """The lost transaction each of the repair's transactional ids exports again (same slot)."""
    return {plan.transactional_id(s): t for s in plan.slots for t in plan.lost
            if slot_of(t.covered.transactional_id) == s}  # fmt: skip


def _moved_topics(
    plan: RepairPlan, committables: Sequence[Committable], observed: Mapping[str, tuple[Observation, TxnState | None]]
) -> list[str]:
    """Each new transaction must write to the topics its lost one did, as the broker lists them: the
    digest covers keys and values, not where they go (a repair given another topic would pass it).
    Partitions are not compared: records without a key land where the producer's partitioner
    chooses, differently each time."""
    expected = _lost_by_new_id(plan)
    problems = []
    for c in committables:
        lost = expected.get(c.transactional_id)
        if lost is None or not lost.covered.partitions:  # an old record names no partitions
            continue
        was = lost.covered.topics
        now = topics_of(partitions_of(c, observed[c.transactional_id][1]))
        if now != was:
            problems.append(
                f"{lost.covered.transactional_id} (Spark partition {slot_of(c.transactional_id)}) wrote to "
                f"{', '.join(sorted(was))}; its re-export to {', '.join(sorted(now)) or 'no topic'}"
            )
    return problems


def check_committable(
    plan: RepairPlan,
    committables: Sequence[Committable],
    observed: Mapping[str, tuple[Observation, TxnState | None]],
    wire: WireClient,
    decision_log: DecisionLog,
    actor: str,
    max_workers: int,
    end_txn_timeout_s: float,
) -> None:
    """As the commit does before its decision: every new transaction open under its own producer,
    with the commit's headroom before its broker deadline (a re-export that outlived
    ``transaction.timeout.ms`` was aborted by the broker already), and on its lost one's topics.
    Else all are aborted, nothing of the repair is visible."""
    refs = [ref_of(c) for c in committables]
    check_current_producers(refs, observed, [plan.prefix])
    doomed = doomed_of(
        refs, observed, commit_headroom(len(refs), max_workers, decision_log.budget_s, end_txn_timeout_s)
    )
    # Topics only of transactions the broker lists open: a doomed one's partitions may be gone.
    moved = _moved_topics(plan, committables, observed) if not doomed else []
    if not doomed and not moved:
        return
    abort_prepared(committables, wire, decision_log, f"repair of {plan.run}", actor=actor)
    if moved:
        raise RepairRefusedError(
            f"repair of run {plan.run} of exporter {plan.prefix} refused: its re-export wrote to other topics than "
            f"the run ({'; '.join(moved)}). Nothing of the repair is visible: its {len(committables)} transaction(s) "
            "were aborted, and the run stays LOST. Repair again with the run's topic (the export's `topic`; from the "
            "CLI, `--topic`, or none when the frame has a topic column)"
        )
    raise RepairRefusedError(
        f"repair of run {plan.run} of exporter {plan.prefix}: {len(doomed)} of its {len(refs)} transaction(s) could "
        f"no longer commit ({'; '.join(f'{t}: {why}' for t, why in sorted(doomed.items()))}). They were aborted: "
        "nothing of the repair is visible, and the run stays LOST. Repair again; the re-export and its commit must "
        "end within the broker's transaction.timeout.ms"
    )


__all__ = ["check_committable", "check_same"]
