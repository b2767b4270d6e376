"""Looking at transactions on the broker: coordinators, descriptions, and an exporter's open ids."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import principal_of
from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.errors import (
    BrokerErrorResponse,
    KafkaAuthorizationError,
    RetriableCoordinatorError,
    error_name,
)
from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.kafka.wire import TxnListing, TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, CoordinatorError
from airflow_provider_kafka2pc.txn.protocol.outcome import RETRIABLE, TRANSACTIONAL_ID_NOT_FOUND

log = logging.getLogger(__name__)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


def probe_id(prefix: str) -> str:
    """An id under ``prefix`` that no exporter ever uses (a slot is a number): asking the broker about
    it tells whether this principal may see the prefix's transactions at all."""
    return f"{prefix}{naming.DELIMITER}probe"


def not_allowed(wire: WireClient, transactional_id: str, prefix: str | None = None) -> KafkaAuthorizationError:
    """Kafka answers a principal without Describe on a transactional id with an error where it can,
    and leaves the id out of ListTransactions where it cannot: never read that as "nothing there"."""
    return KafkaAuthorizationError(
        getattr(wire, "principal", "") or "User:<this client>",
        "TransactionalId",
        prefix if prefix is not None else transactional_id,
        "Describe",
        "PREFIXED" if prefix is not None else "LITERAL",
        "so its transactions cannot be listed or described; docs/acls.md grants Write on the prefix, "
        "which implies Describe",
        bootstrap=getattr(wire, "bootstrap", "") or "the-brokers:9092",
    )


def coordinator_error(code: int, what: str) -> CoordinatorError:
    """A coordinator's error code as the error to raise: ``retry`` waits out a retriable one."""
    if code in RETRIABLE:
        return RetriableCoordinatorError(code, what, error_name(code))
    return CoordinatorError(f"{what}: {error_name(code)}")


class TransactionInspector:
    """Batched FindCoordinator / DescribeTransactions / ListTransactions with retries."""

    def __init__(self, wire: WireClient, timeout_s: float = 60.0) -> None:
        self.wire = wire
        self.timeout_s = timeout_s

    def coordinators(self, transactional_ids: Sequence[str]) -> dict[str, int]:
        def go() -> dict[str, int]:
            found = self.wire.find_transaction_coordinators(transactional_ids)
            for tid in transactional_ids:
                c = found.get(tid)
                if c is not None and c.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                    raise not_allowed(self.wire, tid)
                if c is None or c.error_code:
                    code = c.error_code if c is not None else 15
                    raise RetriableCoordinatorError(code, f"FindCoordinator({tid!r})", error_name(code))
            return {tid: c.node_id for tid, c in found.items()}

        return retry("FindCoordinator", go, self.timeout_s) if transactional_ids else {}

    def describe(self, transactional_ids: Iterable[str]) -> dict[str, TxnState | None]:
        """The broker's view of each id; None where the broker does not know it."""
        tids = sorted(set(transactional_ids))

        def go() -> dict[str, TxnState | None]:
            # Looked up afresh on every attempt: the describe is routed to what this finds, so a
            # NOT_COORDINATOR after a move is cured by the retry.
            self.coordinators(tids)
            out: dict[str, TxnState | None] = {}
            for tid, s in self.wire.describe_transactions(tids).items():
                if s.error_code == TRANSACTIONAL_ID_NOT_FOUND:
                    out[tid] = None
                elif s.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                    raise not_allowed(self.wire, tid)
                elif s.error_code:
                    raise coordinator_error(s.error_code, f"DescribeTransactions({tid!r})")
                else:
                    out[tid] = s
            return out

        return retry("DescribeTransactions", go, self.timeout_s) if tids else {}

    def list_prefix(self, prefix: str, states: Sequence[str] = OPEN_STATES) -> list[TxnListing]:
        """Transactions of exactly this exporter's prefix: the broker filters by pattern where it can,
        and we always filter again, delimiter-aware."""
        self.check_visible(prefix)
        pattern = naming.broker_pattern(prefix)

        def go() -> list[TxnListing]:
            try:
                return self.wire.list_transactions(states, pattern, prefix, self.timeout_s)
            except BrokerErrorResponse as e:  # e.g. a broker loading its transaction log: retriable
                raise coordinator_error(e.code, e.request) from e

        listings = retry("ListTransactions", go, self.timeout_s)
        return sorted(
            (t for t in listings if naming.belongs_to(t.transactional_id, prefix)),
            key=lambda t: t.transactional_id,
        )

    def check_visible(self, prefix: str) -> None:
        """Raise ``KafkaAuthorizationError`` if this principal may not see ``prefix``'s transactions:
        ListTransactions would silently leave them out."""
        try:
            self.describe([probe_id(prefix)])
        except KafkaAuthorizationError as e:
            raise not_allowed(self.wire, e.resource, prefix) from None

    def describe_prefix(self, prefix: str, states: Sequence[str] = OPEN_STATES) -> list[TxnState]:
        described = self.describe([t.transactional_id for t in self.list_prefix(prefix, states)])
        return [s for s in described.values() if s is not None and s.state in states]


def broker_max_transaction_timeout_ms(config: Mapping[str, Any], timeout_s: float = 30.0) -> int:
    """The broker's cap ``transaction.max.timeout.ms``: the longest a prepared transaction may live."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient(with_log(connection_only(config)))
    unavailable = (
        f"cannot read the broker's transaction.max.timeout.ms from {config.get('bootstrap.servers')} within "
        f"{timeout_s:g} s; retry once Kafka answers, or set transaction_timeout_ms (producer setting "
        "transaction.timeout.ms) so that it need not be read"
    )
    try:
        md = admin.list_topics(timeout=timeout_s)
        broker = str(min(md.brokers))
        res = ConfigResource(ConfigResource.Type.BROKER, broker)
        # The future's own wait outlasts the request's, so that the request's error is the one seen.
        entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout=timeout_s + 5)
    except TimeoutError as e:
        raise BrokerUnavailableError(unavailable) from e
    except KafkaException as e:
        if e.args[0].name() != "CLUSTER_AUTHORIZATION_FAILED":
            raise BrokerUnavailableError(f"{unavailable}: {e}") from e
        raise KafkaAuthorizationError(
            principal_of(config),
            "Cluster",
            "kafka-cluster",
            "DescribeConfigs",
            detail="to read transaction.max.timeout.ms; or set transaction_timeout_ms (producer setting "
            "transaction.timeout.ms) and no cluster ACL is needed",
            bootstrap=str(config.get("bootstrap.servers", "")),
        ) from e
    return int(entries["transaction.max.timeout.ms"].value)
