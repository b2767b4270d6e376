"""A Spark application's handoff: the committables one driver attempt prepared, for the Airflow side.

An application whose driver is not the Airflow task (spark-submit in cluster mode, a managed job)
cannot push XCom. It hands its committables over through the decision topic instead: one record
per driver attempt, keyed by exporter, attempt and run, written once every transaction of the
attempt is prepared. The Airflow side (``sensors/handoff.py``) waits for it, checks it against the
broker and pushes the committables as an export task's XCom; commit, abort and recovery follow as
for an export run in the task.

The record holds what a committable holds (ids, producer ids and epochs, counts, digests) and the
export's summary: never a connection setting. Each attempt writes ids of its own
(``{prefix}-{run_key}-{attempt tag}-{slot}``, ``naming.attempt_tag``): a live earlier attempt can
never fence the one the run commits. Which attempt is the run's is decided by Kafka and the log
order, not by the record alone: the first handoff whose transactions the broker still holds open
at its producer epochs is accepted (``txn.two_phase.handoff``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import ForeignHandoffError, MalformedHandoffError
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, attempt_tag
from airflow_provider_kafka2pc.txn.protocol.records import HANDOFF_KEY

FORMAT = 2  # 2: each attempt's ids carry its tag (``naming.attempt_tag``); 1 shared the run's ids
_ATTEMPT = re.compile(r"[A-Za-z0-9._-]{1,120}")


def handoff_key(prefix: str, attempt: str, run: str) -> bytes:
    """The run last: an Airflow run id holds ':', a prefix and an attempt never do."""
    return f"{HANDOFF_KEY}{prefix}:{attempt}:{run}".encode()


def parse_handoff_key(key: bytes) -> tuple[str, str, str]:
    """(prefix, attempt, run) of a handoff key."""
    prefix, _, rest = key[len(HANDOFF_KEY) :].decode().partition(":")
    attempt, _, run = rest.partition(":")
    return prefix, attempt, run


def check_attempt(attempt: str) -> str:
    if not _ATTEMPT.fullmatch(attempt):
        raise MalformedHandoffError(
            f"driver attempt {attempt!r}: use 1 to 120 letters, digits, '.', '_' or '-' (Spark's application id "
            "and attempt id are)"
        )
    return attempt


@dataclass(frozen=True)
class Handoff:
    """One driver attempt's prepared transactions for run ``run`` of exporter ``prefix``."""

    prefix: str
    run: str
    attempt: str
    naming_strategy: NamingStrategy
    run_key: str | None
    committables: tuple[Committable, ...]
    summary: Mapping[str, Any] = field(default_factory=dict)
    at_ms: int = 0

    @property
    def key(self) -> bytes:
        return handoff_key(self.prefix, self.attempt, self.run)

    @property
    def members(self) -> Members:
        return Members(self.prefix, self.naming_strategy, self.run_key)

    @property
    def records(self) -> int:
        return sum(c.records for c in self.committables)

    @property
    def attempt_tag(self) -> str:
        """The id part of this attempt's transactions."""
        return attempt_tag(self.attempt)

    def to_json(self) -> bytes:
        d = {
            "v": FORMAT,
            "prefix": self.prefix,
            "run": self.run,
            "attempt": self.attempt,
            "naming": self.naming_strategy.value,
            "run_key": self.run_key,
            "committables": [c.to_dict() for c in self.committables],
            "summary": dict(self.summary),
            "at_ms": self.at_ms,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: bytes) -> Handoff:
        """The record under ``key``; ``MalformedHandoffError`` names what is wrong with it."""
        prefix, attempt, run = parse_handoff_key(key)
        where = f"the handoff of attempt {attempt!r} for run {run} of exporter {prefix!r}"
        try:
            d = json.loads(raw)
            if not isinstance(d, dict) or d.get("v") != FORMAT:
                version = d.get("v") if isinstance(d, dict) else None
                raise MalformedHandoffError(
                    f"{where} is not a kafka2pc handoff of format {FORMAT} (found {version!r}): the application "
                    "and the Airflow side must run the same kafka2pc version"
                )
            handoff = cls(
                prefix=str(d["prefix"]),
                run=str(d["run"]),
                attempt=str(d["attempt"]),
                naming_strategy=NamingStrategy(str(d["naming"])),
                run_key=None if d.get("run_key") is None else str(d["run_key"]),
                committables=tuple(Committable.from_dict(c) for c in d["committables"]),
                summary=dict(d.get("summary") or {}),
                at_ms=int(d.get("at_ms", 0)),
            )
        except MalformedHandoffError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise MalformedHandoffError(f"{where} cannot be read ({type(e).__name__}: {e})") from e
        if (handoff.prefix, handoff.attempt, handoff.run) != (prefix, attempt, run):
            raise ForeignHandoffError(
                f"{where} names exporter {handoff.prefix!r}, attempt {handoff.attempt!r}, run {handoff.run}: "
                "a record copied or edited under another key. Nothing was accepted"
            )
        return handoff

    def check(self, prefix: str, run: str, strategy: NamingStrategy, run_key: str | None) -> None:
        """Refuse, by name, a handoff of another exporter or run, or one whose ids are not this run's."""
        if (self.prefix, self.run) != (prefix, run):
            raise ForeignHandoffError(
                f"the handoff of attempt {self.attempt!r} is for run {self.run} of exporter {self.prefix!r}, not run "
                f"{run} of {prefix!r}: the application was given another exporter's or run's identity. Nothing "
                "was accepted; pass this DAG run's run id and prefix to the application"
            )
        expected = Members(prefix, strategy, run_key)
        written = Members(prefix, strategy, run_key, self.attempt_tag)  # the run's ids of this attempt
        foreign = sorted(c.transactional_id for c in self.committables if not written.owns(c.transactional_id))
        if foreign or (self.naming_strategy, self.run_key) != (strategy, run_key):
            raise ForeignHandoffError(
                f"the handoff of attempt {self.attempt!r} for run {run} carries transactional ids of another run, "
                f"attempt or naming ({', '.join(foreign[:3]) or self.naming_strategy.value}); this run's are "
                f"{expected.describe()}, with the attempt's tag {self.attempt_tag!r} before the slot. Nothing was "
                "accepted; give the application the same naming strategy"
            )


__all__ = ["FORMAT", "Handoff", "check_attempt", "handoff_key", "parse_handoff_key"]
