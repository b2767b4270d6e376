"""A Kafka source's snapshot: the range one run reads, read from the broker before anything is written.

``snapshot_source`` resolves the source topics (names or a pattern), refuses a consumer group with
live members (kafka2pc commits the group's offsets as a member-less group, generation -1, which a
live classic group would see overwritten and a KIP-848 group refuses), reads the group's committed
offsets with a stable fetch (an offset commit still inside an open transaction answers
UNSTABLE_OFFSET_COMMIT: an earlier run is unresolved), the log start and the last stable offset of
every partition (``read_committed``: never the high watermark, which may sit behind another
producer's open transaction), and builds the run's ``SourceRange``. Offsets below the log start
(deleted by retention before the group read them) are refused unless the caller accepts the gap.
``group_offsets`` is the fresh read the commit compares against the range before it decides.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, SourceError, UnstableOffsetsError
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.source_range import (
    STARTING_POLICIES,
    PartitionRange,
    SourceRange,
    at_start,
    cap_ranges,
    departures,
    not_at_end,
    offset_text,
)

# librdkafka's "no committed offset" (OFFSET_INVALID).
_NO_OFFSET = -1001
# What a broker answers while a coordinator or a leader moves or loads: asked again. The leader
# epoch family answers ListOffsets while a restarted broker's leadership settles (the soak saw
# FENCED_LEADER_EPOCH), OFFSET_NOT_AVAILABLE while a new leader's high watermark catches up.
_TRANSIENT = frozenset(
    {
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "OFFSET_NOT_AVAILABLE",
        "REQUEST_TIMED_OUT",
    }
)


@dataclass(frozen=True)
class KafkaSourceSpec:
    """What a user says about a Kafka source: which topics, which group, and the run's limits."""

    group_id: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None  # a regex over topic names (full match), instead of ``topics``
    starting_offsets: str = "earliest"  # for a partition the group has no offset for
    max_offsets_per_run: int | None = None
    # Go on although the group's position does not follow: retention deleted records it had not read
    # (start at the log start), or it is not where the last committed run left it (start where it is).
    accept_gap: bool = False

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("a Kafka source needs a consumer group id")
        if bool(self.topics) == bool(self.pattern):
            raise ValueError("a Kafka source takes topics or a pattern, one of them")
        if self.starting_offsets not in STARTING_POLICIES:
            raise ValueError(f"starting_offsets={self.starting_offsets!r}: choose one of {list(STARTING_POLICIES)}")
        if self.max_offsets_per_run is not None and self.max_offsets_per_run <= 0:
            raise ValueError(f"max_offsets_per_run must be positive, got {self.max_offsets_per_run}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "topics": list(self.topics),
            "pattern": self.pattern,
            "starting_offsets": self.starting_offsets,
            "max_offsets_per_run": self.max_offsets_per_run,
            "accept_gap": self.accept_gap,
        }


def snapshot_source(
    config: Mapping[str, Any],
    spec: KafkaSourceSpec,
    timeout_s: float = 30.0,
    previous: RunRecord | None = None,
) -> SourceRange:
    """The range this run reads, per partition ``[start, end)``; raises ``SourceError`` naming the
    cause and the fix for a live group, a missing topic, a gap, an unresolved earlier run, or a
    group that is not where the exporter's last committed run (``previous``) left it: its offsets
    expired or another consumer moved them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(with_log(connection_only(config)))
    partitions = _partitions(admin, config, spec, timeout_s)
    _refuse_live_members(admin, config, spec.group_id, timeout_s)
    committed = _committed(admin, config, spec.group_id, partitions, timeout_s)
    log_start = _offsets(admin, config, partitions, "earliest", timeout_s)
    stable_end = _offsets(admin, config, partitions, "latest", timeout_s)
    # After a committed run of this group, a partition without an offset is new (added to the topic,
    # or a topic the pattern matches now): read it whole, whatever the policy for a first run says.
    follows = previous is not None and previous.source is not None and previous.source.group_id == spec.group_id
    ranges, gaps = [], []
    for tp in partitions:
        first, end, had = log_start[tp], stable_end[tp], committed.get(tp)
        if had is None:
            start = first if spec.starting_offsets == "earliest" or follows else end
        elif had > end:
            raise SourceError(
                f"consumer group {spec.group_id!r} committed offset {had} on {tp[0]}-{tp[1]}, beyond its last "
                f"stable offset {end}: the topic was deleted and recreated or truncated, or a read_uncommitted "
                "consumer of the group committed past an open transaction. Reset the group's offsets with "
                "kafka-consumer-groups --reset-offsets, or use a new group id"
            )
        elif had < first:
            gaps.append((tp, had, first))
            start = first
        else:
            start = had
        ranges.append(PartitionRange(tp[0], tp[1], start, end, had))
    if gaps and not spec.accept_gap:
        gone = sum(first - had for _, had, first in gaps)
        named = ", ".join(f"{t}-{p} (committed {had}, log start {first})" for (t, p), had, first in gaps[:5])
        raise SourceError(
            f"consumer group {spec.group_id!r} has not read {gone} offset(s) that retention already deleted: "
            f"{named}. Those records are gone; to go on from the oldest records left, set accept_gap=True "
            "on the Kafka source for one run"
        )
    read = SourceRange(spec.group_id, cap_ranges(ranges, spec.max_offsets_per_run))
    if follows:
        assert previous is not None
        _check_follows(previous, read, spec, str(config.get("bootstrap.servers", "")))
    return read


def _check_follows(previous: RunRecord, read: SourceRange, spec: KafkaSourceSpec, bootstrap: str) -> None:
    """The group must stand where the exporter's last committed run left it."""
    assert previous.source is not None
    off = departures(previous.source, read)
    if not off or spec.accept_gap:
        return
    last = f"run {previous.run} (decision {previous.decision_id})"
    if previous.status is RunStatus.LOST:
        named = ", ".join(f"{p.name} is at {offset_text(now)}, the run ended at {p.end}" for p, now in off[:5])
        raise SourceError(
            f"the exporter's last run {previous.run} (decision {previous.decision_id}) lost transactions "
            f"(kafka2pc describe shows them) and consumer group {spec.group_id!r} is not at that run's end "
            f"({named}). If that run's output is visible, its offsets were lost: move the group to the run's end "
            f"({reset_commands(bootstrap, spec.group_id, [p for p, _ in off])}) and run again; to read that range "
            "again instead, set accept_gap=True for one run"
        )
    if previous.whole and at_start(off):
        # Its output is visible, its offsets are not: a regular commit replaced the run's own.
        raise SourceError(
            offsets_not_moved_sentence(previous.run, previous.source, off, bootstrap, previous.decision_id)
        )
    if all(now is None for _, now in off):
        named = ", ".join(f"{p.name} at {p.end}" for p, _ in off[:5])
        raise SourceError(
            f"consumer group {spec.group_id!r} has no offsets, but the exporter's last committed {last} left it at "
            f"{named}: its offsets expired (offsets.retention.minutes after their last commit) or were deleted. "
            f"Starting again from starting_offsets={spec.starting_offsets!r} would read those records again. Reset "
            "the group to those offsets with kafka-consumer-groups --reset-offsets --to-offset, or set "
            "accept_gap=True for one run to start from the starting policy"
        )
    named = ", ".join(f"{p.name} is at {offset_text(now)}, left at {p.end}" for p, now in off[:5])
    raise SourceError(
        f"consumer group {spec.group_id!r} is not where the exporter's last committed {last} left it ({named}): "
        "another consumer committed offsets for the group, or they were reset. Give the export a group of its "
        "own; to go on from where the group is now, set accept_gap=True for one run"
    )


def group_left_behind(config: Mapping[str, Any], run: RunRecord | None, timeout_s: float = 30.0) -> str | None:
    """For ``kafka2pc list``/``describe`` and the exporters page: the sentence of the exporter's latest
    committed run whose group stands at that run's start (a regular commit replaced the run's
    offsets), read from the group now; None when it does not."""
    if run is None or run.source is None or not run.whole:
        return None
    partitions = [(p.topic, p.partition) for p in run.source.partitions]
    off = not_at_end(run.source, group_offsets(config, run.source.group_id, partitions, timeout_s, stable=False))
    if not at_start(off):
        return None
    return offsets_not_moved_sentence(
        run.run, run.source, off, str(config.get("bootstrap.servers", "")), run.decision_id
    )


def settled_group_offsets(
    config: Mapping[str, Any], group_id: str, partitions: Sequence[tuple[str, int]], timeout_s: float = 30.0
) -> dict[tuple[str, int], int | None]:
    """The group's committed offsets once no transactional commit to it is pending: just after a
    run's EndTxn its coordinator is still writing the commit markers, and a stable read answers
    UNSTABLE_OFFSET_COMMIT until they land (milliseconds); past ``timeout_s`` that refusal is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return group_offsets(config, group_id, partitions, timeout_s=timeout_s)
        except UnstableOffsetsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def group_offsets(
    config: Mapping[str, Any],
    group_id: str,
    partitions: Sequence[tuple[str, int]],
    timeout_s: float = 30.0,
    stable: bool = True,
) -> dict[tuple[str, int], int | None]:
    """The group's committed offsets now (None where it has none). A stable read refuses while an
    offset commit is pending in an open transaction; ``stable=False`` reads past it, as the commit's
    guard must while its own offsets participant is open."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(with_log(connection_only(config)))
    return _committed(admin, config, group_id, list(partitions), timeout_s, stable)


def _partitions(
    admin: Any, config: Mapping[str, Any], spec: KafkaSourceSpec, timeout_s: float
) -> list[tuple[str, int]]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as e:
        raise BrokerUnavailableError(f"cannot read the topics at {config.get('bootstrap.servers')}: {e}") from e
    if spec.pattern is not None:
        regex = re.compile(spec.pattern)
        names = sorted(t for t in metadata.topics if regex.fullmatch(t) and not t.startswith("__"))
        if not names:
            raise SourceError(
                f"no topic matches the Kafka source's pattern {spec.pattern!r} (a full match; topics whose "
                "names start with '__' are Kafka's own). Create the topic or fix the pattern"
            )
    else:
        names = list(spec.topics)
    out: list[tuple[str, int]] = []
    for name in names:
        t = metadata.topics.get(name)
        if t is None:  # asked by name, the broker says why it is not listed (missing, or not ours to see)
            t = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        if t is not None and t.error is not None:
            # Spark's source reads it: Read, which implies the Describe the snapshot needs.
            named = authorization_error_of(t.error.name(), config, name, "Read")
            if named is not None:
                raise named
        if t is None or (t.error is not None and t.error.name() == "UNKNOWN_TOPIC_OR_PART"):
            raise SourceError(
                f"the Kafka source's topic {name!r} does not exist (or this principal may not Describe it). "
                "Create it, or fix the name; docs/acls.md lists the source's ACLs"
            )
        if t.error is not None:
            raise SourceError(f"the Kafka source's topic {name!r} cannot be read: {t.error}")
        out.extend((name, p) for p in sorted(t.partitions))
    return out


def reset_commands(bootstrap: str, group: str, partitions: Sequence[PartitionRange]) -> str:
    """``kafka-consumer-groups`` commands that move ``group`` to each partition's end, ready to paste."""
    commands = [
        f"kafka-consumer-groups --bootstrap-server {shlex.quote(bootstrap)} --command-config admin.properties "
        f"--group {shlex.quote(group)} --reset-offsets --topic {shlex.quote(f'{p.topic}:{p.partition}')} "
        f"--to-offset {p.end} --execute"
        for p in partitions[:5]
    ]
    more = f"; and {len(partitions) - 5} more partition(s) alike" if len(partitions) > 5 else ""
    return "; ".join(commands) + more


def offsets_not_moved_sentence(
    run: str,
    source: SourceRange,
    behind: Sequence[tuple[PartitionRange, int | None]],
    bootstrap: str,
    decision_id: str | None = None,
) -> str:
    """What a committed run whose group did not reach its ends says (the commit at once, the next
    run's snapshot later): output visible, group not moved, and the commands that make the next run
    correct. Never accept_gap, which would read the run's range again."""
    named = ", ".join(f"{p.name} is at {offset_text(now)}, the run ended at {p.end}" for p, now in behind[:5])
    decision = f" (decision {decision_id})" if decision_id else ""
    return (
        f"run {run}{decision} committed: its output is visible, but consumer group {source.group_id!r} did not move "
        f"with it ({named}): a regular offset commit to the group (another consumer, kafka-consumer-groups "
        "--reset-offsets, a script re-committing offsets) landed after the run's own and replaced it. The next run "
        "would read those records again, so it is refused until the group is at that run's end: "
        f"{reset_commands(bootstrap, source.group_id, [p for p, _ in behind])}; then run again. Do not set "
        "accept_gap=True for this: it would export those records twice"
    )


def _retrying(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()``, again while Kafka answers a retriable error (a group coordinator still loading
    its partition after a start or a leader change: COORDINATOR_LOAD_IN_PROGRESS), up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except Exception as e:
            # By name: librdkafka does not flag these retriable on admin results.
            if _error_name(e) not in _TRANSIENT or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _refuse_live_members(admin: Any, config: Mapping[str, Any], group_id: str, timeout_s: float) -> None:
    try:
        group = _retrying(
            lambda: admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id].result(timeout_s),
            timeout_s,
        )
    except Exception as e:
        _raise_group_error(e, config, group_id, "Read")  # Read implies the Describe asked here
    members = list(group.members or ())
    if members:
        who = ", ".join(sorted({f"{m.client_id} on {m.host}" for m in members})[:5])
        raise SourceError(
            f"consumer group {group_id!r} has {len(members)} live member(s) ({who}): kafka2pc commits the group's "
            "offsets with the run as a group without members, which would overwrite or be refused by theirs. "
            "Stop those consumers, or give the export a consumer group of its own"
        )


def _committed(
    admin: Any,
    config: Mapping[str, Any],
    group_id: str,
    partitions: list[tuple[str, int]],
    timeout_s: float,
    stable: bool = True,
) -> dict[tuple[str, int], int | None]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = [ConsumerGroupTopicPartitions(group_id, [TopicPartition(t, p) for t, p in partitions])]
    try:
        result = _retrying(
            lambda: admin.list_consumer_group_offsets(request, require_stable=stable, request_timeout=timeout_s)[
                group_id
            ].result(timeout_s),
            timeout_s,
        )
    except Exception as e:
        _raise_group_error(e, config, group_id, "Read")
    out: dict[tuple[str, int], int | None] = {}
    for tp in result.topic_partitions or ():
        if tp.error is not None:
            if tp.error.name() == "UNSTABLE_OFFSET_COMMIT":
                raise UnstableOffsetsError(
                    f"consumer group {group_id!r} has an offset commit on {tp.topic}-{tp.partition} inside a "
                    "transaction that is still open: an earlier run's offsets participant ({prefix}-offsets or "
                    "{prefix}-{run}-offsets) not resolved yet, or another transactional application committing "
                    "this group. kafka2pc list --prefix P shows the exporter's open transactions and kafka2pc "
                    "resolve ends them; another application's ends at its transaction timeout at the latest"
                )
            _raise_group_error(tp.error, config, group_id, "Read")
        out[(tp.topic, tp.partition)] = None if tp.offset == _NO_OFFSET or tp.offset < 0 else int(tp.offset)
    return out


def _offsets(
    admin: Any, config: Mapping[str, Any], partitions: list[tuple[str, int]], which: str, timeout_s: float
) -> dict[tuple[str, int], int]:
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(t, p): spec for t, p in partitions}

    def ask() -> dict[tuple[str, int], int]:
        futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s)
        return {(tp.topic, tp.partition): int(f.result(timeout_s).offset) for tp, f in futures.items()}

    try:
        return dict(_retrying(ask, timeout_s))
    except Exception as e:
        named = authorization_error_of(_error_name(e), config, ",".join(sorted({t for t, _ in partitions})), "Read")
        if named is not None:
            raise named from e
        raise BrokerUnavailableError(
            f"cannot read the {which} offsets of the Kafka source at {config.get('bootstrap.servers')}: {e}"
        ) from e


def _raise_group_error(e: Any, config: Mapping[str, Any], group_id: str, operation: str) -> NoReturn:
    cause = e if isinstance(e, BaseException) else None
    named = authorization_error_of(_error_name(e), config, group_id, operation)
    if named is not None:
        raise named from cause
    raise SourceError(f"cannot read consumer group {group_id!r}: {e}") from cause


def _error_name(e: Any) -> str:
    """The Kafka error name of a confluent-kafka exception or KafkaError ('' when it has none)."""
    err = e.args[0] if isinstance(e, BaseException) and e.args else e
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else ""
