"""A listing of open transactions that is complete before anything decides on it (DESIGN §15).

ListTransactions answers from the ``__transaction_state`` partitions a broker has loaded, with no
error for the ones it has not: while leadership of a partition moves (a restart, a preferred
leader election), the old leader unloads it before the new one loads it, and for 75-374 ms no
broker lists its transactions. A client that lost a broker from its metadata asks only the others,
for good. Either way recovery would say "done" with a transaction still open.

So a listing is taken between two checks of the same thing: for every partition of the
transaction log, the broker that leads it (by its own word, its leader epoch) has it loaded (a
DescribeTransactions of a probe id that hashes to that partition answers from it, not "not the
coordinator" or "loading"). Same leaders, same epochs, every partition loaded before and after:
then each partition was listed once, by its owner. Otherwise the pass is taken again, until the
deadline, and then fails naming the partitions that were not covered.

Reading the transaction log's metadata needs Describe on ``__transaction_state``; whether this
principal has it is learnt once per client from a Metadata request for every topic (the broker
answers with the authorized ones and logs no denial, where asking for the topic by name would log
one per listing). A principal without it (or a cluster where no transaction ever began, so the
topic does not exist yet) gets the plain listing of every broker the client knows, after a
metadata refresh (a rejoined broker relearned).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from airflow_provider_kafka2pc.txn.kafka.errors import BrokerErrorResponse, error_name, is_connection_error
from airflow_provider_kafka2pc.txn.protocol.errors import CoordinatorError
from airflow_provider_kafka2pc.txn.protocol.naming import DELIMITER

log = logging.getLogger(__name__)

TRANSACTION_LOG = "__transaction_state"
_TOPIC_AUTHORIZATION_FAILED = 29
_UNKNOWN_TOPIC_OR_PARTITION = 3
_TRANSACTIONAL_ID_NOT_FOUND = 105


class Lists(Protocol):
    """The wire client's calls a complete listing uses (``WireClient``)."""

    def request(self, request: Any, node_id: int | None = None) -> Any: ...
    def refresh_brokers(self) -> None: ...
    def sees_transaction_log(self) -> bool: ...
    def supports_list_pattern(self) -> bool: ...


@dataclass(frozen=True)
class Listed:
    transactional_id: str
    producer_id: int
    state: str


def java_partition(transactional_id: str, partitions: int) -> int:
    """The transaction log's partition of an id, as the broker computes it: ``Utils.abs(id.hashCode())
    % partitions``, Java's String hash over UTF-16 code units."""
    units = transactional_id.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if signed == -(1 << 31) else abs(signed) % partitions


@cache
def probe_ids(prefix: str, partitions: int) -> tuple[str, ...]:
    """One id under ``prefix`` per partition of the transaction log, never an exporter's (a slot is a
    number): the probes that ask each partition's owner whether it has the partition loaded."""
    found: dict[int, str] = {}
    k = 0
    while len(found) < partitions:
        tid = f"{prefix}{DELIMITER}probe{k}"
        found.setdefault(java_partition(tid, partitions), tid)
        k += 1
    return tuple(found[p] for p in range(partitions))


def leaders(wire: Lists, node_id: int | None = None) -> dict[int, tuple[int, int]] | None:
    """The transaction log's partitions -> (leader, leader epoch), as ``node_id`` (any broker when
    None) sees them; None when this principal may not describe the topic, or the broker knows none."""
    return _metadata(wire, node_id)[0]


def newest_leaders(wire: Lists) -> dict[int, tuple[int, int]] | None:
    """Every broker's view merged, the highest leader epoch of each partition winning: a broker whose
    metadata lags (cut off from the controller, or not yet told of a move) is not believed alone."""
    view, brokers = _metadata(wire, None)
    if not view:
        return None
    for node in brokers:
        try:
            other = _metadata(wire, node)[0] or {}
        except Exception as e:  # a broker that is down leads nothing its peers agree to; its partitions are asked below
            if not (is_connection_error(e) or _unknown_broker(e)):
                raise
            continue
        for p, (leader, epoch) in other.items():
            if p not in view or epoch > view[p][1]:
                view[p] = (leader, epoch)
    return view


def _metadata(wire: Lists, node_id: int | None) -> tuple[dict[int, tuple[int, int]] | None, list[int]]:
    from kafka.protocol.metadata import MetadataRequest

    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=TRANSACTION_LOG)], allow_auto_topic_creation=False
    )
    answer = wire.request(request, node_id)
    brokers = sorted(int(b.node_id) for b in answer.brokers)
    [topic] = answer.topics
    if topic.error_code in (_TOPIC_AUTHORIZATION_FAILED, _UNKNOWN_TOPIC_OR_PARTITION):
        return None, brokers  # not ours to describe, or no transaction ever began (as far as it knows)
    if topic.error_code:
        raise BrokerErrorResponse("Metadata(__transaction_state)", int(topic.error_code), error_name(topic.error_code))
    return {int(p.partition_index): (int(p.leader_id), int(p.leader_epoch)) for p in topic.partitions}, brokers


def _unloaded(wire: Lists, owners: Mapping[int, tuple[int, int]], probes: Sequence[str]) -> dict[int, str]:
    """Partitions whose leader does not answer for them now (by its own metadata and its coordinator)."""
    from kafka.protocol.admin.transactions import DescribeTransactionsRequest

    missing: dict[int, str] = {}
    by_node: dict[int, list[int]] = {}
    for p, (node, _epoch) in owners.items():
        if node < 0:
            missing[p] = "no leader"
        else:
            by_node.setdefault(node, []).append(p)
    for node, parts in sorted(by_node.items()):
        own = leaders(wire, node) or {}
        for p in parts:
            if own.get(p) != owners[p]:
                missing[p] = f"broker {node} does not say it leads it at epoch {owners[p][1]} (it says {own.get(p)})"
        asked = {probes[p]: p for p in parts if p not in missing}
        if not asked:
            continue
        answer = wire.request(DescribeTransactionsRequest(transactional_ids=list(asked)), node)
        for row in answer.transaction_states:
            p = asked[str(row.transactional_id)]
            if row.error_code not in (0, _TRANSACTIONAL_ID_NOT_FOUND):
                missing[p] = f"broker {node} answers {error_name(row.error_code)} for it"
    return missing


def _list_on(wire: Lists, nodes: Sequence[int], states: Sequence[str], pattern: str | None) -> list[Listed]:
    from kafka.protocol.admin.transactions import ListTransactionsRequest

    use_pattern = pattern is not None and wire.supports_list_pattern()
    out: list[Listed] = []
    for node in nodes:
        kwargs: dict[str, Any] = {"state_filters": list(states), "producer_id_filters": []}
        if use_pattern:
            kwargs.update(transactional_id_pattern=pattern, min_version=2)
        answer = wire.request(ListTransactionsRequest(**kwargs), node)
        if answer.error_code:  # e.g. COORDINATOR_LOAD_IN_PROGRESS while it loads a partition
            raise BrokerErrorResponse("ListTransactions", int(answer.error_code), error_name(answer.error_code))
        out += [
            Listed(str(t.transactional_id), int(t.producer_id), str(t.transaction_state))
            for t in answer.transaction_states
        ]
    return out


def complete_listing(
    wire: Lists, prefix: str, states: Sequence[str], pattern: str | None, timeout_s: float
) -> list[Listed] | None:
    """Every transaction in ``states`` of the whole cluster (``pattern`` filters where the broker can),
    each transaction-log partition listed once by its loaded owner; None when this principal may not
    read the transaction log's metadata (the caller lists as before)."""
    if not wire.sees_transaction_log():
        log.debug("%s not described (no Describe, or not made yet): listing %s as before", TRANSACTION_LOG, prefix)
        return None
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            before = newest_leaders(wire)
            if before is None:
                log.debug(
                    "%s not described (no Describe, or not made yet): listing %s as before", TRANSACTION_LOG, prefix
                )
                return None
            listed, missing = _covered_once(wire, prefix, before, states, pattern)
            if not missing:
                return listed
        except Exception as e:  # a broker going or coming back: ask again, the deadline bounds it
            if not (isinstance(e, BrokerErrorResponse) or is_connection_error(e) or _unknown_broker(e)):
                raise
            missing = {-1: f"{type(e).__name__}: {e}"}
        if time.monotonic() + delay > deadline:
            named = "; ".join(
                f"{TRANSACTION_LOG}-{p}: {why}" if p >= 0 else why for p, why in sorted(missing.items())[:10]
            )
            raise CoordinatorError(
                f"the open transactions of {prefix} could not be listed completely within {timeout_s:g} s: "
                f"{len(missing)} partition(s) of the transaction log had no loaded owner that answered ({named}). "
                "Nothing was decided on a partial listing; retry once the cluster settles"
            )
        log.debug("listing of %s not complete yet (%s); asking again", prefix, missing)
        try:
            wire.refresh_brokers()  # a broker that rejoined is known again
        except Exception as e:
            if not is_connection_error(e):
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _covered_once(
    wire: Lists, prefix: str, before: dict[int, tuple[int, int]], states: Sequence[str], pattern: str | None
) -> tuple[list[Listed], dict[int, str]]:
    """One pass: (the listing, {}) if every partition was loaded by the same owner before and after it."""
    probes = probe_ids(prefix, len(before))
    missing = _unloaded(wire, before, probes)
    if missing:
        return [], missing
    listed = _list_on(wire, sorted({node for node, _ in before.values()}), states, pattern)
    after = newest_leaders(wire)
    if after != before:
        return [], {p: "its leader moved while listing" for p in before if (after or {}).get(p) != before[p]}
    return listed, _unloaded(wire, after, probes)


def _unknown_broker(e: Exception) -> bool:
    return type(e).__name__ in ("UnknownBrokerIdError", "NodeNotReadyError")


__all__ = ["TRANSACTION_LOG", "Listed", "complete_listing", "java_partition", "probe_ids"]
