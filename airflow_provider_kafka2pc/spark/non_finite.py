"""The rows that hold NaN or ±Infinity where a given JSON Schema takes only numbers, counted on the
driver before any transaction opens.

``to_json`` writes those values as the strings "NaN", "Infinity" and "-Infinity"; a derived schema
takes them, a given one that says only ``"type": "number"`` does not. Spark's types cannot say that
a double holds none, so the rows are asked: one aggregation over the source, run only for a given
schema with such a field (a derived schema costs nothing). Fields inside arrays and maps count a row
once when any of its elements is one.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any

from airflow_provider_kafka2pc.spark.column_functions import functions_for
from airflow_provider_kafka2pc.spark.json_schema import Steps

log = logging.getLogger(__name__)


def count_rows(df: Any, role: str, fields: list[tuple[str, Steps]]) -> tuple[dict[str, int], int]:
    """For each field (its path as said in messages, and its steps from the ``role`` column), how
    many rows of ``df`` hold NaN or ±Infinity there; and how many rows ``df`` has."""
    F = functions_for(df)

    column = df[role]
    data_type = df.schema[role].dataType
    started = time.monotonic()
    counts = [F.sum(F.when(_holds(F, column, data_type, steps), 1).otherwise(0)) for _, steps in fields]
    row = df.select(*[c.alias(f"c{i}") for i, c in enumerate(counts)], F.count(F.lit(1)).alias("rows")).first()
    found = {path: int(row[f"c{i}"] or 0) for i, (path, _) in enumerate(fields)}
    log.info(
        "kafka2pc: NaN/±Infinity counted where the given JSON Schema takes only numbers (%s) in %.1f s: %s",
        ", ".join(found),
        time.monotonic() - started,
        ", ".join(f"{path}: {n} of {row['rows']} rows" for path, n in found.items()),
    )
    return found, int(row["rows"])


def _holds(F: ModuleType, column: Any, data_type: Any, steps: Steps) -> Any:
    """True where the value at ``steps`` (or, through arrays and maps, any of them) is NaN or ±Infinity;
    false where it is null or absent. ``F``: the column functions of the frame's kind."""
    from pyspark.sql import types as T

    if not steps:
        return F.coalesce(F.isnan(column) | (F.abs(column) == F.lit(float("inf"))), F.lit(False))
    step, rest = steps[0], steps[1:]
    if isinstance(data_type, T.StructType) and step is not None:
        return _holds(F, column.getField(step), data_type[step].dataType, rest)
    if isinstance(data_type, T.ArrayType):
        return F.coalesce(F.exists(column, lambda x: _holds(F, x, data_type.elementType, rest)), F.lit(False))
    if isinstance(data_type, T.MapType):
        values = F.map_values(column)
        return F.coalesce(F.exists(values, lambda x: _holds(F, x, data_type.valueType, rest)), F.lit(False))
    raise TypeError(f"no value at {steps!r} in {data_type.simpleString()}")  # json_schema.fit walked the type


__all__ = ["count_rows"]
