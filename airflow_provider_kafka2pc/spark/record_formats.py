"""Registry formats applied to a DataFrame on the driver, before the contract check and before any
transaction opens (DESIGN §12).

For each of ``key`` and ``value`` with a format: the schema is derived from the column's type (or
given), resolved against the registry once (``registry/resolve.py``: looked up, checked for
compatibility, registered), the column checked against it, and the column replaced by an expression
that Spark's JVM evaluates while it computes the source: the 5-byte header (magic byte 0, the schema
id as 4 big-endian bytes) as a binary literal, concatenated with ``to_avro(col, schema)`` or
``to_json(col)``. The writer then gets plain binary columns, as without formats: no Python runs per
record. A null column value stays a null key, or a null value (a tombstone).
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.client import RegistryClient, RegistrySettings
from airflow_provider_kafka2pc.registry.formats import ROLES, AvroFormat, RegistryFormat, default_record_name
from airflow_provider_kafka2pc.registry.resolve import ResolvedSchema, resolve
from airflow_provider_kafka2pc.spark import avro_schema, json_schema
from airflow_provider_kafka2pc.spark.column_functions import avro_functions_for, functions_for
from airflow_provider_kafka2pc.spark.errors import SchemaError

log = logging.getLogger(__name__)

MAGIC_BYTE = 0
# spark-avro: a separate artifact, without its Scala suffix (spark/versions.py reads it).
_AVRO_ARTIFACT = "spark-avro"


@dataclass(frozen=True)
class RecordFormats:
    """The formats of an export's key and value, and the registry they are framed for."""

    registry: RegistrySettings
    key: RegistryFormat | None = None
    value: RegistryFormat | None = None

    def of(self, role: str) -> RegistryFormat | None:
        return self.key if role == "key" else self.value

    @property
    def uses_avro(self) -> bool:
        return any(isinstance(f, AvroFormat) for f in (self.key, self.value))


def header(schema_id: int) -> bytes:
    """The Confluent wire format's header: magic byte 0, then the schema id, 4 bytes big-endian."""
    return struct.pack(">bI", MAGIC_BYTE, schema_id)


def avro_package() -> str:
    """``spark.jars.packages`` for spark-avro matching the Spark a session here starts."""
    from airflow_provider_kafka2pc.spark.versions import spark_build

    return spark_build().package(_AVRO_ARTIFACT)


def needs_avro_package(spark_conf: Any) -> bool:
    """Whether a session built with ``spark_conf`` lacks spark-avro (neither in its jars nor packages)."""
    given = f"{spark_conf.get('spark.jars', '') or ''},{spark_conf.get('spark.jars.packages', '') or ''}"
    return "spark-avro" not in given


def apply_formats(
    df: Any, formats: RecordFormats, topic: str | None, client: RegistryClient | None = None
) -> tuple[Any, tuple[ResolvedSchema, ...]]:
    """``df`` with its formatted columns encoded and framed, and the schemas they carry.

    Raises ``RegistryError`` (its subclasses name cause and fix) before anything is written."""
    if formats.uses_avro:
        check_avro_loaded(df.sparkSession)
    client = client or RegistryClient(formats.registry)
    columns = {f.name: f for f in df.schema.fields}
    resolved: list[ResolvedSchema] = []
    encoded: dict[str, Any] = {}
    for role in ROLES:
        fmt = formats.of(role)
        if fmt is None:
            continue
        column = columns.get(role)
        if column is None:
            raise errors.SchemaMismatchError(
                f"a {fmt.schema_type} format is given for the {role} but the DataFrame has no {role!r} column; "
                f"{errors.NOTHING_WRITTEN}. Add the column (a struct of the record's fields, or one value)"
            )
        subject_hint = fmt.subject or role
        if fmt.schema is not None:  # a given text: check the frame before asking the registry anything
            _check(df, fmt, fmt.schema, role, subject_hint)
        derived = None
        if fmt.schema is None and fmt.version is None:
            derived = _derive(column.dataType, fmt, topic, role)
        schema = resolve(client, fmt, role, topic, derived)
        if fmt.version is not None:
            _check(df, fmt, schema.schema, role, schema.subject)
        resolved.append(schema)
        encoded[role] = _framed(df, role, schema)
    if not encoded:
        return df, ()
    out = df.select(*[encoded[name].alias(name) if name in encoded else df[name] for name in df.columns])
    return out, tuple(resolved)


def check_avro_loaded(spark: Any) -> None:
    """Refuse, before the registry is asked anything, a session whose JVM lacks spark-avro: Spark
    loads jars only when its JVM starts, and would otherwise refuse ``to_avro`` after registration."""
    F, avro = functions_for(spark), avro_functions_for(spark)
    try:
        spark.range(0).select(avro.to_avro(F.lit(1))).schema  # noqa: B018  (analysed, never run)
    except Exception as e:
        # Spark 4 names the error; 3.5's Python wrapper prints a hint and raises a TypeError.
        if "AVRO_NOT_LOADED" not in str(e) and "'JavaPackage' object is not callable" not in str(e):
            raise
        raise SchemaError(
            "the Avro format needs spark-avro in the Spark session's JVM, which has none; "
            f"{errors.NOTHING_WRITTEN}. Add {avro_package()} to spark.jars.packages (the export operator "
            "does) or its jar to spark.jars, in a session whose JVM starts with it"
        ) from None


def _derive(data_type: Any, fmt: RegistryFormat, topic: str | None, role: str) -> str:
    name = fmt.record_name or default_record_name(topic, role)
    try:
        if isinstance(fmt, AvroFormat):
            return json.dumps(avro_schema.derive(data_type, name))
        return json.dumps(json_schema.derive(data_type, name))
    except TypeError as e:
        raise errors.SchemaMismatchError(
            f"no {fmt.schema_type} schema can be derived from the DataFrame's {role!r} column: {e}; "
            f"{errors.NOTHING_WRITTEN}. Cast the column to a supported type, or give the schema (schema= or version=)"
        ) from None


def _check(df: Any, fmt: RegistryFormat, text: str, role: str, subject: str) -> None:
    data_type = df.schema[role].dataType
    try:
        schema = json.loads(text)
    except ValueError:
        # A bare Avro type name ("string") is valid Avro schema text but not JSON.
        schema = text.strip()
        if not isinstance(fmt, AvroFormat):
            raise errors.mismatch(role, subject, [f"the schema is not JSON: {text[:80]!r}"]) from None
    if not isinstance(fmt, AvroFormat):
        _check_json(df, schema, role, subject)
        return
    problems = avro_schema.check(data_type, schema, role)
    if problems:
        raise errors.mismatch(role, subject, problems)


def _check_json(df: Any, schema: Any, role: str, subject: str) -> None:
    """The column's type against the schema, then, only where the schema takes numbers but not
    "NaN"/"Infinity"/"-Infinity", the rows (one aggregation over the source)."""
    fit = json_schema.fit(df.schema[role].dataType, schema, role)
    if fit.problems:
        raise errors.mismatch(role, subject, fit.problems)
    if fit.finite_only:
        from airflow_provider_kafka2pc.spark.non_finite import count_rows

        counts, total = count_rows(df, role, fit.finite_only)
        problems = [json_schema.non_finite_problem(path, n, total) for path, n in counts.items() if n]
        if problems:
            raise errors.mismatch(role, subject, problems)


def _framed(df: Any, role: str, schema: ResolvedSchema) -> Any:
    """``df``'s ``role`` column encoded and framed, with the column functions of ``df``'s kind."""
    F, column = functions_for(df), df[role]
    if schema.schema_type == "AVRO":
        body = avro_functions_for(df).to_avro(column, schema.schema)
    else:
        # Null fields left out; timestamps in UTC with microseconds (json_schema.TO_JSON_OPTIONS).
        body = F.to_json(column, json_schema.TO_JSON_OPTIONS).cast("binary")
    framed = F.concat(F.lit(bytearray(header(schema.id))), body)
    return F.when(column.isNull(), F.lit(None).cast("binary")).otherwise(framed)


__all__ = ["MAGIC_BYTE", "RecordFormats", "apply_formats", "avro_package", "header", "needs_avro_package"]
