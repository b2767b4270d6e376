"""What a repaired run announces, built from its REPAIRED record (DESIGN §6).

A repair makes a LOST run's lost records visible, in a second step after its COMMIT. Whoever
repaired it says so once: the commit that answers a run its export task repaired (an Airflow asset
event per topic, the ``kafka2pc_repair`` OpenLineage run facet), or ``kafka2pc repair`` (the same
event through Airflow's REST API, the same facet in an OpenLineage event). Both build what they
say here, from the record: per topic the records and transactions the repair restored, and the
repair (its decision, actor, and that the run did not become visible atomically).

A topic is named as the apache-kafka provider's assets and OpenLineage's Kafka datasets name it:
``kafka://{first bootstrap server}/{topic}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.records import Repair, RunRecord


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server: OpenLineage's Kafka namespace and the
    apache-kafka provider's asset scheme (one broker address names the cluster)."""
    return f"kafka://{bootstrap_servers.split(',')[0].strip()}"


def topic_uri(bootstrap_servers: str, topic: str) -> str:
    """A topic's asset URI: ``kafka://{first bootstrap server}/{topic}``."""
    return f"{kafka_namespace(bootstrap_servers)}/{topic}"


@dataclass(frozen=True)
class TopicShare:
    """What one topic got of a run: records, in how many of its transactions."""

    records: int
    transactions: int


def restored_by_topic(rec: RunRecord) -> dict[str, TopicShare]:
    """Per topic, what the repair of ``rec`` made visible: a lost transaction's records go to each
    topic it wrote (one topic each in the usual frame)."""
    shares: dict[str, TopicShare] = {}
    for t in rec.lost:
        for topic in sorted(t.covered.topics):
            was = shares.get(topic, TopicShare(0, 0))
            shares[topic] = TopicShare(was.records + t.covered.records, was.transactions + 1)
    return dict(sorted(shares.items()))


def repaired_extra(rec: RunRecord) -> dict[str, Any]:
    """The ``repaired`` part of a topic's asset event: which repair, by whom, how many records."""
    r = _repair_of(rec)
    return {"decision": r.decision_id, "actor": r.actor, "restored": r.restored, "atomic": False}


def topic_event_extra(rec: RunRecord, share: TopicShare) -> dict[str, Any]:
    """The whole extra of a topic's "repaired" asset event, named as a commit's event names its run."""
    return {
        "run": rec.run,
        "records": share.records,
        "transactions": share.transactions,
        "repaired": repaired_extra(rec),
    }


def announced_decisions(extras: Iterable[object]) -> set[str]:
    """The repair decisions that asset events' extras announced (``repaired.decision``)."""
    found: set[str] = set()
    for extra in extras:
        repaired = extra.get("repaired") if isinstance(extra, Mapping) else None
        if isinstance(repaired, Mapping) and isinstance(repaired.get("decision"), str):
            found.add(repaired["decision"])
    return found


def lineage_repair(rec: RunRecord) -> dict[str, Any]:
    """One entry of the ``kafka2pc_repair`` OpenLineage run facet (camel case, as OpenLineage's own)."""
    r = _repair_of(rec)
    return {
        "prefix": rec.prefix,
        "run": rec.run,
        "decision": r.decision_id,
        "actor": r.actor,
        "restoredRecords": r.restored,
        "restoredTransactions": len(rec.lost),
    }


def _repair_of(rec: RunRecord) -> Repair:
    if rec.repair is None:
        raise ValueError(f"run {rec.run} of exporter {rec.prefix} has no repair to announce ({rec.status.value})")
    return rec.repair


__all__ = [
    "TopicShare",
    "announced_decisions",
    "kafka_namespace",
    "lineage_repair",
    "repaired_extra",
    "restored_by_topic",
    "topic_event_extra",
    "topic_uri",
]
