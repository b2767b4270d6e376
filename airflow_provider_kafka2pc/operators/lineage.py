"""Where a topic lives, as Airflow assets and OpenLineage datasets name it; lineage is optional."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server: OpenLineage's Kafka namespace and the
    apache-kafka provider's asset scheme (one broker address names the cluster)."""
    return f"kafka://{bootstrap_servers.split(',')[0].strip()}"


def topics_lineage(bootstrap_servers: str, topics: Iterable[str]) -> Any:
    """An ``OperatorLineage`` with the topics as outputs, or None without the openlineage provider
    (its listener, the only caller of ``get_openlineage_facets_on_complete``, is then absent too)."""
    try:
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None
    namespace = kafka_namespace(bootstrap_servers)
    return OperatorLineage(outputs=[Dataset(namespace=namespace, name=t) for t in sorted(set(topics))])
