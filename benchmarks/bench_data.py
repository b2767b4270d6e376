"""The benchmark's records, built identically in Python, in Arrow and in Spark SQL.

Row ``i``: key = ``str(i)``; value = 100 bytes. Two payloads:

- ``lpad``: ``str(i)`` left-padded with ``x`` (Spark's ``lpad``), very compressible (lz4 ~10x);
- ``hex``: the first 100 hex digits of sha256(str(i)) + sha512(str(i)); lz4 barely shrinks it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

VALUE_BYTES = 100


def _lpad(i: int) -> bytes:
    return str(i).encode().rjust(VALUE_BYTES, b"x")


def _hex(i: int) -> bytes:
    s = str(i).encode()
    return (hashlib.sha256(s).hexdigest() + hashlib.sha512(s).hexdigest())[:VALUE_BYTES].encode()


PAYLOADS: dict[str, tuple[str, Callable[[int], bytes]]] = {
    "lpad": (f"lpad(cast(id as string), {VALUE_BYTES}, 'x')", _lpad),
    "hex": (f"substr(concat(sha2(cast(id as string), 256), sha2(cast(id as string), 512)), 1, {VALUE_BYTES})", _hex),
}


def value_of(payload: str) -> Callable[[int], bytes]:
    return PAYLOADS[payload][1]


def python_records(n: int, payload: str) -> tuple[list[bytes], list[bytes]]:
    """Keys and values as bytes, ready for ``Producer.produce``."""
    value = value_of(payload)
    return [str(i).encode() for i in range(n)], [value(i) for i in range(n)]


def payload_bytes(n: int) -> int:
    """Key plus value bytes of rows 0 .. n-1 (what a producer counts)."""
    key_bytes, lo, digits = 0, 0, 1
    while lo < n:
        hi = min(n, 10**digits)
        key_bytes += (hi - lo) * digits
        lo, digits = hi, digits + 1
    return key_bytes + VALUE_BYTES * n


def spark_frame(spark: Any, n: int, payload: str, partitions: int = 4) -> Any:
    """``spark.range`` → key, value (both string); cached and materialised so later runs only read it."""
    df = spark.range(n, numPartitions=partitions).selectExpr(
        "cast(id as string) as key", f"{PAYLOADS[payload][0]} as value"
    )
    df = df.cache()
    if df.count() != n:
        raise RuntimeError("the cached DataFrame lost rows")
    sample = {int(r["key"]): r["value"].encode() for r in df.where("id in (0, 7, 12345)").collect()}
    value = value_of(payload)
    if any(v != value(k) for k, v in sample.items()):
        raise RuntimeError(f"Spark's {payload!r} values differ from the Python ones: {sample}")
    return df


def parquet_frame(spark: Any, n: int, payload: str, directory: str, partitions: int = 4) -> Any:
    """The same rows written once as Parquet files (not timed) and read back uncached: every run
    reads and decodes the files, as an export of a table does."""
    spark.range(n, numPartitions=partitions).selectExpr(
        "cast(id as string) as key", f"{PAYLOADS[payload][0]} as value"
    ).write.mode("overwrite").parquet(directory)
    df = spark.read.parquet(directory)
    if df.count() != n:
        raise RuntimeError("the Parquet files lost rows")
    return df


def computed_frame(spark: Any, n: int, payload: str, partitions: int = 4) -> Any:
    """The same rows computed from ``spark.range`` by every run, not cached: a source the default
    export must compute before any transaction opens (it stages it)."""
    return spark.range(n, numPartitions=partitions).selectExpr(
        "cast(id as string) as key", f"{PAYLOADS[payload][0]} as value"
    )


def arrow_partitions(n: int, payload: str, partitions: int = 4, batch_rows: int = 10_000) -> list[list[Any]]:
    """The Arrow batches each of ``partitions`` Spark tasks would hand to ``mapInArrow``.

    Same shape as Spark 4.2 sends them: non-null ``string`` columns key and value,
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000) rows per batch."""
    import pyarrow as pa

    schema = pa.schema([pa.field("key", pa.string(), False), pa.field("value", pa.string(), False)])
    value = value_of(payload)
    bounds = [n * p // partitions for p in range(partitions + 1)]
    out: list[list[Any]] = []
    for p in range(partitions):
        out.append(list(_batches(bounds[p], bounds[p + 1], batch_rows, schema, value)))
    return out


def _batches(start: int, stop: int, size: int, schema: Any, value: Callable[[int], bytes]) -> Iterator[Any]:
    import pyarrow as pa

    for lo in range(start, stop, size):
        ids = range(lo, min(lo + size, stop))
        yield pa.RecordBatch.from_arrays(
            [pa.array([str(i) for i in ids], pa.string()), pa.array([value(i).decode() for i in ids], pa.string())],
            schema=schema,
        )
