"""The DataFrame contract: the columns of Spark's own Kafka sink, nothing else (DESIGN §8)."""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.spark.errors import SchemaError

ALLOWED = ("key", "value", "topic", "partition", "headers")


def validate_schema(schema: Any, default_topic: str | None) -> None:
    """Check a pyspark ``StructType`` against the contract of Spark's Kafka sink."""
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in schema.fields}
    problems: list[str] = []
    extra = sorted(set(fields) - set(ALLOWED))
    if extra:
        problems.append(f"unexpected column(s) {extra}; allowed are {list(ALLOWED)}")
    if "value" not in fields:
        problems.append("the 'value' column is required")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], (T.BinaryType, T.StringType)):
            encode = (
                f" (a struct is encoded for a schema registry by a format: the export's {name}_format, "
                f"`kafka2pc repair --{name}-format`)"
                if isinstance(fields[name], T.StructType)
                else ""
            )
            problems.append(f"column {name!r} must be binary or string, not {fields[name].simpleString()}{encode}")
    if "topic" in fields and not isinstance(fields["topic"], T.StringType):
        problems.append(f"column 'topic' must be string, not {fields['topic'].simpleString()}")
    if "topic" not in fields and not default_topic:
        problems.append("there is no 'topic' column and no default topic")
    if "partition" in fields and not isinstance(fields["partition"], (T.IntegerType, T.LongType, T.ShortType)):
        problems.append(f"column 'partition' must be int, not {fields['partition'].simpleString()}")
    if "headers" in fields and not _is_headers(fields["headers"]):
        problems.append(
            f"column 'headers' must be array<struct<key: string, value: binary>>, not "
            f"{fields['headers'].simpleString()}"
        )
    if problems:
        raise SchemaError("the DataFrame does not fit the Kafka sink contract: " + "; ".join(problems))


def _is_headers(dt: Any) -> bool:
    from pyspark.sql import types as T

    if not isinstance(dt, T.ArrayType) or not isinstance(dt.elementType, T.StructType):
        return False
    inner = {f.name: f.dataType for f in dt.elementType.fields}
    return (
        set(inner) == {"key", "value"}
        and isinstance(inner["key"], T.StringType)
        and isinstance(inner["value"], (T.BinaryType, T.StringType))
    )
