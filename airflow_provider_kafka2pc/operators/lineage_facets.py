"""kafka2pc's own OpenLineage facet: the run facet of a commit that made a repaired run visible.

Imported only where the openlineage provider (and so the OpenLineage client) is installed
(``operators/lineage.py``). A repair exports a LOST run's lost transactions again and commits
them (DESIGN §6): the run becomes visible whole, in two steps, not atomically. A consumer of the
lineage learns it from this facet, beside the topics the commit names as outputs; the topics'
Airflow asset events carry the same facts in their extra (``repaired``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import define
from openlineage.client.facet_v2 import RunFacet

FACET_NAME = "kafka2pc_repair"


@define
class Kafka2PCRepairRunFacet(RunFacet):
    """The exporters' runs this task made visible by a repair: per run its prefix, run, repair
    decision and actor, and the records and transactions the repair restored."""

    repairs: list[dict[str, Any]]
    atomic: bool = False  # a repaired run became visible in two steps

    # Nothing here is secret: the OpenLineage client's redaction may pass over these fields.
    _additional_skip_redact: ClassVar[list[str]] = ["repairs", "atomic"]


__all__ = ["FACET_NAME", "Kafka2PCRepairRunFacet"]
