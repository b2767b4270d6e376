"""Transactional ids: how they are built and how an exporter recognises its own.

The delimiter is '-', and neither a prefix nor a run key may contain it, so an id splits into
its parts unambiguously: prefix ``orders`` can never match ``orders2-0`` or ``orders-eu-0``
of a prefix ``orders-eu`` (which is refused).

A Spark application's export (``spark/application.py``) puts its driver attempt into its ids,
``{prefix}-{run_key}-{attempt tag}-{slot}``: attempts of one run never share an id, so a live
earlier attempt can never fence the attempt the run committed (DESIGN §16). They are still the
run's ids: whatever owns the run's ids owns every attempt's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from airflow_provider_kafka2pc.txn.protocol.errors import ForeignCommittableError, InvalidPrefixError

DELIMITER = "-"
# Kafka allows almost any id; we allow what is safe in a regex, a file name and a log line.
_PART = r"[A-Za-z0-9][A-Za-z0-9._]*"
_PREFIX_RE = re.compile(_PART, re.ASCII)
_MAX_ID_LENGTH = 249
_ATTEMPT_TAG_RE = re.compile(r"a[0-9a-f]{10}", re.ASCII)
# The run's consumer-offsets participant (a Kafka-sourced export, KIP-447): one more transaction
# beside the partitions' ones, ``{prefix}-offsets`` or ``{prefix}-{run_key}-offsets``. Its slot
# is -1 wherever slots are numbers (XCom columns, sorting), so it sorts before every partition.
OFFSETS_SLOT = -1
OFFSETS_NAME = "offsets"
# The id whose producer epoch numbers an exporter's export tries (``txn/two_phase/export_try.py``):
# ``{prefix}-try`` or ``{prefix}-{run_key}-try``. It never holds a transaction, and it is not a
# slot, so nothing that lists an exporter's transactions takes it for one.
TRY_NAME = "try"


class NamingStrategy(StrEnum):
    """How transactional ids are assigned (FLIP-511 names)."""

    POOLING = "POOLING"  # {prefix}-{slot}: the same ids every run
    INCREMENTING = "INCREMENTING"  # {prefix}-{run_key}-{slot}: new ids every run


@dataclass(frozen=True)
class ParsedId:
    prefix: str
    run_key: str | None
    slot: int
    attempt: str | None = None  # an application driver attempt's tag (``attempt_tag``)


def validate_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise InvalidPrefixError(
            f"invalid transactional id prefix {prefix!r}: use letters, digits, '.' and '_' "
            f"(starting with a letter or digit); {DELIMITER!r} is the id delimiter"
        )
    if len(prefix) > 150:
        raise InvalidPrefixError(f"transactional id prefix {prefix!r} is longer than 150 characters")
    return prefix


def decision_run_name(dag_id: str, run_id: str) -> str:
    """A DAG run as the decision log names it, wherever it is written from: a task, an application."""
    return f"{dag_id}/{run_id}"


def sanitize_run_key(run_key: str) -> str:
    """Map any run identifier (an Airflow run id has ':' and '+') onto the id alphabet."""
    cleaned = re.sub(r"[^A-Za-z0-9._]", "_", run_key).strip("_.")
    if not cleaned:
        raise InvalidPrefixError(f"run key {run_key!r} has no usable characters")
    if cleaned != run_key or len(cleaned) > 80:
        # Keep distinct run ids distinct after the mapping: INCREMENTING promises new ids every run.
        cleaned = f"{cleaned[:64]}_{hashlib.sha256(run_key.encode()).hexdigest()[:10]}"
    return cleaned


def attempt_tag(attempt: str) -> str:
    """An application's driver attempt (Spark's application and attempt id, which hold '-') as an
    id part: short and in the id alphabet."""
    return "a" + hashlib.sha256(attempt.encode()).hexdigest()[:10]


def transactional_id(
    prefix: str,
    slot: int,
    strategy: NamingStrategy = NamingStrategy.POOLING,
    run_key: str | None = None,
    attempt: str | None = None,
) -> str:
    """``attempt``: an ``attempt_tag``, INCREMENTING only."""
    validate_prefix(prefix)
    if slot < 0 and slot != OFFSETS_SLOT:
        raise ValueError(f"slot must be >= 0, got {slot}")
    last = OFFSETS_NAME if slot == OFFSETS_SLOT else str(slot)
    if strategy is NamingStrategy.POOLING:
        tid = f"{prefix}{DELIMITER}{last}"
    else:
        if run_key is None:
            raise ValueError("INCREMENTING naming needs a run key")
        middle = sanitize_run_key(run_key) + (f"{DELIMITER}{attempt}" if attempt is not None else "")
        tid = f"{prefix}{DELIMITER}{middle}{DELIMITER}{last}"
    if attempt is not None and (strategy is NamingStrategy.POOLING or not _ATTEMPT_TAG_RE.fullmatch(attempt)):
        raise ValueError(f"attempt tag {attempt!r}: an INCREMENTING id's part, from attempt_tag()")
    if len(tid) > _MAX_ID_LENGTH:
        raise InvalidPrefixError(f"transactional id {tid!r} is too long")
    return tid


def try_id(members: Members) -> str:
    """The id whose producer epoch numbers the export tries of ``members`` (their exporter, and
    their run for INCREMENTING ids): a newer try's InitProducerId of it supersedes every older one."""
    if members.strategy is None:
        raise ValueError("an export try's id needs the naming strategy of its transactional ids")
    first = transactional_id(members.prefix, 0, members.strategy, members.run_key, members.attempt)
    return first.rsplit(DELIMITER, 1)[0] + DELIMITER + TRY_NAME


def parse_transactional_id(tid: str) -> ParsedId | None:
    """The parts of an id written by kafka2pc, or None for anything else."""
    parts = tid.split(DELIMITER)
    slot = parts[-1]
    numbered = slot.isascii() and slot.isdigit()
    if len(parts) not in (2, 3, 4) or not (numbered or slot == OFFSETS_NAME):
        return None
    if not all(_PREFIX_RE.fullmatch(p) for p in parts[:-1]):
        return None
    if len(parts) == 4 and not _ATTEMPT_TAG_RE.fullmatch(parts[2]):  # only what attempt_tag() writes
        return None
    return ParsedId(
        parts[0],
        parts[1] if len(parts) >= 3 else None,
        int(slot) if numbered else OFFSETS_SLOT,
        parts[2] if len(parts) == 4 else None,
    )


def belongs_to(tid: str, prefix: str) -> bool:
    """Exact, delimiter-aware match: does ``tid`` belong to the exporter of ``prefix``?"""
    parsed = parse_transactional_id(tid)
    return parsed is not None and parsed.prefix == prefix


def broker_pattern(prefix: str) -> str:
    """A regex for ListTransactions' server-side filter (KIP-1152); the client filters exactly too."""
    validate_prefix(prefix)
    return f"^{re.escape(prefix)}{re.escape(DELIMITER)}.*"


@dataclass(frozen=True)
class Members:
    """The transactional ids one exporter writes for one run: ``{prefix}-{slot}`` (POOLING) or
    ``{prefix}-{run_key}-{slot}`` (INCREMENTING). Without a strategy, any id of the prefix. With an
    ``attempt`` (an ``attempt_tag``), only that application driver attempt's ids of the run."""

    prefix: str
    strategy: NamingStrategy | None = None
    run_key: str | None = None
    attempt: str | None = None

    def owns(self, tid: str) -> bool:
        parsed = parse_transactional_id(tid)
        if parsed is None or parsed.prefix != self.prefix:
            return False
        if self.attempt is not None and parsed.attempt != self.attempt:
            return False
        if self.strategy is None:
            return True
        return parsed.run_key == (None if self.strategy is NamingStrategy.POOLING else self.run_key)

    def describe(self) -> str:
        if self.strategy is None:
            return f"exporter {self.prefix!r} (ids like {self.prefix + DELIMITER + '<slot>'!r} or with a run key)"
        shape = (
            self.prefix + DELIMITER + ("" if self.strategy is NamingStrategy.POOLING else f"{self.run_key}{DELIMITER}")
        )
        return f"exporter {self.prefix!r} ({self.strategy.value} ids of this run look like {shape + '<slot>'!r})"


def check_members(transactional_ids: Iterable[str], exporters: Iterable[Members]) -> None:
    """Every id must be one the given exporters write for this run, each once: a committable of
    another exporter or run must never reach a decision. The commit and abort call this before
    deciding anything; the commit operator calls it too, per export task, before connecting."""
    members = list(exporters)
    seen: set[str] = set()
    for tid in transactional_ids:
        if not any(m.owns(tid) for m in members):
            raise ForeignCommittableError(
                f"committable {tid!r} does not belong to {' or '.join(m.describe() for m in members)}: it is another "
                "exporter's or another run's transaction. Nothing was decided; check the XCom of the export task, "
                "or clear the whole DAG run to export again"
            )
        if tid in seen:
            raise ForeignCommittableError(f"transactional id {tid!r} appears twice in the export's committables")
        seen.add(tid)
