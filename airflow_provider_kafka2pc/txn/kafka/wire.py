"""The one adapter over kafka-python's protocol classes and networking internals.

kafka2pc needs five Kafka APIs that librdkafka does not expose to another process:
FindCoordinator, EndTxn, TxnOffsetCommit, DescribeTransactions and ListTransactions.
ListTransactions and DescribeTransactions go through kafka-python's public
``KafkaAdminClient.list_transactions`` and ``describe_transactions``. The other two use
kafka-python's generated protocol classes over its private connection manager: FindCoordinator
because kafka-python has no public call for it (its internal one answers from a cache that is never
invalidated, and we must see a moved coordinator), EndTxn and TxnOffsetCommit because no public API
ends, or writes into, another process's transaction. Each fresh FindCoordinator answer is also
recorded in kafka-python's coordinator cache, which is what its public ``describe_transactions`` routes by. The private
names change between releases, so kafka-python's version is bounded and every private name we
touch is used here and only here (``tests/unit/test_wire_surface.py`` fails loudly when an
upgrade moves one).

The admin client logs its whole configuration at DEBUG; ``config.protect_kafka_python_logs``
redacts the credentials from every kafka-python log record before any handler sees it.

Everything returns raw Kafka error codes: what they mean is decided by ``outcome.py`` after a
fresh DescribeTransactions, never guessed here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.broker_support import check_api_versions
from airflow_provider_kafka2pc.txn.kafka.config import kafka_python_settings, protect_kafka_python_logs, write_pem_files
from airflow_provider_kafka2pc.txn.kafka.errors import BrokerErrorResponse
from airflow_provider_kafka2pc.txn.kafka.listing import complete_listing
from airflow_provider_kafka2pc.txn.kafka.markers import Fate, PartitionFate, transaction_fate
from airflow_provider_kafka2pc.txn.kafka.reachability import (
    DEFAULT_CONNECT_TIMEOUT_S,
    answering_bootstrap,
    check_reachable,
)
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError
from airflow_provider_kafka2pc.txn.protocol.outcome import TxnRef

# librdkafka opens transactions under transaction version 1 (EndTxn <= 4, AddPartitionsToTxn
# v0..3). EndTxn v5 would ask the coordinator for version-2 rules (epoch bump on every end),
# which would not match the transaction librdkafka started. Pin it, and keep it pinned on retry.
END_TXN_MAX_VERSION = 4
_TRANSACTION_COORDINATOR = 1  # CoordinatorType.TRANSACTION on the wire
_GROUP_COORDINATOR = 0  # CoordinatorType.GROUP
_INIT_PRODUCER_ID_KEY = 22
_FETCH_KEY = 1
_FETCH_VERSION_OF_KAFKA_3_7 = 16  # the Kafka line that verifies transactional offset commits
_KIP939_INIT_PRODUCER_ID_VERSION = 6  # InitProducerId v6 carries Enable2Pc / KeepPreparedTxn


@dataclass(frozen=True)
class Coordinator:
    node_id: int
    error_code: int


@dataclass(frozen=True)
class TxnState:
    """One row of DescribeTransactions."""

    transactional_id: str
    error_code: int
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int
    topic_partitions: tuple[tuple[str, int], ...]
    coordinator_id: int


@dataclass(frozen=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


def kafka_python_config(librdkafka_config: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python's settings for a librdkafka connection config (inline PEMs not written: see WireClient)."""
    return kafka_python_settings(librdkafka_config)[0]


def kafka_python_token_provider(provider: Any) -> Any:
    """kafka-python takes only subclasses of its ``AbstractTokenProvider``: wrap ours (``config.OidcTokenProvider``)."""
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class TokenProvider(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            return str(provider.token())

        def extensions(self) -> dict[str, str]:
            return dict(provider.extensions())

        def __repr__(self) -> str:  # logged with the client's configuration: the provider's own, secret-free
            return repr(provider)

    return TokenProvider()


class WireClient:
    """A kafka-python admin connection used for the raw transaction APIs."""

    def __init__(
        self,
        config: Mapping[str, Any],
        request_timeout_ms: int = 15000,
        bootstrap_timeout_ms: int = int(DEFAULT_CONNECT_TIMEOUT_S * 1000),
        reachable: bool = False,
    ) -> None:
        """``bootstrap_timeout_ms``: the connect timeout. ``reachable``: ``reachability.check_connection``
        has just passed with this config (the caller's first client), so it is not asked again."""
        from kafka import KafkaAdminClient

        from airflow_provider_kafka2pc.txn.kafka.access import principal_of

        cfg, pems = kafka_python_settings(config)
        self.principal = principal_of(config)  # named in permission errors, with the cluster
        self.bootstrap = str(config.get("bootstrap.servers", ""))
        cfg.setdefault("client_id", "kafka2pc")
        # kafka-python retries a refused connection, SASL or TLS handshake until its bootstrap deadline
        # and then says only "Unable to bootstrap"; librdkafka names the cause, mostly at once.
        if not reachable:
            check_reachable(config, timeout_s=bootstrap_timeout_ms / 1000)
        knocked_at = time.monotonic()
        cfg["bootstrap_servers"] = answering_bootstrap(cfg["bootstrap_servers"], bootstrap_timeout_ms / 1000)
        # kafka-python gets what is left of the deadline, so that the whole wait stays within it.
        left_ms = max(1000, bootstrap_timeout_ms - int((time.monotonic() - knocked_at) * 1000))
        # Before the admin client exists: its constructor logs ``cfg`` (password included) at DEBUG.
        protect_kafka_python_logs(cfg)
        self._request_timeout_ms = request_timeout_ms
        self._sees_transaction_log = False
        files, self._pem_dir = write_pem_files(pems)
        cfg.update(files)
        if "sasl_oauth_token_provider" in cfg:
            cfg["sasl_oauth_token_provider"] = kafka_python_token_provider(cfg["sasl_oauth_token_provider"])
        try:
            self._admin = KafkaAdminClient(request_timeout_ms=request_timeout_ms, bootstrap_timeout_ms=left_ms, **cfg)
        except Exception as e:
            self._remove_pem_files()
            # librdkafka answered just now: this is the commit side's client alone (or a broker that
            # went away in between); say so rather than blame the network.
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {self.bootstrap} with the commit side's client (kafka-python) within "
                f"{bootstrap_timeout_ms / 1000:g} s, though librdkafka reached it: {type(e).__name__}: {e}"
            ) from e
        finally:
            protect_kafka_python_logs(cfg)  # again, for loggers of modules imported while connecting
        self._manager = self._admin._manager  # private: the async connection manager
        try:
            self.check_broker()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self._admin.close()
        finally:
            self._remove_pem_files()

    def _remove_pem_files(self) -> None:
        if self._pem_dir is not None:
            import shutil

            shutil.rmtree(self._pem_dir, ignore_errors=True)
            self._pem_dir = None

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro_fn: Any, *args: Any) -> Any:
        return self._manager.run(coro_fn, *args)

    async def _send(self, request: Any, node_id: int | None = None) -> Any:
        import kafka.errors as Errors

        try:
            return await self._manager.send(request, node_id=node_id, request_timeout_ms=self._request_timeout_ms)
        except Errors.Cancelled:
            # The connection closed under the request, cleanly, before its answer: a broker restarted
            # while this process was stopped (SIGSTOP, a frozen VM) and the first request after the
            # resume went out on the socket its FIN had already ended (the soak's paused repair).
            # Sent once more, on a new connection; a second failure is the caller's to judge.
            return await self._manager.send(request, node_id=node_id, request_timeout_ms=self._request_timeout_ms)

    def request(self, request: Any, node_id: int | None = None) -> Any:
        """One request of kafka-python's generated protocol classes (public), answered by ``node_id``
        (None: any broker); for ``txn.kafka.markers``, which reads data partitions' batches."""

        async def go() -> Any:
            return await self._send(request, node_id)

        return self._run(go)

    def transaction_fate(
        self, ref: TxnRef, partitions: Sequence[str], since_ms: int, timeout_s: float
    ) -> tuple[Fate, tuple[PartitionFate, ...]]:
        """What became of ``ref``'s records, read from its data partitions (``txn.kafka.markers``)."""
        return transaction_fate(self, ref, partitions, since_ms, timeout_s)

    def broker_ids(self) -> list[int]:
        return sorted(int(b.node_id) for b in self._manager.cluster.brokers())

    def topics(self) -> set[str]:
        """Every topic name on the cluster (public admin API)."""
        return {str(t) for t in self._admin.list_topics()}

    def find_transaction_coordinators(self, transactional_ids: Sequence[str]) -> dict[str, Coordinator]:
        """FindCoordinator(TRANSACTION), batched (v4+); always asked, never answered from a cache, so a
        moved coordinator is seen. The answers replace kafka-python's cached ones for the next describe."""
        from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest

        async def go() -> dict[str, Coordinator]:
            request = FindCoordinatorRequest(
                key_type=_TRANSACTION_COORDINATOR, coordinator_keys=list(transactional_ids), min_version=4
            )
            response = await self._send(request)
            cache = self._manager.cluster  # the public describe_transactions routes by its coordinators
            for c in response.coordinators:
                if not c.error_code:
                    cache.add_coordinator(c, CoordinatorType.TRANSACTION, c.key, synthesize_node_id=False)
            return {c.key: Coordinator(int(c.node_id), int(c.error_code)) for c in response.coordinators}

        return self._run(go) if transactional_ids else {}

    def end_txn(self, node_id: int, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """EndTxn at a pinned version; returns the Kafka error code (0 = NONE)."""
        from kafka.protocol.producer.transaction import EndTxnRequest

        async def go() -> int:
            request = EndTxnRequest(
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                committed=commit,
                max_version=END_TXN_MAX_VERSION,
            )
            response = await self._send(request, node_id)
            return int(response.error_code)

        return int(self._run(go))

    def init_producer_id(self, node_id: int, transactional_id: str, timeout_ms: int) -> tuple[int, int, int]:
        """InitProducerId of ``transactional_id`` at its coordinator ``node_id``, below the 2PC version
        (KIP-939): ``(error code, producer id, epoch)``, the epoch the broker gave this request alone."""
        from kafka.protocol.producer.transaction import InitProducerIdRequest

        async def go() -> tuple[int, int, int]:
            request = InitProducerIdRequest(
                transactional_id=transactional_id,
                transaction_timeout_ms=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
                max_version=_KIP939_INIT_PRODUCER_ID_VERSION - 1,
            )
            response = await self._send(request, node_id)
            return int(response.error_code), int(response.producer_id), int(response.producer_epoch)

        return self._run(go)  # type: ignore[no-any-return]

    def txn_offset_commit(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: Mapping[tuple[str, int], int],
    ) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit into the open transaction of (id, producer id, epoch), as a group without
        members (generation -1, no member id), sent to the group's coordinator; Kafka's error code per
        partition (0 = NONE), or one code for all when the group's coordinator cannot be found.

        The transaction already holds the group's offsets partition (the prepare's AddOffsetsToTxn), so
        this adds nothing to it: it appends the same offsets again, later in the offsets log than any
        regular commit made meanwhile, which is what the broker compares when the transaction commits."""
        from kafka.protocol.metadata import FindCoordinatorRequest
        from kafka.protocol.producer.transaction import TxnOffsetCommitRequest

        Topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append(
                Topic.TxnOffsetCommitRequestPartition(
                    partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
                )
            )

        async def go() -> dict[tuple[str, int], int]:
            found = await self._send(
                FindCoordinatorRequest(key_type=_GROUP_COORDINATOR, coordinator_keys=[group_id], min_version=4)
            )
            [c] = found.coordinators
            if c.error_code:
                return dict.fromkeys(offsets, int(c.error_code))
            request = TxnOffsetCommitRequest(
                transactional_id=transactional_id,
                group_id=group_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                topics=[Topic(name=t, partitions=ps) for t, ps in topics.items()],
            )
            response = await self._send(request, int(c.node_id))
            return {
                (str(t.name), int(p.partition_index)): int(p.error_code) for t in response.topics for p in t.partitions
            }

        return dict(self._run(go)) if offsets else {}

    def describe_transactions(self, transactional_ids: Sequence[str]) -> dict[str, TxnState]:
        """DescribeTransactions (kafka-python's public API), one row per id, per-id error codes kept.

        kafka-python routes each id to the coordinator in its cache, which
        ``find_transaction_coordinators`` refreshes: callers look the coordinators up first. The public
        call raises on the first per-id error (TRANSACTIONAL_ID_NOT_FOUND, NOT_COORDINATOR, ...) and
        drops the other rows, so after such an error every id is asked alone and its error code kept.
        """
        import kafka.errors as Errors

        ids = list(transactional_ids)
        if len(ids) > 1:
            try:
                return {tid: _txn_state(tid, d) for tid, d in self._admin.describe_transactions(ids).items()}
            except Errors.BrokerResponseError:
                pass  # one id's error hid the others' rows: ask one by one below
        return dict(self._describe_one(tid) for tid in ids)

    def _describe_one(self, transactional_id: str) -> tuple[str, TxnState]:
        import kafka.errors as Errors

        try:
            [d] = self._admin.describe_transactions([transactional_id]).values()
        except Errors.BrokerResponseError as e:
            return transactional_id, TxnState(transactional_id, int(e.errno), "", -1, -1, -1, -1, (), -1)
        return transactional_id, _txn_state(transactional_id, d)

    def sees_transaction_log(self) -> bool:
        """Whether this principal may describe ``__transaction_state`` and it exists: by a Metadata
        request for every topic, which the broker answers with the authorized ones and no DENIED line
        (asking for the topic by name would log one per listing). A yes is kept for the client's life;
        a no is asked again (the topic appears with the cluster's first transaction)."""
        if not self._sees_transaction_log:
            from kafka.protocol.metadata import MetadataRequest

            answer = self.request(MetadataRequest(topics=None, allow_auto_topic_creation=False))
            self._sees_transaction_log = any(str(t.name) == "__transaction_state" for t in answer.topics)
        return self._sees_transaction_log

    def refresh_brokers(self) -> None:
        """Metadata asked again now: kafka-python forgets a broker that was fenced and relearns it only here."""
        self._run(self._manager.cluster.refresh_metadata)

    def list_transactions(
        self, states: Iterable[str], pattern: str | None, prefix: str | None = None, timeout_s: float = 30.0
    ) -> list[TxnListing]:
        """With ``prefix``: ``listing.complete_listing`` (every transaction-log partition listed once by
        its loaded owner, probes under the prefix), where this principal may describe the transaction
        log. Otherwise, ListTransactions on every broker (kafka-python's public API), sorted by broker id.

        The pattern filter is sent only where the broker has it (ListTransactions v2, Kafka 4.1+);
        callers filter again themselves. Only the states asked for come back, so kafka-python's
        ``TransactionState`` conversion never meets a state it does not know. A broker's error code
        is raised as ``BrokerErrorResponse`` with the code (COORDINATOR_LOAD_IN_PROGRESS while any of
        its transaction log's partitions loads: after a start, a restart or a leader move).
        """
        import kafka.errors as Errors

        states = list(states)
        if prefix is not None:
            complete = complete_listing(self, prefix, states, pattern, timeout_s)
            if complete is not None:
                return [TxnListing(t.transactional_id, t.producer_id, t.state) for t in complete]
            self.refresh_brokers()  # at least every broker the cluster has now
        use_pattern = pattern is not None and self.supports_list_pattern()
        try:
            by_broker = self._admin.list_transactions(
                state_filters=list(states), transactional_id_pattern=pattern if use_pattern else None
            )
        except Errors.BrokerResponseError as e:  # e.g. a broker still loading its transaction log
            raise BrokerErrorResponse("ListTransactions", int(e.errno), type(e).__name__) from e
        return [
            TxnListing(str(t.transactional_id), int(t.producer_id), _state_name(t.state))
            for node_id in sorted(by_broker)
            for t in by_broker[node_id]
        ]

    def _api_max_version(self, api_key: int) -> int:
        versions = self._manager.broker_version_data.api_versions or {}
        entry = versions.get(api_key)
        return int(entry[1]) if entry else -1

    def check_broker(self) -> None:
        """Refuse a broker without the transaction APIs kafka2pc needs (Kafka < 3.0), before this
        client or any writer opens or ends a transaction: ``broker_support.UnsupportedBrokerError``.
        Reads the ApiVersions answer kafka-python got when it connected: no request of its own."""
        data = self._manager.broker_version_data
        # The raw answer, keyed by number: kafka-python's public api_versions() turns each key into its
        # ApiKey enum and raises on one it does not know (Kafka 4.4 answers key 93).
        versions = {int(k): (int(v[0]), int(v[1])) for k, v in (data.api_versions or {}).items()}
        version = getattr(data, "broker_version_str", None)  # kafka-python's reading of the versions
        check_api_versions(self.bootstrap, versions, str(version) if version else None)

    def supports_list_pattern(self) -> bool:
        from kafka.protocol.admin.transactions import ListTransactionsRequest

        return self._api_max_version(ListTransactionsRequest.API_KEY) >= 2

    def verifies_txn_offset_commits(self) -> bool:
        """Whether the broker checks a TxnOffsetCommit against the transaction it claims (KAFKA-15449,
        Kafka 3.7, read from ApiVersions: 3.7 is the first with Fetch v16, KIP-951). An older one takes
        it for a transaction already ended and keeps a pending offset commit no coordinator will end."""
        return self._api_max_version(_FETCH_KEY) >= _FETCH_VERSION_OF_KAFKA_3_7

    def supports_kip939(self) -> bool:
        """True when the broker advertises 2PC participation (KIP-939); we do not depend on it."""
        return self._api_max_version(_INIT_PRODUCER_ID_KEY) >= _KIP939_INIT_PRODUCER_ID_VERSION


def _txn_state(transactional_id: str, d: Any) -> TxnState:
    """Our row for kafka-python's public ``TransactionDescription``."""
    return TxnState(
        transactional_id=transactional_id,
        error_code=0,
        state=_state_name(d.state),
        producer_id=int(d.producer_id),
        producer_epoch=int(d.producer_epoch),
        timeout_ms=int(d.transaction_timeout_ms),
        start_time_ms=int(d.transaction_start_time_ms),
        topic_partitions=tuple(sorted((str(tp.topic), int(tp.partition)) for tp in d.topic_partitions)),
        coordinator_id=int(d.coordinator_id),
    )


def _state_name(state: Any) -> str:
    """kafka-python's ``TransactionState`` is a str Enum; keep the broker's wire value."""
    return str(getattr(state, "value", state))
