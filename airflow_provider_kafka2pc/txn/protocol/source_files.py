"""The files each Spark partition of an export read: what a repair's refusal names (DESIGN §6).

A repair proves its re-computation the same by digest, per lost transaction. When the digests
differ, the user needs to know why: a file that changed, was added or removed, or the same files
packed into other Spark partitions (a rewritten file of another size, another
``spark.sql.files.maxPartitionBytes``, another parallelism). So an export that writes a plain scan
of files records, once per run, the splits (path, offset, length, size, modification time) each
Spark partition read, under ``kafka2pc.source-files:{prefix}:{run}``; the repair lists them again
from its own plan and compares. Explanatory only: nothing is decided from it, and a record of
another attempt of the same run (the latest of the key) can only make an explanation less exact.

An export of more than ``MAX_SPLITS`` splits records none: the record would outgrow what the
decision topic takes in one message, and the refusal then says only that the digests differ.

A computed frame exported through the barrier stage (executors on other hosts than the driver) is
dealt round-robin over the cluster's task slots, one transaction a slot; the same key records the
number of slots and the frame's own partitions before the deal instead (``{"dealt": N, "inputs": P}``),
before the window opens. Unlike the splits, a repair
needs it: it deals the recomputed frame over the same N slots (Spark sorts each input partition
before a round-robin repartition, so the same input deals the same rows to the same slots) and
the digests prove it did (with Spark's default ``spark.sql.execution.sortBeforeRepartition``).
A plain scan is written as stored and records splits; only ``store='barrier'`` deals one, and its
dealing then replaces the splits (a refusal names no file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from airflow_provider_kafka2pc.txn.protocol.records import SOURCE_FILES_KEY

VERSION = 1
MAX_SPLITS = 2_000  # about 200 KB of JSON at most: well inside a decision topic's message size


@dataclass(frozen=True)
class FileSplit:
    """The part of one file a Spark partition read (Spark's ``PartitionedFile``)."""

    path: str
    start: int
    length: int
    size: int  # the whole file's, as listed when the export planned
    modified_ms: int

    def as_list(self) -> list[object]:
        return [self.path, self.start, self.length, self.size, self.modified_ms]

    @classmethod
    def of_list(cls, v: Sequence[object]) -> FileSplit:
        return cls(str(v[0]), int(str(v[1])), int(str(v[2])), int(str(v[3])), int(str(v[4])))


Splits = Mapping[int, tuple[FileSplit, ...]]  # Spark partition -> the splits it read


def source_files_key(prefix: str, run: str) -> bytes:
    return f"{SOURCE_FILES_KEY}{prefix}:{run}".encode()


def parse_source_files_key(key: bytes) -> tuple[str, str]:
    """(prefix, run) of a key; a run holds colons, a prefix none."""
    prefix, _, run = key[len(SOURCE_FILES_KEY) :].decode().partition(":")
    return prefix, run


def encode_splits(splits: Splits) -> bytes | None:
    """The record's value, or None when there are more than ``MAX_SPLITS`` splits."""
    if sum(len(s) for s in splits.values()) > MAX_SPLITS:
        return None
    body = {"v": VERSION, "slots": {str(slot): [f.as_list() for f in files] for slot, files in sorted(splits.items())}}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_splits(value: bytes) -> dict[int, tuple[FileSplit, ...]] | None:
    """The splits of a record's value; None for a value of another version or shape."""
    try:
        body = json.loads(value)
        if body.get("v") != VERSION:
            return None
        return {int(slot): tuple(FileSplit.of_list(f) for f in files) for slot, files in body["slots"].items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


@dataclass(frozen=True)
class Dealing:
    """How the barrier stage dealt a frame: round-robin over ``slots`` task slots, from ``inputs``
    Spark partitions of the frame (None: not known), each sorted first by Spark."""

    slots: int
    inputs: int | None = None


def encode_dealt(dealing: Dealing) -> bytes:
    """The record's value for a frame the barrier stage dealt."""
    body = {"v": VERSION, "dealt": int(dealing.slots), "inputs": dealing.inputs}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_dealt(value: bytes) -> Dealing | None:
    """The dealing a record's value says; None for splits or another shape."""
    try:
        body = json.loads(value)
        dealt, inputs = (body.get("dealt"), body.get("inputs")) if body.get("v") == VERSION else (None, None)
    except (ValueError, AttributeError):
        return None
    if not isinstance(dealt, int) or not _count(dealt) or not (inputs is None or _count(inputs)):
        return None
    return Dealing(dealt, inputs)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def explain_changes(recorded: Splits | None, now: Splits | None, slots: Sequence[int]) -> list[str]:
    """What changed in the files the lost ``slots`` read, in sentences naming files; empty when
    nothing was recorded, the repair's frame is not a plain scan, or the files are the same."""
    if recorded is None or now is None:
        return []
    was_files = {f.path: f for files in recorded.values() for f in files}
    now_files = {f.path: f for files in now.values() for f in files}
    sentences: list[str] = []
    for slot in slots:
        before, after = recorded.get(slot, ()), now.get(slot, ())
        if before == after:
            continue
        changed = [_changed(f, now_files[f.path]) for f in _whole(before) if f.path in now_files]
        changed = [c for c in changed if c]
        gone = [f.path for f in _whole(before) if f.path not in now_files]
        added = [f.path for f in _whole(after) if f.path not in was_files]
        parts = [*changed, *(f"{p} was removed" for p in gone), *(f"{p} was added" for p in added)]
        if not parts:  # the same files, unchanged, dealt to other partitions
            parts = [
                f"the same files are packed differently: it read {_splits(before)} then, {_splits(after)} now "
                "(another spark.sql.files.maxPartitionBytes or openCostInBytes, parallelism or cluster size)"
            ]
        sentences.append(f"Spark partition {slot}: {'; '.join(parts)}")
    return sentences


def _whole(splits: Sequence[FileSplit]) -> list[FileSplit]:
    """One split per file (a large file is read in several)."""
    return list({f.path: f for f in splits}.values())


def _changed(was: FileSplit, now: FileSplit) -> str:
    if (was.size, was.modified_ms) == (now.size, now.modified_ms):
        return ""
    return (
        f"{was.path} changed ({was.size} -> {now.size} bytes, modified {_when(was.modified_ms)} -> "
        f"{_when(now.modified_ms)})"
    )


def _splits(splits: Sequence[FileSplit]) -> str:
    if not splits:
        return "nothing"
    shown = ", ".join(f"{f.path.rsplit('/', 1)[-1]}[{f.start}+{f.length}]" for f in splits[:4])
    return shown + (f" and {len(splits) - 4} more" if len(splits) > 4 else "")


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "MAX_SPLITS",
    "Dealing",
    "FileSplit",
    "Splits",
    "decode_dealt",
    "decode_splits",
    "encode_dealt",
    "encode_splits",
    "explain_changes",
    "parse_source_files_key",
    "source_files_key",
]
