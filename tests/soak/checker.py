"""The soak's judge. It reads Kafka directly and shares no code with kafka2pc.

It knows only what the harness promised (each run's tag, its record count and what the tools
reported) and what Kafka shows: a read_committed consumer of the data topic, and Kafka's own
TransactionsCommand (``list`` and ``find-hanging``).

It also judges what users are told (``told``): the ``kafka2pc list --json`` and ``describe --json``
answers (exit status and losses) against that truth from Kafka alone; and the Kafka-sourced runs'
consumer group (``offsets_judged``): its committed offsets, a stable fetch, must have moved to a
run's end exactly when that run's output is visible.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition


@dataclass(frozen=True)
class Violation:
    run: str
    what: str
    # or "truth": a tool told the user something Kafka contradicts; "offsets": the source group's
    # offsets and a run's output disagree
    kind: str = "exactly-once"


def committed_keys(bootstrap: str, topic: str) -> Counter[str]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-judge-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, keys = set(parts), Counter[str]()
        while pending:
            for m in c.consume(10000, 1.0):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(m.error())
                    pending.discard(m.partition())
                else:
                    keys[(m.key() or b"").decode()] += 1
        return keys
    finally:
        c.close()


def group_position(bootstrap: str, group: str, topic: str) -> dict[str, int] | None:
    """The group's committed offsets on ``topic`` (``topic-partition`` -> offset; a partition with
    none is absent), read by a stable OffsetFetch; None while an offset commit of the group is
    pending in an open transaction (UNSTABLE_OFFSET_COMMIT)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    parts = admin.list_topics(topic, timeout=30).topics[topic].partitions
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in sorted(parts)])]
    # A coordinator just moved or reloading after a broker restart: Kafka says retry (for a minute).
    deadline = time.monotonic() + 60
    while True:
        try:
            result = admin.list_consumer_group_offsets(request, require_stable=True, request_timeout=30)[group]
            answer = result.result(30)
            break
        except KafkaException as e:
            if e.args[0].name() == "UNSTABLE_OFFSET_COMMIT":
                return None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    out: dict[str, int] = {}
    for tp in answer.topic_partitions or ():
        if tp.error is not None:
            if tp.error.name() == "UNSTABLE_OFFSET_COMMIT":
                return None
            raise RuntimeError(f"offsets of group {group} on {tp.topic}-{tp.partition}: {tp.error}")
        if tp.offset >= 0:
            out[f"{tp.topic}-{tp.partition}"] = int(tp.offset)
    return out


def offsets_judged(
    visible: Mapping[str, int], runs: Sequence[Mapping[str, Any]], offsets: Mapping[str, int]
) -> list[Violation]:
    """The source group's ``offsets`` against the sourced runs' output (``visible`` records by tag).

    A sourced run (``source_end``: its range's end per partition, once its prepare took one) commits
    its output and its group's offsets together: the group must stand at the end of the last sourced
    run whose output is all visible, or with no offsets before any is. A run partly or not visible
    after its COMMIT was in force (a loss by physics: the broker aborted part of it) may have moved
    the group or not, as its offsets participant was among what committed or what was lost.
    """

    def lost(r: Mapping[str, Any]) -> bool:
        return bool(r.get("status") == "lost" or r.get("loss_reported") or r.get("commit_decided"))

    allowed: list[tuple[Mapping[str, Any] | None, Mapping[str, int]]] = [(None, {})]
    ended: dict[str, Mapping[str, Any]] = {}
    for r in runs:
        end = r.get("source_end") or {}
        if not end:
            continue
        ended[json_key(end)] = r
        if visible.get(str(r["tag"]), 0) == r["expected"]:
            allowed = [(r, end)]
        elif lost(r):
            allowed.append((r, end))
    if any(dict(offsets) == dict(end) for _, end in allowed):
        return []
    at = ", ".join(f"{k} {v}" for k, v in sorted(offsets.items())) or "no offsets"
    moved_to = ended.get(json_key(offsets))
    if moved_to is not None:
        seen = visible.get(str(moved_to["tag"]), 0)
        if seen != moved_to["expected"] and not lost(moved_to):  # its offsets committed, its output did not
            return [
                Violation(
                    str(moved_to["run"]),
                    f"the group's offsets moved to this run's end ({at}), but {seen} of its {moved_to['expected']} "
                    f"records are visible (reported {moved_to['status']})",
                    "offsets",
                )
            ]
        at += f" (the end of {moved_to['run']})"
    last, end = allowed[0]
    if last is None:
        return [Violation("-", f"no sourced run's output is visible, yet the group has offsets: {at}", "offsets")]
    want = ", ".join(f"{k} {v}" for k, v in sorted(end.items()))
    return [
        Violation(
            str(last["run"]),
            f"all {last['expected']} records visible, but the group's offsets are at {at}, not at its end ({want})",
            "offsets",
        )
    ]


def json_key(offsets: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(offsets.items()))


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    """The prefix's transactions Kafka lists as Ongoing or ending (ListTransactions on every broker,
    through kafka-python's public admin client: not kafka2pc's code)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError as WireError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), client_id="soak-judge")
    try:
        # A broker just restarted answers COORDINATOR_LOAD_IN_PROGRESS while it reloads the
        # transaction log: Kafka says retry, so the judge asks again (for a minute at most).
        deadline = time.monotonic() + 60
        while True:
            try:
                listed = admin.list_transactions(
                    state_filters=["Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"],
                    transactional_id_pattern=f"{re.escape(prefix)}-.*",
                )
                break
            except WireError as e:
                if not e.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        admin.close()
    return sorted(f"{t.transactional_id} {t.state}" for per_broker in listed.values() for t in per_broker)


def judge(
    bootstrap: str,
    topic: str,
    prefix: str,
    runs: Sequence[Mapping[str, Any]],
    kafka_tool: Callable[[Sequence[str]], str],
    broker_ids: Sequence[int],
    open_checks: bool = True,
) -> tuple[list[Violation], dict[str, int]]:
    """Every run visible exactly once or not at all, each reported as it ended; nothing left open."""
    keys = committed_keys(bootstrap, topic)
    violations = [Violation(k.split("/")[0], f"key {k} visible {n} times") for k, n in keys.items() if n > 1]
    per_run = Counter(k.split("/")[0] for k in keys)
    # Keys tag/slot/i: one slot is one transaction, so it is visible whole or not at all.
    per_slot = Counter(tuple(k.split("/")[:2]) for k in keys if k.count("/") == 2)
    records = {r["tag"]: r["records"] for r in runs}
    violations += [
        Violation(tag, f"transaction {slot} of {tag}: {n} of {records[tag]} records visible")
        for (tag, slot), n in per_slot.items()
        if tag in records and n != records[tag]
    ]
    outcomes: Counter[str] = Counter()
    for r in runs:
        seen, want, status = per_run.get(r["tag"], 0), r["expected"], r["status"]
        if seen == want and want > 0:
            outcomes["committed"] += 1
            # A commit that died after its decision reported nothing; the next run rolled it forward.
            if status == "repaired":  # lost after its decision, then its lost slots exported again
                outcomes["repaired"] += 1
            elif status not in ("success", "died-after-decision"):
                violations.append(Violation(r["run"], f"all {want} records visible but reported {status}"))
        elif seen == 0:
            outcomes["aborted" if status == "failed" else "lost (nothing visible), reported"] += 1
            if status in ("success", "died-after-decision"):
                violations.append(Violation(r["run"], f"nothing is visible, but the run {status}"))
        elif seen < want:
            # Only the physics may split a run: the broker's timeout after the decision (struck on
            # purpose, or a broker restarted during the commit outlasting it), reported as a loss.
            physics = {"timeout:after-decision", "broker_restart:commit"}
            if status == "lost" and physics & set(r["faults"]):
                outcomes["lost (partly visible), reported"] += 1
            else:
                violations.append(Violation(r["run"], f"{seen} of {want} records visible, reported {status}"))
        else:
            violations.append(Violation(r["run"], f"{seen} records visible, {want} written"))
    if not open_checks:  # mid-soak: a killed prepare's leftovers wait for the next run's recovery
        return violations, dict(outcomes)
    listed = kafka_tool(["list"])
    for line in listed.splitlines():
        cells = line.split()
        if cells and cells[0].startswith(f"{prefix}-") and any(s in line for s in ("Ongoing", "Prepare")):
            violations.append(Violation("-", f"transaction left open: {line.strip()}"))
    for b in broker_ids:
        hanging = kafka_tool(["find-hanging", "--broker-id", str(b)])
        for line in hanging.splitlines()[1:]:
            if line.strip():
                violations.append(Violation("-", f"hanging on broker {b}: {line.strip()}"))
    return violations, dict(outcomes)


# kafka2pc's CLI exit statuses (its README): the contract under test, not its code.
CLI_OK, CLI_OPEN, CLI_LOST = 0, 1, 4


@dataclass(frozen=True)
class Truth:
    """What Kafka alone shows now: each run's visible records (by tag) and the prefix's open
    transactions (``transactional_id state``)."""

    visible: Mapping[str, int]
    open: tuple[str, ...]
    # The source group's offsets (``group_position``), read only with nothing of the prefix open;
    # None when not read or still pending.
    offsets: Mapping[str, int] | None = None


def truth(bootstrap: str, topic: str, prefix: str, source: tuple[str, str] | None = None) -> Truth:
    """``source``: the sourced runs' (group, source topic)."""
    keys = committed_keys(bootstrap, topic)
    opened = tuple(open_transactions(bootstrap, prefix))
    offsets = group_position(bootstrap, *source) if source is not None and not opened else None
    return Truth(dict(Counter(k.split("/")[0] for k in keys)), opened, offsets)


Answer = tuple[int, Any, str]  # a CLI command's exit status, its JSON (None if it printed none), its stderr


def told(
    t: Truth, runs: Sequence[Mapping[str, Any]], listed: Answer, described: Answer, prefix: str
) -> list[Violation]:
    """What ``kafka2pc list --json`` and ``describe --json`` said against the truth ``t``.

    A run partly visible with nothing of the prefix open (some of a decided run's records visible,
    the rest can never be) must be in ``losses`` with the visible and lost counts Kafka shows, and
    the status 4, until acknowledged; so must a run with nothing visible that a tool reported lost
    or whose COMMIT decision the harness saw in force (the broker aborted all of its transactions).
    A run fully visible, or invisible with neither, or acknowledged, must not be. Partly visible
    with transactions open: what is missing may still be pending (a commit died after its decision),
    and the consumer's count is a lower bound (it stops at the last stable offset).
    No loss reported: 1 if something is open, else 0. The open transactions listed are Kafka's;
    ``describe`` agrees with ``list`` on the losses and the status 4.
    """
    code, report, err = listed
    if code not in (CLI_OK, CLI_OPEN, CLI_LOST) or not isinstance(report, dict):
        return [Violation("-", f"list failed: exit {code}: {err.strip()[-600:]}", "truth")]
    out: list[Violation] = []

    def lie(run: str, what: str) -> None:
        out.append(Violation(run, what, "truth"))

    losses = [x for x in report.get("losses", []) if x.get("prefix") == prefix]
    by_run: dict[str, list[dict[str, Any]]] = {}
    for x in losses:
        by_run.setdefault(str(x.get("run")), []).append(x)
    open_ids = sorted(line.split()[0] for line in t.open)
    must_report = False
    known = set()
    for r in runs:
        run, tag, want = str(r["run"]), str(r["tag"]), int(r["expected"])
        known.add(run)
        seen, entries = t.visible.get(tag, 0), by_run.get(run, [])
        said = "; ".join(_loss_text(x) for x in entries)
        if r.get("acknowledged"):
            if entries:
                lie(run, f"acknowledged, still reported lost: {said}")
            continue
        if t.open and seen < want:
            # Something open: what is missing may still be pending (a commit died after its
            # decision), and the count is only a lower bound: a read_committed consumer stops at the
            # last stable offset (the first offset of a transaction still open), so committed records
            # written after it are not readable yet. A loss, if reported, can only agree with it.
            for x in entries:
                if int(x.get("visible_records") or 0) < seen or x.get("records") != want:
                    lie(run, f"at least {seen} of {want} visible ({len(t.open)} open); list says {_loss_text(x)}")
            if r.get("loss_reported") and not entries:
                lie(run, f"reported lost by a tool, not acknowledged ({len(t.open)} open): list reports no loss")
            must_report |= bool(r.get("loss_reported")) or any(int(x.get("lost_records") or 0) for x in entries)
        elif 0 < seen < want:  # nothing open: the count is exact, and the rest can never be visible
            must_report = True
            if len(entries) != 1:
                lie(run, f"{seen} of {want} visible, nothing open: list reports it {len(entries)} time(s) {said}")
                continue
            x = entries[0]
            counts = (x.get("records"), x.get("visible_records"), x.get("lost_records"), x.get("partly_visible"))
            if counts != (want, seen, want - seen, True):
                lie(run, f"{seen} of {want} records visible, {want - seen} lost; list says {said}")
        elif seen == 0 and (r.get("loss_reported") or r.get("commit_decided")):
            # Nothing visible under a COMMIT in force (the broker aborted every transaction): lost.
            must_report = True
            if len(entries) != 1 or (entries[0].get("visible_records"), entries[0].get("lost_records")) != (0, want):
                why = "reported lost by a tool" if r.get("loss_reported") else "a COMMIT decided"
                lie(run, f"{why}, nothing visible of {want}: list says {said or 'no loss'}")
        elif entries:  # all visible, or nothing (nothing open) and never reported lost
            lie(run, f"{seen} of {want} records visible ({len(t.open)} open), yet list reports a loss: {said}")
    for run, entries in by_run.items():
        if run not in known:
            lie(run, f"list reports a loss of a run no run of the soak is: {'; '.join(map(_loss_text, entries))}")
    want_code = CLI_LOST if losses else CLI_OPEN if t.open else CLI_OK
    if code != want_code or (must_report and code != CLI_LOST):
        lie("-", f"list exit {code}, expected {CLI_LOST if must_report else want_code} ({len(losses)} loss(es), "
                 f"{len(t.open)} open)")  # fmt: skip
    listed_ids = sorted(str(x.get("transactional_id")) for x in report.get("transactions", []))
    if listed_ids != open_ids:
        lie("-", f"list shows open {listed_ids}, Kafka {list(t.open)}")
    d_code, d_report, d_err = described
    if d_code not in (CLI_OK, CLI_LOST) or not isinstance(d_report, dict):
        lie("-", f"describe failed: exit {d_code}: {d_err.strip()[-600:]}")
    else:
        d_losses = sorted((str(x.get("run")), str(x.get("decision_id"))) for x in d_report.get("losses", []))
        l_losses = sorted((str(x.get("run")), str(x.get("decision_id"))) for x in losses)
        if (d_code == CLI_LOST) != (code == CLI_LOST) or d_losses != l_losses:
            lie("-", f"describe exit {d_code} losses {d_losses}; list exit {code} losses {l_losses}")
    return out


def _loss_text(x: Mapping[str, Any]) -> str:
    return (
        f"[{x.get('run')} decision {x.get('decision_id')} final={x.get('final')}: {x.get('visible_records')} of "
        f"{x.get('records')} visible, {x.get('lost_records')} lost, {x.get('pending_transactions')} pending, "
        f"partly_visible={x.get('partly_visible')}]"
    )
