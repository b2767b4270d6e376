"""Where an export's source tables live, for lineage: their names in Spark's catalog and their
storage locations, read through Spark's public catalog API and SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class SourceTable:
    """A table as Spark's catalog names it (``catalog.database.table``) and where its data is."""

    table: str
    location: str | None  # None for a view: its data is wherever its own sources are

    def dataset(self) -> tuple[str, str] | None:
        """(namespace, name) of the stored data in OpenLineage's naming, or None for a view."""
        if not self.location:
            return None
        parts = urlsplit(self.location)
        scheme = parts.scheme or "file"
        if scheme == "file":
            return "file", parts.path
        if scheme in ("s3", "s3a", "s3n", "gs"):  # object stores: the bucket is the namespace
            return f"{'gs' if scheme == 'gs' else 's3'}://{parts.netloc}", parts.path.lstrip("/")
        return f"{scheme}://{parts.netloc}", parts.path

    def name_in_catalog(self) -> str:
        """``database.table``: what a user writes, without the catalog."""
        return ".".join(self.table.split(".")[-2:])


def source_tables(spark: Any, names: Sequence[str]) -> list[SourceTable]:
    """The tables among ``names`` that Spark's catalog knows (a CTE or a typo is skipped)."""
    found: list[SourceTable] = []
    for name in names:
        try:
            t = spark.catalog.getTable(name)
        except Exception:  # not a table of the catalog: nothing to say about it
            continue
        parts = [p for p in (t.catalog, *(t.namespace or ()), t.name) if p]
        view = bool(t.isTemporary) or str(t.tableType).upper().endswith("VIEW")
        found.append(SourceTable(".".join(parts), None if view else _location(spark, parts)))
    return found


def _location(spark: Any, parts: Sequence[str]) -> str | None:
    quoted = ".".join("`" + p.replace("`", "``") + "`" for p in parts)
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {quoted}").collect():
        if str(row[0]).strip() == "Location":
            return str(row[1]).strip() or None
    return None
