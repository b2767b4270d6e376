"""Java's partitioner for keyed records, as Spark's sink and Java producers apply it: murmur2 of the
key, positive, modulo the partition count (Kafka's ``Utils.murmur2`` and ``toPositive``),
vectorised with numpy; keyless records go to one partition per batch (the sticky choice).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kafka2pc.txn.kafka import librdkafka as rd
from airflow_provider_kafka2pc.txn.kafka.message_arrays import as_bytes, binary_buffers
from airflow_provider_kafka2pc.txn.kafka.message_arrays import lengths as key_lengths

_M = 0x5BD1E995  # murmur2's multiplier (Kafka's Utils.murmur2)
_TAIL_MASKS = (0, 0xFF, 0xFFFF, 0xFFFFFF)  # the bytes of a key's last, partial word, by their count


def java_murmur2(keys: Any, longest: int | None = None) -> Any:
    """Kafka's ``Utils.murmur2`` of every key of a pyarrow string/binary array, as numpy uint32.

    Vectorized over the keys' 4-byte words; numpy's uint32 arithmetic wraps like Java's int. Each
    word round works on the keys still that long only, so a few long keys cost little. Keys
    longer than ``longest`` bytes, and null keys, get a meaningless value callers overrule."""
    import numpy as np

    column, offsets, data_buffer = binary_buffers(keys)
    n = len(column)
    first = int(offsets[0]) if n else 0  # a slice's keys start inside its parent's data
    offsets = offsets.astype(np.int64) - first
    starts, lengths = offsets[:-1], np.diff(offsets)
    end = int(offsets[-1]) if n else 0
    if longest is not None:
        lengths = np.minimum(lengths, longest)
    words = lengths >> 2
    most = int(words.max()) if n else 0
    # The little-endian uint32 at byte offset o is word o >> 2 of the data shifted by o & 3: with
    # the four shifted copies side by side, each word of every key is one gather.
    stride = end // 4 + 2
    padded = np.zeros(4 * stride + 4, dtype=np.uint8)
    if end:
        padded[:end] = np.frombuffer(data_buffer, dtype=np.uint8, count=end, offset=first)
    shifted = [padded[a : a + 4 * stride].view("<u4") for a in range(4)]
    table = np.concatenate([*shifted, np.zeros(most + 1, dtype=np.uint32)])  # + room for short keys' reads
    at = (starts & 3) * stride + (starts >> 2)
    m = np.uint32(_M)
    h = np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)
    same_length = n == 0 or int(words.min()) == most
    active = np.arange(n)
    for j in range(most):
        if same_length:
            k = table[at + j]
        else:
            active = active[words[active] > j]
            k = table[at[active] + j]
        k *= m
        k ^= k >> np.uint32(24)
        k *= m
        if same_length:
            h *= m
            h ^= k
        else:
            h[active] = (h[active] * m) ^ k
    tail_length = lengths & 3
    tail = table[at + words] & np.array(_TAIL_MASKS, dtype=np.uint32)[tail_length]
    h = np.where(tail_length > 0, (h ^ tail) * m, h)
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


# Keys up to this many bytes are hashed in numpy; a longer one (rare) by librdkafka's own murmur2
# partitioner, one call each: numpy's per-call cost per word would dominate for it.
_LONGEST_VECTORIZED_KEY = 256


def java_partitions(keys: Any, explicit: Any, partition_count: int, keyless_partition: int) -> Any:
    """Every record's partition as Java's producer picks it, numpy int32.

    A partition column's value where it gives one (``explicit``, -1 where not); else a keyed
    record's ``(murmur2(key) & 0x7fffffff) % partition_count``; else ``keyless_partition`` for all
    keyless records (Java's sticky partitioner also fills one partition at a time with them)."""
    import numpy as np

    unassigned = explicit < 0
    if not unassigned.any():
        return explicit
    if keys is None:
        chosen = np.full(len(explicit), keyless_partition, dtype=np.int32)
    else:
        hashes = java_murmur2(keys, longest=_LONGEST_VECTORIZED_KEY)
        chosen = ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(partition_count)).astype(np.int32)
        long_keys = np.flatnonzero(key_lengths(keys) > _LONGEST_VECTORIZED_KEY)
        for row in long_keys.tolist():
            key = as_bytes(keys[row].as_py()) or b""
            chosen[row] = rd.load().rd_kafka_msg_partitioner_murmur2(None, key, len(key), partition_count, None, None)
        if keys.null_count:
            chosen[keys.is_null().to_numpy(zero_copy_only=False)] = keyless_partition
    return np.where(unassigned, chosen, explicit)


__all__ = ["java_murmur2", "java_partitions"]
