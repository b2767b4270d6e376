"""Arrow columns as arrays of ``rd_kafka_message_t``: pointers into the Arrow buffers, no Python
object per record (numpy builds them). ``message_array`` is what ``NativeProducer.produce_batch``
hands to ``rd_kafka_produce_batch``; ``partition_order`` groups it by partition.
"""

from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from typing import Any

from airflow_provider_kafka2pc.txn.kafka import librdkafka as rd
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, NativeUnsupportedError

MAX_PARTITION = 2**31 - 1  # partitions are int32 in Kafka's protocol and in rd_kafka_message_t
# The oldest pyarrow the writers are tested with (scripts/test-compat, beside PySpark 3.5); 15 and
# older are built for numpy 1, and the package's numpy is 2.
LOWEST_PYARROW = (16, 1, 0)


def pyarrow_unsupported() -> str | None:
    """Why the installed pyarrow is older than the writers are tested with (or missing), or None."""
    try:
        import pyarrow as pa
    except ImportError as e:
        return f"pyarrow is not installed ({e})"
    found = tuple(int(n) for n in re.findall(r"\d+", pa.__version__)[:3])
    if found < LOWEST_PYARROW:
        lowest = ".".join(map(str, LOWEST_PYARROW))
        return f"pyarrow {pa.__version__} is older than {lowest}, the oldest kafka2pc is tested with"
    return None


def as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def bytes_at(pointer: int | None, length: int) -> bytes | None:
    return None if not pointer else ctypes.string_at(pointer, length)


@lru_cache(maxsize=1)
def message_dtype() -> Any:
    """``rd_kafka_message_t`` as a numpy structured dtype, laid out as ctypes lays out the struct."""
    import numpy as np

    formats = {"err": "<i4", "partition": "<i4", "offset": "<i8"}
    offsets = rd.field_offsets()
    return np.dtype(
        {
            "names": list(offsets),
            "formats": [formats.get(name, "<u8") for name in offsets],
            "offsets": list(offsets.values()),
            "itemsize": ctypes.sizeof(rd.RdKafkaMessage),
        }
    )


# A valid address for an empty but non-null key or value whose column has no data buffer: librdkafka
# sends NULL as a null key/value, and any other pointer with length 0 as an empty one.
_EMPTY = ctypes.create_string_buffer(1)


def binary_column(column: Any) -> Any:
    """A key or value column as memory ``message_array`` can point into: a dictionary-encoded column
    decoded, a string/binary view copied into one data buffer, anything else as it is. The
    result owns the buffers the messages point to: keep it alive until they are produced."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    # View types (and their predicates) came with pyarrow 16: an older one has no view column to copy.
    is_view = [getattr(pa.types, name, None) for name in ("is_string_view", "is_binary_view")]
    if any(check is not None and check(column.type) for check in is_view):
        column = column.cast(pa.binary())
    return column


def binary_buffers(column: Any) -> tuple[Any, Any, Any]:
    """A string/binary column as (the binary column, its n + 1 offsets as numpy, its data buffer);
    a slice's offsets start at its first row."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())  # relabels the same buffers, copies nothing
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise NativeUnsupportedError(f"a {column.type} column (string or binary only; see binary_column)")
    n = len(column)
    _validity, offsets_buffer, data_buffer = column.buffers()
    width = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    if offsets_buffer is None:  # only an empty array has none
        return column, np.zeros(n + 1, dtype=width), None
    offsets = np.frombuffer(offsets_buffer, dtype=width, count=column.offset + n + 1)[column.offset :]
    return column, offsets, data_buffer


def _fill(out: Any, pointer_field: str, length_field: str, column: Any, order: Any) -> None:
    """Pointers into ``column``'s data buffer and the lengths, NULL/0 for nulls, rows in ``order``."""
    import numpy as np

    column, offsets, data_buffer = binary_buffers(column)
    if len(column) == 0:
        return
    lengths = np.diff(offsets).astype(np.uint64)
    base = data_buffer.address if data_buffer is not None and data_buffer.address else ctypes.addressof(_EMPTY)
    pointers = offsets[:-1].astype(np.uint64) + np.uint64(base)
    if column.null_count:
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        pointers[nulls] = 0
        lengths[nulls] = 0
    if order is not None:
        pointers, lengths = pointers[order], lengths[order]
    out[pointer_field] = pointers
    out[length_field] = lengths


def explicit_partitions(partitions: Any, n: int) -> Any:
    """A partition column (pyarrow integers, or None) as numpy int32, -1 where the partitioner chooses
    (null or negative, as for every record without a partition column)."""
    import numpy as np
    import pyarrow.compute as pc

    if partitions is None:
        return np.full(n, rd.RD_KAFKA_PARTITION_UA, dtype=np.int32)
    chosen = pc.fill_null(pc.max_element_wise(partitions, -1), -1)
    too_big = pc.greater(chosen, MAX_PARTITION)
    if pc.any(too_big).as_py():  # the int32 cast below would wrap it onto another partition
        row = pc.index(too_big, True).as_py()
        raise Kafka2PCError(
            f"the partition column's row {row} is {chosen[row].as_py()}, above the largest partition number "
            f"Kafka has ({MAX_PARTITION}); leave it null to let the partitioner choose"
        )
    return chosen.to_numpy(zero_copy_only=False).astype(np.int32)


def message_array(values: Any, keys: Any = None, partitions: Any = None, order: Any = None) -> Any:
    """A numpy array of ``rd_kafka_message_t`` for pyarrow arrays of values and keys.

    Keys and values must be string or binary (large too); a null key or value is NULL (a null
    value is a tombstone). ``partitions`` (numpy int32, ``explicit_partitions``/``java_partitions``)
    gives each record's partition, -1 (``RD_KAFKA_PARTITION_UA``) for librdkafka's partitioner,
    which is every record's without it. ``order`` (row indices) lays the records out in that order.
    The pointers reference the arrays' buffers: keep them alive until the array has been produced."""
    import numpy as np

    out = np.zeros(len(values), dtype=message_dtype())
    _fill(out, "payload", "len", values, order)
    if keys is not None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        _fill(out, "key", "key_len", keys, order)
    if partitions is None:
        out["partition"] = rd.RD_KAFKA_PARTITION_UA
    else:
        out["partition"] = partitions if order is None else partitions[order]
    return out


def lengths(column: Any) -> Any:
    """Each value's length in bytes (0 for a null), numpy int64."""
    import pyarrow.compute as pc

    return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype("int64")


def partition_order(partitions: Any) -> Any:
    """Row indices grouping the records by partition, each partition in the frame's order (a stable
    sort); None when they already are."""
    import numpy as np

    if len(partitions) < 2 or bool((partitions[1:] >= partitions[:-1]).all()):
        return None
    if int(partitions.max()) < 2**16:  # numpy's stable sort of 16-bit keys is a radix sort: ~3x faster
        return np.argsort(partitions.astype(np.uint16), kind="stable")
    return np.argsort(partitions, kind="stable")


__all__ = [
    "LOWEST_PYARROW",
    "MAX_PARTITION",
    "as_bytes",
    "binary_buffers",
    "binary_column",
    "bytes_at",
    "explicit_partitions",
    "lengths",
    "message_array",
    "message_dtype",
    "partition_order",
    "pyarrow_unsupported",
]
