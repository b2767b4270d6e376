"""Test helpers around the real local Kafka started by scripts/kafka-local."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from tests.helpers import netns

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported by path (the scripts are no package), under its own name."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def kafka_local() -> ModuleType:
    return load_script("kafka_local")


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass
class KafkaEnv:
    directory: Path
    bootstrap: str
    brokers: int
    # A secured cluster's client settings for its super user (kafka_local.client_config).
    security: dict[str, str] = field(default_factory=dict)
    oidc_url: str | None = None  # the OIDC provider whose tokens the broker accepts (OAUTHBEARER)
    _wire: WireClient | None = field(default=None, repr=False)

    @property
    def config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.security}

    @property
    def wire(self) -> WireClient:
        if self._wire is None:
            self._wire = WireClient(self.config)
        return self._wire

    def new_wire(self) -> WireClient:
        return WireClient(self.config)

    def topic(self, partitions: int = 3, name: str | None = None, config: dict[str, str] | None = None) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t_{uuid.uuid4().hex[:10]}"
        admin = AdminClient(self.config)
        admin.create_topics([NewTopic(name, partitions, min(3, self.brokers), config=config or {})])[name].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for leaders before anyone produces
            md = admin.list_topics(name, timeout=10).topics[name]
            if (
                md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return name
            time.sleep(0.1)
        raise AssertionError(f"topic {name} has no leaders")

    def _committed_messages(self, topics: tuple[str, ...], timeout_s: float) -> Iterator[Any]:
        """Every message a read_committed consumer sees, up to the last stable offset of each partition."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        c = Consumer(
            {
                **self.config,
                "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        try:
            tps = []
            for t in topics:
                md = c.list_topics(t, timeout=10).topics[t]
                tps += [TopicPartition(t, p, OFFSET_BEGINNING) for p in md.partitions]
            c.assign(tps)
            pending = {(tp.topic, tp.partition) for tp in tps}
            deadline = time.monotonic() + timeout_s
            while pending:
                assert time.monotonic() < deadline, f"read_committed did not reach the end of {pending}"
                for m in c.consume(10000, 0.5):
                    if m.error():
                        assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                        pending.discard((m.topic(), m.partition()))
                        continue
                    yield m
        finally:
            c.close()

    def read_committed(self, *topics: str, timeout_s: float = 30.0) -> list[Record]:
        """Everything a read_committed consumer sees, up to the last stable offset of each partition."""
        return [
            Record(m.topic(), m.partition(), m.key(), m.value(), tuple(m.headers() or ()))
            for m in self._committed_messages(topics, timeout_s)
        ]

    def count_committed(self, topic: str, key_prefix: bytes = b"", timeout_s: float = 120.0) -> tuple[int, int]:
        """(records, distinct keys) a read_committed consumer sees in ``topic`` with keys starting with
        ``key_prefix``, without keeping the records (for exports of millions)."""
        records, keys = 0, set()
        for m in self._committed_messages((topic,), timeout_s):
            if (key := m.key() or b"").startswith(key_prefix):
                records += 1
                keys.add(key)
        return records, len(keys)

    def describe(self, *tids: str) -> dict[str, TxnState | None]:
        return TransactionInspector(self.wire).describe(tids)

    def open_transactions(self, prefix: str | None = None, settle_s: float = 5.0) -> list[str]:
        """Transactional ids left open (all, or of one exporter): Ongoing, or still ending after
        ``settle_s``. EndTxn (a commit, an abort) answers once the outcome is decided, in state
        PrepareCommit/PrepareAbort, and the coordinator ends the transaction on its own within
        milliseconds; one that stays there is left open."""
        from kafka.errors import KafkaError as WireError

        ins = TransactionInspector(self.wire)
        deadline = time.monotonic() + settle_s
        # A broker just restarted answers COORDINATOR_LOAD_IN_PROGRESS while it reloads the
        # transaction log: Kafka says retry, so the judge asks again (for a minute at most).
        loading_until = time.monotonic() + 60
        while True:
            try:
                if prefix is not None:
                    listings = ins.list_prefix(prefix)
                else:
                    listings = self.wire.list_transactions(["Ongoing", "PrepareCommit", "PrepareAbort"], None)
            except WireError as e:
                if not e.retriable or time.monotonic() > loading_until:
                    raise
                time.sleep(0.5)
                continue
            ending = any(t.state in ("PrepareCommit", "PrepareAbort") for t in listings)
            if not ending or time.monotonic() > deadline:
                return sorted(t.transactional_id for t in listings)
            time.sleep(0.05)

    def set_producer_byte_rate(self, client_id: str, bytes_per_s: float) -> None:
        """A broker produce quota on one client id (AlterClientQuotas): its producers are throttled.
        kafka-python's admin has no call for it and Kafka's ConfigCommand is not in our jars, so the
        request goes through the test's wire client."""
        from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as Request

        entry = Request.EntryData
        request = Request(
            entries=[
                entry(
                    entity=[entry.EntityData(entity_type="client-id", entity_name=client_id)],
                    ops=[entry.OpData(key="producer_byte_rate", value=float(bytes_per_s), remove=False)],
                )
            ],
            validate_only=False,
        )

        async def send() -> Any:
            return await self.wire._send(request)

        [done] = self.wire._run(send).entries
        assert done.error_code == 0, done

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None


def abort_open_now(env: KafkaEnv, prefix: str, decision_log: Any) -> tuple[bool, str]:
    """What the export operator's at-once abort does, for tests that call ``export_dataframe``
    directly. Returns (nothing left open, the last pass)."""
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover, recover_until_clear

    done, result = recover_until_clear(lambda: recover(env.wire, prefix, decision_log, run="test-abort-now"))
    return done, result.describe()


def prepare_in_subprocess(env: KafkaEnv, tid: str, spec: Any, timeout_ms: int | None = None) -> Committable:
    """A writer process that prepares one transaction and exits; returns its committable."""
    cmd = [sys.executable, "-m", "tests.helpers.prepare_writer", "--bootstrap", env.bootstrap, "--tid", tid]
    if timeout_ms is not None:
        cmd += ["--timeout-ms", str(timeout_ms)]
    proc = subprocess.run(cmd, input=json.dumps(spec), capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, f"writer failed: {proc.stderr[-3000:]}"
    return Committable.from_json(proc.stdout.strip().splitlines()[-1])


def generate(topic: str, count: int, key_prefix: str = "k") -> dict[str, Any]:
    return {"generate": {"topic": topic, "count": count, "key_prefix": key_prefix}}


def sasl_connection(
    env: KafkaEnv, user: str, password: str, decision_topic: str | None = None, debug: str | None = None
) -> dict[str, Any]:
    """A ``kafka2pc`` Airflow connection (as JSON fields) for a SCRAM user of the secured broker."""
    config = {"ssl.ca.location": env.security["ssl.ca.location"], **({"debug": debug} if debug else {})}
    extra: dict[str, Any] = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "config": config}
    if decision_topic:
        extra["decision_topic"] = decision_topic
    return {"conn_type": "kafka2pc", "host": env.bootstrap, "login": user, "password": password, "extra": extra}


def kill_node(env: KafkaEnv, node: int) -> None:
    """SIGKILL one broker of ``env``: a crash, no controlled shutdown, its partitions without a
    leader until the controller fences it; ``kafka_local().start_node(env.directory, node)``
    brings it back with its data."""
    import contextlib
    import os
    import signal

    kl = kafka_local()
    root = env.directory.resolve()
    with kl._locked(root / ".kafka-local.lock"):
        state = kl.load_state(root)
        entry = kl._node(state, node)
        pid = entry["pid"]
        assert pid and kl._alive(entry), f"node {node} is not running"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while kl._alive(entry):
            assert time.monotonic() < deadline, f"node {node} survived SIGKILL"
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it if this process started it
            time.sleep(0.01)
        entry["pid"] = entry["pid_start_ticks"] = None
        kl._write_json(root / kl.STATE_FILE, state)


def partition_leader(env: KafkaEnv, topic: str, partition: int = 0, timeout_s: float = 30.0) -> int:
    """The broker id leading one partition, as the cluster's metadata says now."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(env.config)
    deadline = time.monotonic() + timeout_s
    while True:
        leader = int(admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)
        if leader >= 0:
            return leader
        assert time.monotonic() < deadline, f"{topic}[{partition}] has no leader"
        time.sleep(0.1)


def wait_in_sync(env: KafkaEnv, topics: list[str], timeout_s: float = 60.0) -> float:
    """Wait until every partition of ``topics`` has all its replicas in sync (a restarted broker
    caught up), so that killing any one broker leaves min.insync.replicas; returns the seconds waited."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(env.config)
    started = time.monotonic()
    while True:
        lagging = [
            f"{t}[{p.id}] isr {p.isrs} of {p.replicas}"
            for t in topics
            for p in admin.list_topics(t, timeout=10).topics[t].partitions.values()
            if p.leader < 0 or sorted(p.isrs) != sorted(p.replicas)
        ]
        if not lagging:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"replicas not in sync after {timeout_s:g} s: {lagging}"
        time.sleep(0.1)


def wait_brokers_agree(env: KafkaEnv, topics: list[str], timeout_s: float = 60.0) -> float:
    """Wait until every broker, asked itself, reports the same leader, leader epoch and full ISR for
    every partition of ``topics``; returns the seconds waited. A broker whose link was cut answers
    from what it knew when the link went down (itself the leader of partitions that moved, an older
    leader epoch) until it has read the controller's newer metadata: a client that asks it meanwhile
    fetches from the stale leader, whose log lacks the commit markers written elsewhere
    (``wait_in_sync`` asks whichever broker answers first, which can be that one)."""
    from kafka.protocol.metadata import MetadataRequest

    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    started = time.monotonic()
    while True:
        views = _partitions_seen_by_each_broker(env, request)
        first = views[1]
        if (
            not isinstance(first, str)
            and all(v == first for v in views.values())
            and len(first) > 0
            and all(leader >= 0 and isr == replicas for _, _, leader, _, isr, replicas in first)
        ):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"brokers disagree after {timeout_s:g} s: {views}"
        time.sleep(0.2)


def _partitions_seen_by_each_broker(env: KafkaEnv, request: Any) -> dict[int, Any]:
    """Each broker's answer to ``request`` (a Metadata request): (topic, partition, leader, leader
    epoch, ISR, replicas) per partition, or the error's name. A client of its own each time: one
    made while a broker was fenced does not know that broker's id."""
    from kafka.errors import KafkaError as WireError

    views: dict[int, Any] = {}
    try:
        wire = env.new_wire()
    except Exception as e:  # no broker answered the bootstrap yet
        return dict.fromkeys(range(1, env.brokers + 1), type(e).__name__)
    with wire:

        async def ask(node_id: int) -> Any:
            return await wire._send(request, node_id)

        for node_id in range(1, env.brokers + 1):
            try:
                response = wire._run(ask, node_id)
            except (WireError, OSError) as e:  # not listed yet, or not answering
                views[node_id] = type(e).__name__
                continue
            views[node_id] = sorted(
                (t.name, p.partition_index, p.leader_id, p.leader_epoch, sorted(p.isr_nodes), sorted(p.replica_nodes))
                for t in response.topics
                for p in t.partitions
            )
    return views


# The broker line below the supported ones (Kafka 3.0+): tests/integration/test_old_broker.py
# starts it (ZooKeeper mode) to prove kafka2pc refuses it before writing anything.
OLD_KAFKA_VERSION = "2.8.2"


def partition_ends(env: KafkaEnv, topic: str) -> dict[int, int]:
    """The high watermark of each partition of ``topic``: what a read_uncommitted consumer could read
    there, aborted and still-open transactions' records included."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**env.config, "group.id": f"ends-{uuid.uuid4().hex[:6]}", "isolation.level": "read_uncommitted"})
    try:
        partitions = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        c.close()


@contextmanager
def kafka_on_hosts(network: netns.Network, names: Sequence[str], directory: Path) -> Iterator[KafkaEnv]:
    """A broker on each of the network's hosts ``names`` (KRaft: each a controller too), which the
    root namespace and every host reach through the bridge; stopped on exit."""
    kl = kafka_local()
    hosts = [network.host(name) for name in names]
    state = kl.start_cluster(directory, brokers=len(hosts), hosts=[kl.BrokerHost(h.address, h.netns) for h in hosts])
    env = KafkaEnv(directory, state["bootstrap_servers"], len(hosts))
    try:
        yield env
    finally:
        env.close()
        kl.stop_cluster(directory)
