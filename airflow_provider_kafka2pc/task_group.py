"""One call that wires an exactly-once export: recover → prepare → commit, or abort."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import TaskGroup

from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook
from airflow_provider_kafka2pc.operators.abort import Kafka2PCAbortOperator
from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator, check_pooling_dag
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor
from airflow_provider_kafka2pc.txn.protocol import naming


def kafka2pc_export_group(
    *,
    transactional_id_prefix: str,
    kafka2pc_conn_id: str = Kafka2PCHook.default_conn_name,
    naming_strategy: str | naming.NamingStrategy = naming.NamingStrategy.POOLING,
    group_id: str | None = None,
    recover_kwargs: Mapping[str, Any] | None = None,
    commit_kwargs: Mapping[str, Any] | None = None,
    abort_kwargs: Mapping[str, Any] | None = None,
    **export_kwargs: Any,
) -> TaskGroup:
    """A task group ``recover >> prepare >> [commit, abort]`` for one exporter.

    ``export_kwargs`` are the export's own arguments (``topic``, ``source``/``sql``/``table``,
    ``spark_conn_id``, ``spark_conf``, ``delivery_guarantee``, ``producer_config``, ``retries``...:
    see ``Kafka2PCExportOperator``); ``recover_kwargs``, ``commit_kwargs`` and ``abort_kwargs`` go
    to the other tasks (a ``deferrable`` or ``poke_interval`` for ``recover``, retries...).

    Call it inside a ``DAG`` context. With POOLING ids (the default) the DAG must have
    ``max_active_runs=1``: two runs at once would share transactional ids and fence each other,
    so any other value is refused here, at parse time. The group's tasks are ``recover``,
    ``prepare``, ``commit`` and ``abort``.
    """
    prefix = naming.validate_prefix(transactional_id_prefix)
    strategy = naming.NamingStrategy(str(naming_strategy).upper())
    shared: dict[str, Any] = {"transactional_id_prefix": prefix, "kafka2pc_conn_id": kafka2pc_conn_id}
    with TaskGroup(group_id or prefix.replace(".", "_")) as group:
        check_pooling_dag(strategy, group.dag, prefix)
        # The sensor leaves the run's own loss to the export only if the export repairs it.
        repair = {"repair_lost": export_kwargs["repair_lost"]} if "repair_lost" in export_kwargs else {}
        recover = Kafka2PCRecoverySensor(
            task_id="recover", naming_strategy=strategy, **shared, **{**repair, **(recover_kwargs or {})}
        )
        prepare = Kafka2PCExportOperator(task_id="prepare", naming_strategy=strategy, **shared, **export_kwargs)
        # The export budgets its window with the commit's headroom: one value for both.
        headroom = (
            {"commit_headroom_ms": export_kwargs["commit_headroom_ms"]} if "commit_headroom_ms" in export_kwargs else {}
        )
        commit = Kafka2PCCommitOperator(
            task_id="commit",
            export_task_ids=prepare.task_id,
            kafka2pc_conn_id=kafka2pc_conn_id,
            **{**headroom, **(commit_kwargs or {})},
        )
        abort = Kafka2PCAbortOperator(
            task_id="abort",
            export_task_ids=prepare.task_id,
            transactional_id_prefixes=[prefix],
            naming_strategy=strategy,
            kafka2pc_conn_id=kafka2pc_conn_id,
            **(abort_kwargs or {}),
        )
        recover >> prepare >> [commit, abort]
    return group
