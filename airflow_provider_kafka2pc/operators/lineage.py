"""Where a topic lives, as Airflow assets and OpenLineage datasets name it; lineage is optional."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.protocol.repair_announcement import kafka_namespace

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.sources import SourceTable


def lineage_enabled() -> bool:
    """Whether the openlineage provider is installed: without it nobody asks for lineage."""
    return importlib.util.find_spec("airflow.providers.openlineage") is not None


def source_table_names(table: str | None, sql: str | None) -> list[str]:
    """The tables an export reads: ``table``, or those ``sql`` names, as OpenLineage's own SQL
    parser finds them (in the Spark dialect; none if it cannot parse the query)."""
    if table:
        return [table]
    if not sql:
        return []  # a ``source`` callable: its inputs are unknown
    from airflow.providers.openlineage.sqlparser import SQLParser

    meta = SQLParser(dialect="spark").parse(sql)
    return [t.qualified_name for t in meta.in_tables] if meta is not None else []


def topics_lineage(
    bootstrap_servers: str,
    topics: Iterable[str],
    sources: Sequence[SourceTable] = (),
    repairs: Sequence[Mapping[str, Any]] = (),
) -> Any:
    """An ``OperatorLineage`` with the topics as outputs and the source tables' stored data as
    inputs (a symlink names the table), and, for a commit that made repaired runs visible, the
    ``kafka2pc_repair`` run facet (``operators/lineage_facets.py``); or None without the openlineage
    provider (its listener, the only caller of ``get_openlineage_facets_on_complete``, is then
    absent too)."""
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset, Identifier, SymlinksDatasetFacet
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    inputs = []
    for s in sources:
        stored = s.dataset()
        if stored is not None:
            table = Identifier(namespace=stored[0], name=s.name_in_catalog(), type="TABLE")
            inputs.append(Dataset(*stored, facets={"symlinks": SymlinksDatasetFacet(identifiers=[table])}))
    namespace = kafka_namespace(bootstrap_servers)
    outputs = [Dataset(namespace=namespace, name=t) for t in sorted(set(topics))]
    run_facets: dict[str, Any] = {}
    if repairs:
        from airflow_provider_kafka2pc.operators.lineage_facets import FACET_NAME, Kafka2PCRepairRunFacet

        run_facets[FACET_NAME] = Kafka2PCRepairRunFacet(repairs=[dict(r) for r in repairs])
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run_facets)
