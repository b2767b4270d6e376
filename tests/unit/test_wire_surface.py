"""The kafka-python surface behind ``txn/kafka/wire.py``: an upgrade that moves it must fail here, loudly.

The adapter's own calls are also run against a connection manager that speaks kafka-python's
real protocol classes (encode, decode, version negotiation) without a socket.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kafka
import kafka.cluster
import kafka.errors
import pytest
from kafka.admin._transactions import (
    TransactionDescription,
    TransactionListing,
    TransactionsAdminMixin,
    TransactionState,
)
from kafka.net.manager import KafkaConnectionManager
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer.transaction import EndTxnRequest, EndTxnResponse
from packaging.requirements import Requirement

from airflow_provider_kafka2pc.txn.kafka import errors as kafka_errors
from airflow_provider_kafka2pc.txn.kafka import wire
from airflow_provider_kafka2pc.txn.kafka.broker_support import UnsupportedBrokerError
from airflow_provider_kafka2pc.txn.kafka.errors import BrokerErrorResponse
from airflow_provider_kafka2pc.txn.kafka.wire import Coordinator, TxnListing, TxnState, WireClient, kafka_python_config

END_TXN, FIND_COORDINATOR, INIT_PRODUCER_ID = 26, 10, 22
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
# What a Kafka 4.x broker advertises for the APIs the adapter uses.
REPO = Path(__file__).resolve().parents[2]
MODERN_BROKER = {END_TXN: (0, 5), FIND_COORDINATOR: (0, 6), DESCRIBE_TRANSACTIONS: (0, 0), LIST_TRANSACTIONS: (0, 2)}
# ... and for the writers' APIs, which the wire client checks too (broker_support.NEEDS).
MODERN_BROKER |= {INIT_PRODUCER_ID: (0, 5), 24: (0, 5), 25: (0, 4), 28: (0, 5)}


# --- the private surface ------------------------------------------------------------------------


def test_kafka_python_is_inside_the_declared_range() -> None:
    from kafka.version import __version__

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [requirement] = [Requirement(d) for d in declared if Requirement(d).name == "kafka-python"]
    assert __version__ in requirement.specifier, "wire.py reaches into kafka-python internals: re-check, then widen"
    # Patch releases only: the private connection manager moves between minor releases.
    assert not requirement.specifier.contains("3.1.0"), requirement


# --- the public surface -------------------------------------------------------------------------


def test_public_list_transactions_takes_filters_and_answers_per_broker() -> None:
    params = inspect.signature(kafka.KafkaAdminClient.list_transactions).parameters
    assert {"broker_ids", "state_filters", "transactional_id_pattern", "producer_id_filters"} <= set(params)
    assert TransactionListing._fields == ("transactional_id", "producer_id", "state")
    assert TransactionState("PrepareCommit").value == "PrepareCommit"
    assert wire._state_name(TransactionState.ONGOING) == "Ongoing"


def test_public_describe_transactions_gives_every_field_and_routes_by_the_coordinator_cache() -> None:
    """wire.py's describe is the public call; it routes by kafka-python's coordinator cache, which the
    adapter's own FindCoordinator refreshes (``ClusterMetadata.add_coordinator``), and it raises on the
    first per-id error, which is why the adapter then asks one id at a time."""
    params = inspect.signature(kafka.KafkaAdminClient.describe_transactions).parameters
    assert list(params) == ["self", "transactional_ids"]
    assert TransactionDescription._fields == (
        "coordinator_id",
        "state",
        "producer_id",
        "producer_epoch",
        "transaction_timeout_ms",
        "transaction_start_time_ms",
        "topic_partitions",
    )
    assert "cluster.get_coordinator(" in inspect.getsource(kafka.KafkaAdminClient._find_coordinator_ids)
    add = inspect.signature(kafka.cluster.ClusterMetadata.add_coordinator).parameters
    assert list(add) == ["self", "response", "key_type", "key", "synthesize_node_id"]
    assert "raise error_type(" in inspect.getsource(TransactionsAdminMixin._describe_transactions_process_response)
    assert issubclass(kafka.errors.TransactionalIdNotFoundError, kafka.errors.BrokerResponseError)


def test_admin_client_exposes_its_connection_manager() -> None:
    source = inspect.getsource(kafka.KafkaAdminClient.__init__)
    assert "self._manager = " in source


def test_connection_manager_has_run_send_cluster_and_version_data() -> None:
    run = inspect.signature(KafkaConnectionManager.run)
    assert list(run.parameters)[:2] == ["self", "coro"]
    assert any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in run.parameters.values())
    send = inspect.signature(KafkaConnectionManager.send)
    assert {"request", "node_id", "request_timeout_ms"} <= set(send.parameters)
    init = inspect.getsource(KafkaConnectionManager.__init__)
    assert "self.cluster = " in init
    assert "self.broker_version_data = " in init
    assert callable(kafka.cluster.ClusterMetadata.brokers)
    assert "api_versions" in BrokerVersionData.__slots__


def test_end_txn_request_takes_a_pinned_max_version() -> None:
    request = EndTxnRequest(transactional_id="orders-0", producer_id=1, producer_epoch=0, committed=True, max_version=4)
    low, high = EndTxnRequest.valid_versions
    assert low == 0 and high >= 4
    assert EndTxnRequest.decode(request.encode(version=4), version=4).committed is True
    # The pin is what version negotiation uses, also against a broker that offers EndTxn v5.
    assert BrokerVersionData(api_versions={END_TXN: (0, 5)}).api_version(request) == 4
    assert wire.END_TXN_MAX_VERSION == 4


def test_find_coordinator_v4_is_batched() -> None:
    assert FindCoordinatorRequest.valid_versions[1] >= 4
    assert CoordinatorType.TRANSACTION == wire._TRANSACTION_COORDINATOR == 1
    request = FindCoordinatorRequest(key_type=1, coordinator_keys=["orders-0", "orders-1"], min_version=4)
    decoded = FindCoordinatorRequest.decode(request.encode(version=4), version=4)
    assert decoded.coordinator_keys == ["orders-0", "orders-1"]
    assert decoded.key_type == 1


def test_list_transactions_v2_filters_by_pattern_and_describe_is_there() -> None:
    assert ListTransactionsRequest.valid_versions[1] >= 2
    assert ListTransactionsRequest.API_KEY == LIST_TRANSACTIONS
    assert DescribeTransactionsRequest.API_KEY == DESCRIBE_TRANSACTIONS
    request = ListTransactionsRequest(
        state_filters=["Ongoing"], producer_id_filters=[], transactional_id_pattern="^orders\\-.*", min_version=2
    )
    assert ListTransactionsRequest.decode(request.encode(version=2), version=2).transactional_id_pattern == (
        "^orders\\-.*"
    )


def test_error_helpers() -> None:
    assert kafka_errors.error_name(0) == "NONE"
    assert kafka_errors.error_name(90) == "ProducerFencedError"
    assert kafka_errors.is_connection_error(kafka.errors.KafkaConnectionError("reset"))
    assert kafka_errors.is_connection_error(ConnectionResetError())
    assert kafka_errors.is_connection_error(kafka.errors.Cancelled())  # its connection closed under it
    assert not kafka_errors.is_connection_error(kafka.errors.ProducerFencedError())


# --- configuration ------------------------------------------------------------------------------


def test_kafka_python_config_translates_how_to_connect() -> None:
    cfg = kafka_python_config(
        {
            "bootstrap.servers": "b1:9093, b2:9093,",
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "scram-sha-512",
            "sasl.username": "exporter",
            "sasl.password": "hunter2",
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.certificate.location": "/etc/cert.pem",
            "ssl.key.location": "/etc/key.pem",
            "ssl.key.password": "pem-secret",
            "client.id": "me",
            "linger.ms": 20,
            "transactional.id": "orders-0",
            "enable.idempotence": True,
        }
    )
    assert cfg == {
        "bootstrap_servers": ["b1:9093", "b2:9093"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "exporter",
        "sasl_plain_password": "hunter2",
        "ssl_cafile": "/etc/ca.pem",
        "ssl_certfile": "/etc/cert.pem",
        "ssl_keyfile": "/etc/key.pem",
        "ssl_password": "pem-secret",
        "client_id": "me",
    }


def test_every_translated_setting_is_a_kafka_python_admin_setting() -> None:
    from airflow_provider_kafka2pc.txn.kafka import config

    made = {*config._KAFKA_PYTHON_NAMES.values(), *config._INLINE_PEM.values()}
    made |= {"ssl_check_hostname", "sasl_oauth_token_provider"}
    assert made <= set(kafka.KafkaAdminClient.DEFAULT_CONFIG)


@pytest.mark.parametrize("config", [{}, {"security.protocol": "SSL"}, {"bootstrap.servers": ""}])
def test_config_without_bootstrap_servers_is_refused(config: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        kafka_python_config(config)


# --- the adapter against kafka-python's protocol classes, without a socket -----------------------


@dataclass(frozen=True)
class Sent:
    request: Any  # decoded again at the negotiated version: what the broker would read
    version: int
    node_id: int | None
    request_timeout_ms: int | None


@dataclass(frozen=True)
class FakeNode:
    node_id: int


class FakeCluster(kafka.cluster.ClusterMetadata):  # type: ignore[misc]
    """kafka-python's real metadata (its coordinator cache included), with a fixed set of brokers."""

    def __init__(self, node_ids: list[int]) -> None:
        super().__init__()
        self.node_ids = node_ids

    def brokers(self) -> list[FakeNode]:
        return [FakeNode(n) for n in self.node_ids]


Handler = Callable[[Any, int | None], Any]


class ProtocolManager:
    """The three things wire.py uses of KafkaConnectionManager: run, send, cluster/version data."""

    def __init__(self, api_versions: dict[int, tuple[int, int]], node_ids: list[int]) -> None:
        self.broker_version_data = BrokerVersionData(api_versions=api_versions)
        self.cluster = FakeCluster(node_ids)
        self.sent: list[Sent] = []
        self.handlers: dict[type, Handler] = {}

    def run(self, coro: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run(coro(*args))

    async def send(self, request: Any, node_id: int | None = None, request_timeout_ms: int | None = None) -> Any:
        version = self.broker_version_data.api_version(request)
        decoded = type(request).decode(request.encode(version=version), version=version)
        self.sent.append(Sent(decoded, version, node_id, request_timeout_ms))
        response = self.handlers[type(request)](decoded, node_id)
        return type(response).decode(response.encode(version=version), version=version)


class FakeAdmin(TransactionsAdminMixin):
    """kafka-python's real public transaction methods over the socket-less manager."""

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.closed = False
        self._manager: ProtocolManager = FakeAdmin.next_manager

    def close(self) -> None:
        self.closed = True

    # kafka-python's own coordinator lookup, which the public describe_transactions calls
    _find_coordinator_ids = kafka.KafkaAdminClient._find_coordinator_ids
    next_manager: ProtocolManager


def client(
    monkeypatch: pytest.MonkeyPatch,
    api_versions: dict[int, tuple[int, int]] | None = None,
    node_ids: list[int] | None = None,
) -> tuple[WireClient, ProtocolManager]:
    manager = ProtocolManager(MODERN_BROKER if api_versions is None else api_versions, node_ids or [1])
    FakeAdmin.next_manager = manager
    monkeypatch.setattr(kafka, "KafkaAdminClient", FakeAdmin)
    monkeypatch.setattr("airflow_provider_kafka2pc.txn.kafka.wire.check_reachable", lambda *a, **k: None)
    return WireClient({"bootstrap.servers": "b1:9092", "linger.ms": 5}, request_timeout_ms=7000), manager


def test_wire_client_builds_the_admin_client_from_the_connection_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = client(monkeypatch)
    admin = c._admin
    assert isinstance(admin, FakeAdmin)
    assert admin.config == {
        "bootstrap_servers": ["b1:9092"],
        "client_id": "kafka2pc",
        "request_timeout_ms": 7000,
        "bootstrap_timeout_ms": 10000,  # the default connect timeout
    }
    with c:
        pass
    assert admin.closed


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_goes_to_the_coordinator_at_the_pinned_version(monkeypatch: pytest.MonkeyPatch, commit: bool) -> None:
    c, m = client(monkeypatch)
    m.handlers[EndTxnRequest] = lambda _req, _node: EndTxnResponse(throttle_time_ms=0, error_code=90)
    assert c.end_txn(3, "orders-0", 4711, 5, commit=commit) == 90
    [sent] = m.sent
    assert (sent.version, sent.node_id, sent.request_timeout_ms) == (4, 3, 7000)
    r = sent.request
    assert (r.transactional_id, r.producer_id, r.producer_epoch, r.committed) == ("orders-0", 4711, 5, commit)


def test_find_coordinators_batched_and_per_key_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = client(monkeypatch)
    entry = FindCoordinatorResponse.Coordinator

    def answer(req: Any, _node: int | None) -> Any:
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                entry(key=req.coordinator_keys[0], node_id=2, host="b2", port=9092, error_code=0, error_message=None),
                entry(key=req.coordinator_keys[1], node_id=-1, host="", port=-1, error_code=15, error_message="x"),
            ],
        )

    m.handlers[FindCoordinatorRequest] = answer
    assert c.find_transaction_coordinators(["orders-0", "orders-1"]) == {
        "orders-0": Coordinator(2, 0),
        "orders-1": Coordinator(-1, 15),
    }
    [sent] = m.sent
    assert sent.version >= 4
    assert (sent.request.key_type, sent.request.coordinator_keys) == (1, ["orders-0", "orders-1"])
    assert c.find_transaction_coordinators([]) == {}
    assert len(m.sent) == 1


def test_a_broker_without_batched_lookup_is_refused_when_the_client_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka 2.8's API versions: refused with the versions found and needed, before any request."""
    kafka_2_8 = {**MODERN_BROKER, FIND_COORDINATOR: (0, 3), END_TXN: (0, 3)}
    del kafka_2_8[DESCRIBE_TRANSACTIONS], kafka_2_8[LIST_TRANSACTIONS]
    with pytest.raises(UnsupportedBrokerError) as refused:
        client(monkeypatch, kafka_2_8)
    assert str(refused.value).startswith(
        "the Kafka broker at b1:9092 answers FindCoordinator up to v3 (v4 needed), DescribeTransactions and "
        "ListTransactions not at all: Kafka "
    )
    assert "needs Kafka 3.0 or newer" in str(refused.value)
    assert "nothing was written" in str(refused.value)
    assert FakeAdmin.next_manager.sent == []


def coordinators_on(nodes: dict[str, int]) -> Handler:
    entry = FindCoordinatorResponse.Coordinator

    def answer(req: Any, _node: int | None) -> Any:
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                entry(key=k, node_id=nodes[k], host=f"b{nodes[k]}", port=9092, error_code=0, error_message=None)
                for k in req.coordinator_keys
            ],
        )

    return answer


def describe_rows(errors: dict[str, int]) -> Handler:
    """A coordinator answering every id: Ongoing for pid 4711 epoch 5, or the id's error."""
    row = DescribeTransactionsResponse.TransactionState

    def answer(req: Any, node: int | None) -> Any:
        return DescribeTransactionsResponse(
            throttle_time_ms=0,
            transaction_states=[
                row(
                    error_code=errors[t],
                    transactional_id=t,
                    transaction_state="",
                    transaction_timeout_ms=0,
                    transaction_start_time_ms=-1,
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=[],
                )
                if t in errors
                else row(
                    error_code=0,
                    transactional_id=t,
                    transaction_state="Ongoing",
                    transaction_timeout_ms=900_000,
                    transaction_start_time_ms=1_700_000_000_000 + (node or 0),
                    producer_id=4711,
                    producer_epoch=5,
                    topics=[row.TopicData(topic="b", partitions=[2, 0]), row.TopicData(topic="a", partitions=[1])],
                )
                for t in req.transactional_ids
            ],
        )

    return answer


def ongoing(tid: str, node: int) -> TxnState:
    return TxnState(tid, 0, "Ongoing", 4711, 5, 900_000, 1_700_000_000_000 + node, (("a", 1), ("b", 0), ("b", 2)), node)


def test_describe_transactions_goes_where_find_coordinators_found(monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = client(monkeypatch, node_ids=[1, 2, 4])
    nodes = {"orders-0": 4, "orders-1": 2, "orders-2": 4}
    m.handlers[FindCoordinatorRequest] = coordinators_on(nodes)
    m.handlers[DescribeTransactionsRequest] = describe_rows({})
    c.find_transaction_coordinators(list(nodes))
    assert c.describe_transactions(list(nodes)) == {t: ongoing(t, n) for t, n in nodes.items()}
    described = [(s.node_id, s.request.transactional_ids) for s in m.sent if s.request.API_KEY == DESCRIBE_TRANSACTIONS]
    assert sorted(described) == [(2, ["orders-1"]), (4, ["orders-0", "orders-2"])]
    # The coordinator moved: the next lookup is sent, not answered from a cache, and the describe follows it.
    nodes["orders-0"] = 1
    c.find_transaction_coordinators(["orders-0"])
    assert c.describe_transactions(["orders-0"]) == {"orders-0": ongoing("orders-0", 1)}
    assert [s.request.API_KEY for s in m.sent].count(FIND_COORDINATOR) == 2
    assert m.sent[-1].node_id == 1


def test_describe_transactions_keeps_every_row_when_one_id_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = client(monkeypatch)
    tids = ["orders-0", "orders-1", "orders-2"]
    m.handlers[FindCoordinatorRequest] = coordinators_on(dict.fromkeys(tids, 1))
    m.handlers[DescribeTransactionsRequest] = describe_rows({"orders-1": 105, "orders-2": 16})
    c.find_transaction_coordinators(tids)
    states = c.describe_transactions(tids)
    assert states["orders-0"] == ongoing("orders-0", 1)
    assert {t: s.error_code for t, s in states.items()} == {"orders-0": 0, "orders-1": 105, "orders-2": 16}
    described = [s.request.transactional_ids for s in m.sent if s.request.API_KEY == DESCRIBE_TRANSACTIONS]
    assert described == [tids, ["orders-0"], ["orders-1"], ["orders-2"]]
    assert c.describe_transactions([]) == {}


@pytest.mark.parametrize(("list_max", "pattern_sent"), [(2, True), (1, False)])
def test_list_transactions_asks_every_broker(
    monkeypatch: pytest.MonkeyPatch, list_max: int, pattern_sent: bool
) -> None:
    c, m = client(monkeypatch, {**MODERN_BROKER, LIST_TRANSACTIONS: (0, list_max)}, node_ids=[2, 1])
    row = ListTransactionsResponse.TransactionState

    def answer(_req: Any, node: int | None) -> Any:
        return ListTransactionsResponse(
            throttle_time_ms=0,
            error_code=0,
            unknown_state_filters=[],
            transaction_states=[row(transactional_id=f"orders-{node}", producer_id=node, transaction_state="Ongoing")],
        )

    m.handlers[ListTransactionsRequest] = answer
    assert c.supports_list_pattern() is pattern_sent
    listed = c.list_transactions(["Ongoing", "PrepareCommit"], "^orders\\-.*")
    assert listed == [TxnListing("orders-1", 1, "Ongoing"), TxnListing("orders-2", 2, "Ongoing")]
    assert all(isinstance(t.state, str) and type(t.state) is str for t in listed)
    assert sorted(s.node_id for s in m.sent) == [1, 2]
    for s in m.sent:
        assert s.request.state_filters == ["Ongoing", "PrepareCommit"]
        assert s.version == list_max
        if pattern_sent:
            assert s.request.transactional_id_pattern == "^orders\\-.*"


def test_list_transactions_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = client(monkeypatch)
    m.handlers[ListTransactionsRequest] = lambda _req, _node: ListTransactionsResponse(
        throttle_time_ms=0, error_code=15, unknown_state_filters=[], transaction_states=[]
    )
    with pytest.raises(BrokerErrorResponse, match="ListTransactions: CoordinatorNotAvailableError") as info:
        c.list_transactions(["Ongoing"], None)
    assert (info.value.code, info.value.request) == (15, "ListTransactions")


@pytest.mark.parametrize(("init_pid_max", "kip939"), [(5, False), (6, True)])
def test_kip939_is_detected_from_api_versions(monkeypatch: pytest.MonkeyPatch, init_pid_max: int, kip939: bool) -> None:
    c, _ = client(monkeypatch, {**MODERN_BROKER, INIT_PRODUCER_ID: (0, init_pid_max)})
    assert c.supports_kip939() is kip939


# --- the transaction core stays free of Airflow and Spark ----------------------------------------


def test_txn_package_imports_neither_airflow_nor_pyspark() -> None:
    script = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import airflow_provider_kafka2pc.txn as txn
        names = [m.name for m in pkgutil.walk_packages(txn.__path__, "airflow_provider_kafka2pc.txn.")]
        assert len(names) >= 23, names
        for name in names:
            importlib.import_module(name)
        heavy = sorted(
            m for m in sys.modules
            if m.split(".")[0] in ("airflow", "pyspark", "py4j", "pandas", "pyarrow")
        )
        print(len(names), heavy)
        sys.exit(1 if heavy else 0)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_core_layers_import_only_downwards_and_nothing_imports_in_a_cycle() -> None:
    """txn/protocol imports nothing of the package but itself; txn/kafka adds protocol; txn/two_phase
    adds both; no module of the package imports another that imports it back (lazy imports count)."""
    import ast
    import graphlib

    root = REPO / "airflow_provider_kafka2pc"
    modules = {
        ".".join(("airflow_provider_kafka2pc", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("airflow_provider_kafka2pc"):
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
        imports[name] = {m for m in found if m in modules and m != name}
    order = {"protocol": 0, "kafka": 1, "two_phase": 2}

    def layer(module: str) -> int | None:
        parts = module.split(".")
        return order.get(parts[2]) if len(parts) > 3 and parts[1] == "txn" else None

    upward = [
        (m, d)
        for m, ds in imports.items()
        if layer(m) is not None
        for d in ds
        if not d.startswith("airflow_provider_kafka2pc.txn") or (layer(d) or 0) > (layer(m) or 0)
    ]
    assert upward == []
    graphlib.TopologicalSorter(imports).prepare()  # raises CycleError naming the cycle


def test_a_broker_answering_api_keys_kafka_python_does_not_know_is_checked_by_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kafka 4.4 answers ApiVersions with key 93, which kafka-python's public api_versions() cannot
    turn into its enum (ValueError: every client failed on a real 4.4 broker): the check reads the
    raw answer instead."""
    import kafka as kafka_python

    with pytest.raises(ValueError):
        kafka_python.protocol.api_key.ApiKey(93)  # still unknown to the pinned kafka-python
    c, _ = client(monkeypatch, {**MODERN_BROKER, 93: (0, 1)})
    c.close()


@pytest.mark.parametrize(("fetch_max", "verifies"), [(15, False), (16, True), (17, True)])
def test_brokers_that_verify_transactional_offset_commits_are_told_by_their_fetch_version(
    monkeypatch: pytest.MonkeyPatch, fetch_max: int, verifies: bool
) -> None:
    """Kafka 3.7 verifies a TxnOffsetCommit against its transaction (KAFKA-15449) and is the first
    with Fetch v16: only there does the commit send a Kafka source's offsets again."""
    c, _ = client(monkeypatch, {**MODERN_BROKER, 1: (0, fetch_max)})
    assert c.verifies_txn_offset_commits() is verifies
    c.close()
