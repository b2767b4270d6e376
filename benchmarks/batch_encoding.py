"""What encoding Kafka record batches straight from Arrow would cost in numpy and pyarrow (issue 49).

    .venv/bin/python benchmarks/batch_encoding.py [--rows 400000] [--runs 5] [--payload lpad|hex]

One of the levers issue 49 names is to skip librdkafka's message per record: encode each Arrow
batch into a Kafka record batch (magic 2) in vectorized code and ship only bytes. This measures the
part of that encoder which no Kafka client can avoid and which the writer would pay in place of
librdkafka's produce path: the records section of a batch (per record a length, attributes, a
timestamp delta, an offset delta, the key's and the value's lengths as zigzag varints, the key, the
value and an empty header count), built from the Arrow batches ``mapInArrow`` hands a task, with no
Python object per record. Compression, the CRC32C, the batch header and sending are left out, so
the figure is a floor of such an encoder, not its whole cost.

Two ways are timed, each the fastest found with numpy and pyarrow's public kernels:
``join``: the varints as Arrow binary arrays, then ``binary_join_element_wise`` of the pieces;
``take``: the pieces concatenated, then interleaved by one ``take``.

The first batch of each way is checked byte for byte: kafka-python's ``DefaultRecordBatch`` decodes
the records from a batch built around it (uncompressed, its CRC32C from kafka-python) and must give
back every key and value. Compare the CPU per record with ``benchmarks/loop_cpu.py`` (the native
writer's whole process, librdkafka's threads included) and with the design page's split.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import bench_data


def _width(value: int) -> int:
    """Bytes of an unsigned varint of ``value``."""
    width = 1
    while value >= 1 << (7 * width):
        width += 1
    return width


def zigzag_varints(values: Any) -> Any:
    """An Arrow binary array whose row i is the zigzag varint of ``values[i]`` (numpy int64)."""
    import numpy as np
    import pyarrow as pa

    v = values.astype(np.int64)
    z = ((v << 1) ^ (v >> 63)).astype(np.uint64)
    n = len(z)
    narrow, wide = _width(int(z.min(initial=0))), _width(int(z.max(initial=0)))
    rows = np.empty((n, wide), np.uint8)
    rest = z.copy()
    for i in range(wide):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        rows[:, i] = low | ((rest != 0).astype(np.uint8) << 7)
    if narrow == wide:  # one width for every row (the usual case): no gaps to squeeze out
        offsets = np.arange(0, (n + 1) * wide, wide, dtype=np.int32)
        data = rows.ravel()
    else:
        lengths = np.ones(n, np.int32)
        for i in range(1, wide):
            lengths += z >= (1 << (7 * i))
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        data = rows[np.arange(wide)[None, :] < lengths[:, None]]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _lengths(varints: Any) -> Any:
    import numpy as np

    return np.diff(np.frombuffer(varints.buffers()[1], np.int32, count=len(varints) + 1))


@lru_cache(maxsize=4)
def _offset_deltas(n: int) -> Any:
    import numpy as np

    return zigzag_varints(np.arange(n))


@lru_cache(maxsize=4)
def _interleaving(n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.array(np.arange(5 * n, dtype=np.int32).reshape(5, n).T.ravel())


@lru_cache(maxsize=4)
def _header_counts(n: int) -> Any:
    import pyarrow as pa

    return pa.array([b"\x00"] * n, pa.binary())


def _pieces(keys: Any, values: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(length + attributes + timestamp delta + offset delta + key length, keys, value lengths,
    values, offset deltas) of every record, as Arrow binary arrays."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(values)
    keys, values = keys.cast(pa.binary()), values.cast(pa.binary())
    key_lengths = pc.fill_null(pc.binary_length(keys), -1).to_numpy(zero_copy_only=False)
    value_lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    deltas = _offset_deltas(n)
    key_varints, value_varints = zigzag_varints(key_lengths), zigzag_varints(value_lengths)
    body = 3 + _lengths(deltas) + _lengths(key_varints) + np.maximum(key_lengths, 0)
    body += _lengths(value_varints) + value_lengths
    head = pc.binary_join_element_wise(zigzag_varints(body), pa.scalar(b"\x00\x00"), deltas, key_varints, b"")
    return head, pc.fill_null(keys, b""), value_varints, values, deltas


def records_by_join(keys: Any, values: Any) -> memoryview:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    head, keys, value_varints, values, _ = _pieces(keys, values)
    joined = pc.binary_join_element_wise(head, keys, value_varints, values, pa.scalar(b"\x00"), b"")
    _, offsets, data = joined.buffers()
    bounds = np.frombuffer(offsets, np.int32, count=len(joined) + 1)
    return memoryview(data)[bounds[0] : bounds[-1]]


def records_by_take(keys: Any, values: Any) -> memoryview:
    import numpy as np
    import pyarrow as pa

    n = len(values)
    head, keys, value_varints, values, _ = _pieces(keys, values)
    pieces = pa.concat_arrays([head, keys, value_varints, values, _header_counts(n)]).take(_interleaving(n))
    _, offsets, data = pieces.buffers()
    bounds = np.frombuffer(offsets, np.int32, count=5 * n + 1)
    return memoryview(data)[bounds[0] : bounds[-1]]


WAYS: dict[str, Callable[[Any, Any], memoryview]] = {"join": records_by_join, "take": records_by_take}


def check(encode: Callable[[Any, Any], memoryview], batch: Any) -> None:
    """Decode a batch around ``encode``'s records with kafka-python; every key and value must come back."""
    from kafka.record._crc32c import crc as crc32c
    from kafka.record.default_records import DefaultRecordBatch

    keys, values = batch.column(0), batch.column(1)
    n = batch.num_rows
    records = bytes(encode(keys, values))
    # attributes, last offset delta, first and max timestamp, producer id, epoch, base sequence, count
    after_crc = struct.pack(">hiqqqhii", 0x10, n - 1, 0, 0, 1234, 5, 0, n) + records
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), -1, 2, crc32c(after_crc))
    decoded = DefaultRecordBatch(head + after_crc)
    if not decoded.validate_crc():
        raise SystemExit("the CRC32C does not match")
    got = [(r.key, r.value) for r in decoded]
    want = list(zip(keys.cast("binary").to_pylist(), values.cast("binary").to_pylist(), strict=True))
    if got != want:
        raise SystemExit(f"decoded records differ from the batch's ({len(got)} against {len(want)})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--payload", choices=("lpad", "hex"), default="lpad")
    args = ap.parse_args(argv)
    batches = [b for part in bench_data.arrow_partitions(args.rows, args.payload, partitions=1) for b in part]
    rows = sum(b.num_rows for b in batches)
    print(f"{rows:,} records in {len(batches)} Arrow batches, {args.payload} values, {args.runs} interleaved runs")
    for encode in WAYS.values():
        check(encode, batches[0])
    cpu: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(args.runs):
        for name, encode in WAYS.items():
            start = time.process_time()
            size = sum(len(encode(b.column(0), b.column(1))) for b in batches)
            cpu[name].append((time.process_time() - start) / rows * 1e9)
    for name, samples in cpu.items():
        print(
            f"records section by {name}: {statistics.median(samples):,.0f} ns of CPU per record "
            f"(runs {', '.join(f'{s:,.0f}' for s in samples)}), {size / rows:.1f} B per record"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
