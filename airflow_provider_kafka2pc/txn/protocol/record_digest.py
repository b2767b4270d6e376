"""The digest of a transaction's records: what a repair compares its re-computation with.

A repair exports a lost transaction's records again, and must prove them the same before any of
them becomes visible (DESIGN §6). The digest is of the multiset of (key, value) pairs: a count and
the sum, modulo 2**64, of a 64-bit BLAKE2b hash of each pair. Order-free on purpose: a
deterministic source may hand a partition's rows to the writer in another order on a second
computation (a shuffle's fetch order), and the records a reader sees once are the same either way.
Its text names the scheme, so a digest of another scheme never compares equal by accident.

Three schemes: ``b2sum64`` hashes each pair here (writers outside Spark, tests); the Spark ones sum
the hashes Spark's JVM computed beside each row (``spark/digest_column.py``), which costs the writer
one vector sum per batch. ``xxh64t`` (every Spark export now) hashes where the record goes as well:
Spark's ``xxhash64`` of the key's nullness, the key, the value, the topic and the partition column
(when the frame has one). So a repair whose rows swap topics, or move from one explicit partition to
another, does not compare equal. ``xxh64`` (key and value only) is what exports before it recorded;
a repair of such a run computes it again.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass

SCHEME = "b2sum64"
SPARK_SCHEME = "xxh64t"  # key, value, topic, partition
SPARK_PAIR_SCHEME = "xxh64"  # key and value: recorded by exports before xxh64t
SPARK_SCHEMES = (SPARK_SCHEME, SPARK_PAIR_SCHEME)
_MASK = (1 << 64) - 1
_NONE = b"\xff"  # a null key or value; a present one is prefixed with its length, so none collide


def _pair_hash(key: bytes | None, value: bytes | None) -> int:
    h = hashlib.blake2b(digest_size=8)
    for part in (key, value):
        h.update(_NONE if part is None else struct.pack(">I", len(part)) + part)
    return int.from_bytes(h.digest(), "big")


@dataclass
class RecordDigest:
    """Accumulates records; ``text`` is what a committable carries."""

    count: int = 0
    total: int = 0
    scheme: str = SCHEME

    def add(self, key: bytes | None, value: bytes | None) -> None:
        self.count += 1
        self.total = (self.total + _pair_hash(key, value)) & _MASK

    def add_all(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> RecordDigest:
        for key, value in records:
            self.add(key, value)
        return self

    def add_hashes(self, count: int, total: int) -> None:
        """``count`` records whose hashes (computed elsewhere, of this digest's scheme) sum to ``total``."""
        self.count += count
        self.total = (self.total + total) & _MASK

    def text(self) -> str:
        return join_digest(self.scheme, self.count, self.total)


def join_digest(scheme: str, count: int, total: int) -> str:
    """A digest's text: ``scheme:count:total`` (the total as 16 hex digits)."""
    return f"{scheme}:{count}:{total:016x}"


def split_digest(text: str) -> tuple[str, int, int] | None:
    """(scheme, count, total) of a digest's text; None for a text of another shape."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    try:
        total = int(parts[2], 16)
    except ValueError:
        return None
    return (parts[0], int(parts[1]), total) if 0 <= total <= _MASK else None


def describe_difference(recorded: str, recomputed: str) -> str:
    """What differs between two digests, in words a user can act on."""
    was, now = recorded.split(":"), recomputed.split(":")
    if was[0] != now[0]:
        return f"the digests are of different schemes ({was[0]} recorded, {now[0]} now): compare cannot prove anything"
    if len(was) == len(now) == 3 and was[1] != now[1]:
        return f"{was[1]} records were exported, {now[1]} now"
    what = "keys, values, topics or partitions" if was[0] == SPARK_SCHEME else "keys or values"
    return f"the same number of records, but different {what} (digest {recorded} recorded, {recomputed} now)"


def scheme_of(text: str) -> str | None:
    """The scheme a digest's text names; None for a text of another shape."""
    parts = split_digest(text)
    return parts[0] if parts is not None else None
