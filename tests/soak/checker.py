"""The soak's judge. It reads Kafka directly and shares no code with kafka2pc.

It knows only what the harness promised (each run's tag, its record count and what the tools
reported) and what Kafka shows: a read_committed consumer of the data topic, and Kafka's own
TransactionsCommand (``list`` and ``find-hanging``).
"""

from __future__ import annotations

import re
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


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    """The prefix's transactions Kafka lists as Ongoing or ending (ListTransactions on every broker,
    through kafka-python's public admin client: not kafka2pc's code)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","), client_id="soak-judge")
    try:
        listed = admin.list_transactions(
            state_filters=["Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"],
            transactional_id_pattern=f"{re.escape(prefix)}-.*",
        )
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
            if status not in ("success", "died-after-decision"):
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
