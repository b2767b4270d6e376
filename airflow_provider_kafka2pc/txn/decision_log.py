"""The decision topic: reading and appending records of the decision protocol (``txn/protocol.py``).

Compacted, LogAppendTime, acks=all with an idempotent producer. Partition 0 is the protocol (its
one total order); partition 1 holds the run records of finished runs, the history, which only a
task that asks about its own run reads. Records carry ids and counts only, never connection
settings. An existing topic is checked before it is trusted; a one-partition topic (0.1.0) keeps
everything in partition 0.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_kafka2pc.txn.config import CONNECTION_DEFAULTS, connection_only
from airflow_provider_kafka2pc.txn.errors import BrokerUnavailableError, Kafka2PCError, PrefixCollisionError
from airflow_provider_kafka2pc.txn.logs import with_log
from airflow_provider_kafka2pc.txn.naming import validate_prefix
from airflow_provider_kafka2pc.txn.protocol import (
    CLAIM_KEY,
    RUN_KEY,
    DecisionRecord,
    Entry,
    Lease,
    LogState,
    RunStatus,
    replay,
    run_key,
)

log = logging.getLogger(__name__)

DEFAULT_DECISION_TOPIC = "kafka2pc_decisions"
# The consumer group confluent-kafka insists on; never joined, so no ACL needs to name it.
READER_GROUP = "kafka2pc-decision-reader"
# One decision lists every transaction of a run: 5,000 transactions are ~300 KB of JSON before
# lz4. The topic and the producer allow 32 MiB, so runs of several hundred thousand fit.
MAX_RECORD_BYTES = 32 * 1024 * 1024
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "message.timestamp.type": "LogAppendTime",  # the protocol's deadlines are broker time
    "max.message.bytes": str(MAX_RECORD_BYTES),
    "unclean.leader.election.enable": "false",
    # Compaction never touches the active segment: roll it often, so finished runs leave partition 0.
    "segment.ms": str(10 * 60 * 1000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(10 * 60 * 1000),  # tombstones outlive any reader's scan (seconds)
}

HISTORY_PARTITION = 1
RUN_KEY_BYTES = RUN_KEY.encode()
Item = tuple[bytes, bytes | None]
History = Collection[bytes] | Literal["all"]  # which run records of finished runs a read needs
KeepRun = Callable[[str, str, bytes], bool]  # (prefix, run, raw value): keep this run record?


def _no_runs(_prefix: str, _run: str, _raw: bytes) -> bool:
    return False


def _is_committed(raw: bytes) -> bool:
    return f'"status":"{RunStatus.COMMITTED.value}"'.encode() in raw


class DecisionLogError(Kafka2PCError):
    pass


class UnsafeDecisionTopicError(DecisionLogError):
    """The decision topic exists with settings that could lose or reorder decisions."""


class DecisionLogUnavailableError(DecisionLogError):
    """The decision topic's leader stayed unreachable for the read's whole budget."""


@dataclass(frozen=True)
class Position:
    offset: int
    timestamp_ms: int  # LogAppendTime: the broker's clock


class DecisionLog:
    """Reads and appends the decision topic with confluent-kafka.

    ``append`` and ``scan`` are the only I/O; everything else is the protocol's ``replay``.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str = DEFAULT_DECISION_TOPIC,
        replication_factor: int | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._config = {k: v for k, v in config.items() if not k.startswith(("transactional.", "transaction."))}
        self.topic = topic
        self._replication_factor = replication_factor
        self.timeout_s = timeout_s
        self._producer: Any = None
        self._ready = False
        self._partitions = 2

    # -- topic --------------------------------------------------------------
    def ensure_topic(self) -> None:
        """Create the topic with safe settings, or check an existing one; once per instance."""
        if self._ready:
            return
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient(with_log(connection_only(self._config)))
        try:
            md = admin.list_topics(timeout=self.timeout_s)
        except KafkaException as e:
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {self._config.get('bootstrap.servers')} for the decision log: {e}"
            ) from e
        if self.topic in md.topics:
            self._partitions = len(md.topics[self.topic].partitions)
        if self.topic not in md.topics:
            rf = self._replication_factor or min(3, len(md.brokers))
            new = NewTopic(
                self.topic,
                num_partitions=2,  # 0: the protocol, in one total order; 1: the history
                replication_factor=rf,
                config={**TOPIC_CONFIG, "min.insync.replicas": str(min(2, rf))},
            )
            try:
                admin.create_topics([new], operation_timeout=self.timeout_s)[self.topic].result()
                log.info("created decision log topic %s (replication factor %d)", self.topic, rf)
                self._await_leaders(admin)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    self._raise_if_unauthorized(e.args[0].name(), "Create")
                    raise DecisionLogError(f"cannot create decision log topic {self.topic!r}: {e}") from e
                md = admin.list_topics(timeout=self.timeout_s)
                self._partitions = len(md.topics[self.topic].partitions)
                self._check_topic(admin, md)
        else:
            self._check_topic(admin, md)
        self._ready = True

    def _raise_if_unauthorized(self, error_name: str, operation: str) -> None:
        from airflow_provider_kafka2pc.txn.access import authorization_error_of

        resource = READER_GROUP if error_name == "GROUP_AUTHORIZATION_FAILED" else self.topic
        named = authorization_error_of(error_name, self._config, resource, operation)
        if named is not None:
            raise named

    def _await_leaders(self, admin: Any) -> None:
        """A new topic's partitions answer only once they have leaders."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            parts = admin.list_topics(self.topic, timeout=self.timeout_s).topics[self.topic].partitions
            if len(parts) == self._partitions and all(p.leader >= 0 for p in parts.values()):
                return
            time.sleep(0.05)
        raise DecisionLogError(f"decision log topic {self.topic!r} has no leader after {self.timeout_s:g} s")

    def _check_topic(self, admin: Any, md: Any) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

        res = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
        try:
            described = admin.describe_configs([res])[res].result(timeout=self.timeout_s)
        except KafkaException as e:
            self._raise_if_unauthorized(e.args[0].name(), "DescribeConfigs")
            raise
        configs = {k: v.value for k, v in described.items()}
        partitions = md.topics[self.topic].partitions
        rf = min(len(p.replicas) for p in partitions.values()) if partitions else 0
        if configs.get("message.timestamp.type") == "CreateTime" and configs.get("cleanup.policy") == "compact":
            # A topic of kafka2pc 0.1.0: safe but for the clock its records carry. Upgrade it in place.
            configs["message.timestamp.type"] = self._use_log_append_time(admin, res)
        check_topic_settings(self.topic, configs, len(partitions), rf, len(md.brokers))

    def _use_log_append_time(self, admin: Any, res: Any) -> str:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource  # type: ignore[attr-defined]

        alter = ConfigResource(
            ConfigResource.Type.TOPIC,
            self.topic,
            incremental_configs=[
                ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        try:
            admin.incremental_alter_configs([alter])[alter].result(timeout=self.timeout_s)
        except KafkaException as e:  # e.g. no AlterConfigs ACL: the check below says what to do
            log.warning("cannot switch decision topic %s to LogAppendTime: %s", self.topic, e)
            return "CreateTime"
        log.info("decision topic %s now uses LogAppendTime (it was written by kafka2pc 0.1.0)", self.topic)
        return "LogAppendTime"

    # -- write --------------------------------------------------------------
    def _get_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            conf = {**CONNECTION_DEFAULTS, **self._config}
            conf.update(
                {
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 0,
                    "compression.type": "lz4",
                    "message.max.bytes": MAX_RECORD_BYTES + 1024 * 1024,
                }
            )
            self._producer = Producer(with_log(conf))
            self._producer.list_topics(timeout=self.timeout_s)  # connect now, not on the first write
        return self._producer

    def append(self, items: Sequence[Item]) -> list[Position]:
        """Append and flush; returns once every record is acknowledged by all in-sync replicas."""
        self.ensure_topic()
        producer = self._get_producer()
        errors: list[str] = []
        positions: dict[int, Position] = {}

        def _ignore(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        def on_delivery(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    positions[i] = Position(int(msg.offset()), int(msg.timestamp()[1]))

            return cb

        # History first, flushed, then the protocol: a reader that reads partition 0 and then 1
        # and no longer finds a decision finds the run record it left.
        history = (
            [i for i, (key, _) in enumerate(items) if key.startswith(RUN_KEY_BYTES)] if self._partitions > 1 else []
        )
        for batch in (history, [i for i in range(len(items)) if i not in set(history)]):
            for i in batch:
                key, value = items[i]
                if value is not None and len(value) > MAX_RECORD_BYTES:
                    raise DecisionLogError(
                        f"a decision of {len(value)} bytes exceeds the decision topic's limit of {MAX_RECORD_BYTES}: "
                        "commit fewer Spark partitions per run (coalesce the DataFrame)"
                    )
                partition = HISTORY_PARTITION if batch is history else 0
                producer.produce(self.topic, key=key, value=value, partition=partition, on_delivery=on_delivery(i))
                if batch is history and value is not None and not _is_committed(value):
                    # LOST / ACKNOWLEDGED runs also live in the protocol's partition: recovery meets them.
                    producer.produce(self.topic, key=key, value=value, partition=0, on_delivery=_ignore)
                producer.poll(0)
            remaining = producer.flush(self.timeout_s)
            if remaining or errors:
                raise DecisionLogError(
                    f"decision log write to {self.topic!r} failed: {remaining} unacknowledged, errors {errors[:3]}"
                )
        if len(positions) != len(items):
            raise DecisionLogError(f"decision log write to {self.topic!r} failed: not every record was acknowledged")
        log.debug("appended %d record(s) to %s", len(items), self.topic)
        return [positions[i] for i in range(len(items))]

    def decide(self, decision: DecisionRecord, keep_run: KeepRun | None = _no_runs) -> LogState:
        """Append ``decision`` and read the log back up to it: the ruling every actor will see."""
        pos = self.append([(decision.key, decision.to_json())])[0]
        state = self.read(until=pos.offset, keep_run=keep_run, history=frozenset())
        if decision.decision_id not in state.decisions:
            raise DecisionLogError(f"decision {decision.decision_id} at offset {pos.offset} was not read back")
        return state

    def claim_prefix(self, prefix: str, owner: str) -> None:
        """Register ``owner`` as the only exporter of ``prefix``; refuse if another owns it."""
        validate_prefix(prefix)
        current = self.read(keep_run=_no_runs).claims.get(prefix)
        if current is not None and current != owner:
            raise PrefixCollisionError(prefix, current, owner)
        if current is None:
            value = json.dumps({"prefix": prefix, "owner": owner, "at_ms": int(time.time() * 1000)}).encode()
            self.append([((CLAIM_KEY + prefix).encode(), value)])

    def take_turn(self, lease: Lease, is_live: Callable[[Lease], bool]) -> Lease | None:
        """Queue ``lease`` (once) and return the live lease ahead of it, or None: our turn.

        Leases ahead whose run is no longer live are retired. Two runs that queue at once are
        ordered by the log, so exactly one of them goes first.
        """
        queue = self.read(keep_run=_no_runs).queue(lease.prefix)
        mine = (lease.dag_id, lease.run_id)
        if all((q.dag_id, q.run_id) != mine for q in queue):
            self.append([(lease.key, lease.to_json())])
            queue = self.read(keep_run=_no_runs).queue(lease.prefix)
        stale: list[Lease] = []
        holder = None
        for q in queue:
            if (q.dag_id, q.run_id) == mine:
                break
            if is_live(q):
                holder = q
                break
            stale.append(q)
        if stale:
            log.info(
                "retiring %d lease(s) of %s whose runs ended: %s", len(stale), lease.prefix, [q.run_id for q in stale]
            )
            self.append([(q.key, None) for q in stale])
        return holder

    # -- read ---------------------------------------------------------------
    def read(
        self, until: int | None = None, keep_run: KeepRun | None = None, history: History | None = None
    ) -> LogState:
        """Replay the protocol's partition from its start up to offset ``until`` (default: its
        current end), then the run records of finished runs that ``history`` names (a set of
        keys, or ``"all"``; default: all unless ``keep_run`` keeps no run). Partition 0 is read
        first: see ``append``."""
        self.ensure_topic()  # knows how many partitions there are
        if history is None:
            history = frozenset() if keep_run is _no_runs else "all"
        entries: Iterable[Entry] = self.scan(until)
        if history and self._partitions > 1:
            keys = None if history == "all" else frozenset(history)
            entries = itertools.chain(entries, self.scan(None, HISTORY_PARTITION, keys))
        return replay(entries, keep_run)

    def read_for(self, prefix: str, run: str | None = None) -> LogState:
        """The state one exporter needs: the protocol, the prefix's losses, and its own run's
        record if ``run`` is given; not the hundred thousand runs it finished before."""
        return self.read(keep_run=self.keep_for(prefix, run), history={run_key(prefix, run)} if run else frozenset())

    @staticmethod
    def keep_for(prefix: str, run: str | None = None) -> KeepRun:
        """Run records of ``run`` and the prefix's runs that are not COMMITTED (a loss must be met)."""
        return lambda p, r, raw: p == prefix and (r == run or not _is_committed(raw))

    @staticmethod
    def keep_run_of(prefixes: Sequence[str], run: str) -> KeepRun:
        wanted = set(prefixes)
        return lambda p, r, _raw: r == run and p in wanted

    def scan(
        self, until: int | None = None, partition: int = 0, keys: frozenset[bytes] | None = None
    ) -> Iterator[Entry]:
        """The records of one partition in offset order; with ``keys``, only those keys."""
        self.ensure_topic()
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        conf = connection_only(self._config)
        conf.update(
            {
                # confluent-kafka insists on a group.id, but no group is joined and no offset
                # committed (assign(), no commits), so the principal needs no Group ACL: librdkafka
                # still looks the group's coordinator up, and its GROUP_AUTHORIZATION_FAILED is
                # ignored below.
                "group.id": READER_GROUP,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            }
        )
        consumer = Consumer(with_log(conf))
        try:
            end = self._end_offset(consumer, TopicPartition(self.topic, partition))
            last = end - 1 if until is None else until
            if last < 0:
                return
            consumer.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
            deadline = time.monotonic() + self.timeout_s
            while True:
                if time.monotonic() > deadline:
                    raise DecisionLogError(f"timed out reading decision log {self.topic!r} up to offset {last}")
                # A short poll: consume() waits out its timeout whenever fewer records remain, and
                # the last batch of every read does (5 ms, not 20: two reads per commit).
                for msg in consumer.consume(num_messages=10000, timeout=0.005):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if int(msg.offset() or 0) > last:
                                return
                            continue
                        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                            continue  # the group is never used (above)
                        self._raise_if_unauthorized(err.name(), "Read")
                        raise DecisionLogError(f"reading decision log {self.topic!r}: {err}")
                    offset = int(msg.offset() or 0)
                    if offset > last:
                        return
                    key = msg.key() or b""
                    if keys is None or key in keys:
                        yield Entry(offset, msg.timestamp()[1], key, msg.value(), partition)
                    if offset == last:
                        return
        finally:
            consumer.close()

    def _end_offset(self, consumer: Any, tp: Any) -> int:
        """The high watermark. A partition whose leader is being elected or whose new leader's high
        watermark has not caught up (OFFSET_NOT_AVAILABLE, right after a restart), and librdkafka's
        local timeouts and dropped connections while a broker is down, are waited out within the
        log's ``timeout_s``, asking in short steps; past it ``DecisionLogUnavailableError`` says so."""
        from confluent_kafka import KafkaError, KafkaException

        retriable = {
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError.OFFSET_NOT_AVAILABLE,
            KafkaError.FENCED_LEADER_EPOCH,
            KafkaError.UNKNOWN_LEADER_EPOCH,
            KafkaError.REQUEST_TIMED_OUT,
            KafkaError.BROKER_NOT_AVAILABLE,
            # librdkafka's own: a leader that died mid-request (seen: a SIGKILLed broker).
            KafkaError._TIMED_OUT,
            KafkaError._TRANSPORT,
            KafkaError._DESTROY_BROKER,
            KafkaError._ALL_BROKERS_DOWN,
        }
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                return int(consumer.get_watermark_offsets(tp, timeout=max(0.5, min(5.0, left)))[1])
            except KafkaException as e:
                if e.args[0].code() not in retriable:
                    raise
                if time.monotonic() > deadline:
                    raise DecisionLogUnavailableError(
                        f"decision topic {self.topic!r} (partition {tp.partition}) answered no end offset for "
                        f"{self.timeout_s:g} s: {e.args[0].str()}. Its leader is down or being elected; nothing "
                        "was decided or ended by this call. Bring the broker back (or wait for a new leader), "
                        "then retry or clear this task."
                    ) from e
                time.sleep(0.1)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None


def check_topic_settings(topic: str, configs: Mapping[str, str | None], partitions: int, rf: int, brokers: int) -> None:
    """Refuse a decision topic that could drop, reorder or lose decisions; say how to fix it."""
    problems = []
    if configs.get("cleanup.policy") != "compact":
        problems.append(
            f"cleanup.policy={configs.get('cleanup.policy')} (must be exactly 'compact': 'delete' expires "
            "decisions and run records)"
        )
    if partitions not in (1, 2):
        problems.append(
            f"{partitions} partitions (must be 2: partition 0 is the one order of decisions, 1 the history; "
            "or 1, as kafka2pc 0.1.0 made it)"
        )
    if configs.get("message.timestamp.type") != "LogAppendTime":
        problems.append(
            f"message.timestamp.type={configs.get('message.timestamp.type')} (must be LogAppendTime: "
            "deadlines are broker time)"
        )
    if rf < min(3, brokers):
        problems.append(f"replication factor {rf} on a {brokers}-broker cluster (must be at least {min(3, brokers)})")
    isr = int(configs.get("min.insync.replicas") or 1)
    if isr < min(2, rf):
        problems.append(f"min.insync.replicas={isr} (must be at least {min(2, rf)}: one disk must not lose a decision)")
    if configs.get("unclean.leader.election.enable") == "true":
        problems.append("unclean.leader.election.enable=true (an unclean leader drops acknowledged decisions)")
    if problems:
        raise UnsafeDecisionTopicError(
            f"decision topic {topic!r} is unsafe: " + "; ".join(problems) + ". Fix it with kafka-configs.sh "
            f"--alter --entity-type topics --entity-name {topic} --add-config ..., or delete it (nothing in "
            "flight) or use another decision topic so kafka2pc creates it with "
            + ", ".join(f"{k}={v}" for k, v in TOPIC_CONFIG.items())
        )
