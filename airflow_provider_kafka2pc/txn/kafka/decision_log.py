"""The decision topic: reading and appending records of the decision protocol (``txn/protocol/decisions.py``).

Compacted, LogAppendTime, acks=all with an idempotent producer. Partition 0 is the protocol (its
one total order); partition 1 holds the run records of finished runs, the history, which only a
task that asks about its own run reads. Records carry ids and counts only, never connection
settings. An existing topic is checked before it is trusted; a one-partition topic (0.1.0) keeps
everything in partition 0.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import itertools
import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import CONNECTION_DEFAULTS, connection_only
from airflow_provider_kafka2pc.txn.protocol.decisions import (
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
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, Kafka2PCError, PrefixCollisionError
from airflow_provider_kafka2pc.txn.protocol.naming import validate_prefix

log = logging.getLogger(__name__)

DEFAULT_DECISION_TOPIC = "kafka2pc_decisions"
# The consumer group confluent-kafka insists on. Never joined and no offset committed (assign()),
# but librdkafka looks its coordinator up (FindCoordinator) for as long as a consumer with a group.id
# lives, whatever the consumer does: a principal without Describe on this group reads the log all
# the same, and the broker's authorizer logs a DENIED line per lookup (docs/acls.md).
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

# Waiting out an unavailable decision topic. A broker crash leaves the partitions it led without a
# leader until the controller fences it (broker.session.timeout.ms, 9 s by default) and elects
# another; meanwhile librdkafka answers with local timeouts ("Failed to get watermark offsets: Local:
# Timed out"), destroyed broker handles and dropped connections. Every read and every append of the
# log waits that out for at most BUDGET_FACTOR x timeout_s (``DecisionLog.budget_s``: 60 s for the
# default 30 s), asking in steps of at most STEP_S, and past it raises DecisionLogUnavailableError.
BUDGET_FACTOR = 2.0
STEP_S = 5.0
_MIN_STEP_S = 0.5
_PAUSE_S = 0.1
# What a broker crash, a leader election or a restart answers, and passes once a leader serves the
# partition again. Any other error is raised at once (an authorization failure names the ACL).
_TRANSIENT_ERRORS = (
    "NOT_LEADER_FOR_PARTITION",
    "NOT_LEADER_OR_FOLLOWER",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_TOPIC_OR_PART",
    "_UNKNOWN_PARTITION",
    "OFFSET_NOT_AVAILABLE",  # a new leader's high watermark has not caught up yet
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "REQUEST_TIMED_OUT",
    "BROKER_NOT_AVAILABLE",
    "NOT_CONTROLLER",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "KAFKA_STORAGE_ERROR",
    "NETWORK_EXCEPTION",
    "_MSG_TIMED_OUT",
    # librdkafka's own: a leader that died mid-request (seen with a SIGKILLed broker).
    "_TIMED_OUT",
    "_TRANSPORT",
    "_DESTROY_BROKER",
    "_ALL_BROKERS_DOWN",
    "_RESOLVE",
    "_WAIT_COORD",
    "_NODE_UPDATE",
)
T = TypeVar("T")
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


class DecisionLogUnavailableError(DecisionLogError, BrokerUnavailableError):
    """The decision topic (its partition's leader, or every broker) stayed unavailable for a read's or
    an append's whole budget (``DecisionLog.budget_s``); the message names the topic, the partition,
    the last error, what the call did or did not write, and what to do."""


@functools.cache
def _transient_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, n) for n in _TRANSIENT_ERRORS if hasattr(KafkaError, n))


def _is_transient(err: Any) -> bool:
    """A KafkaError that a leader change or a dead broker causes, and that passes."""
    return err.code() in _transient_codes()


@dataclass(frozen=True)
class _Failure:
    name: str
    text: str
    transient: bool

    def __str__(self) -> str:
        return f"{self.name}: {self.text}"


def _failure(exc: BaseException) -> _Failure:
    """What a confluent-kafka call raised: a KafkaError's name and text, or a future's timeout."""
    err: Any = exc.args[0] if exc.args else None
    if callable(getattr(err, "code", None)) and callable(getattr(err, "name", None)):
        return _Failure(err.name(), err.str(), _is_transient(err))
    if isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError)):
        return _Failure("_TIMED_OUT", str(exc) or "no answer in time", True)
    return _Failure(type(exc).__name__, str(exc), False)


class _Budget:
    """How long one read or one append may wait for an unavailable decision topic; nested calls
    (the topic check, both partitions of a read) share it."""

    def __init__(self, seconds: float, outcome: str) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.outcome = outcome  # what the call has written so far, for the error past the budget

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def step(self) -> float:
        """The timeout of one librdkafka call: short, so a new leader is met within a step."""
        return max(_MIN_STEP_S, min(STEP_S, self.left()))


NOTHING_WRITTEN = "Nothing was decided or ended by this call."


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
        # The exporters this log serves, as the calls that know them say: its errors name them.
        self.prefixes: set[str] = set()
        self._producer: Any = None
        self._ready = False
        self._partitions = 2
        self._local = threading.local()  # the budget of the read or append running on this thread

    @property
    def budget_s(self) -> float:
        """How long one read or one append waits out an unavailable decision topic (a leader being
        elected, a dead broker) before ``DecisionLogUnavailableError``: twice ``timeout_s``."""
        return BUDGET_FACTOR * self.timeout_s

    @contextlib.contextmanager
    def _budget(self, outcome: str = NOTHING_WRITTEN) -> Iterator[_Budget]:
        """The budget of the outermost read or append on this thread; nested calls share it."""
        current: _Budget | None = getattr(self._local, "budget", None)
        if current is not None:
            yield current
            return
        self._local.budget = budget = _Budget(self.budget_s, outcome)
        try:
            yield budget
        finally:
            self._local.budget = None

    def _wait_out(self, failure: _Failure, budget: _Budget, doing: str, operation: str, partition: int | None) -> None:
        """Return after a short pause if ``failure`` passes and the budget lasts; raise otherwise: a
        named authorization error, DecisionLogUnavailableError past the budget, else DecisionLogError."""
        if not failure.transient:
            self._raise_if_unauthorized(failure.name, operation)
            raise DecisionLogError(f"decision log topic {self.topic!r}: {doing} failed: {failure}")
        if budget.left() <= 0:
            raise self._unavailable(budget, doing, str(failure), partition)
        time.sleep(_PAUSE_S)

    def _retrying(
        self, doing: str, call: Callable[[float], T], partition: int | None = None, operation: str = "Read"
    ) -> T:
        """``call(step timeout)`` until it answers, waiting out transient errors within the budget."""
        from confluent_kafka import KafkaException

        with self._budget() as budget:
            while True:
                try:
                    return call(budget.step())
                except (KafkaException, TimeoutError, concurrent.futures.TimeoutError) as e:
                    self._wait_out(_failure(e), budget, doing, operation, partition)

    def _unavailable(
        self, budget: _Budget, doing: str, error: str, partition: int | None
    ) -> DecisionLogUnavailableError:
        where = f"partition {partition} of " if partition is not None else ""
        return DecisionLogUnavailableError(
            f"decision log unavailable: {where}decision topic {self.topic!r} (Kafka at "
            f"{self._config.get('bootstrap.servers')}) did not answer for {budget.seconds:g} s while {doing}; "
            f"last error {error}. Its leader is down or being elected (a broker crashed or restarts), or no "
            f"broker answers. {budget.outcome} Retry the task once the brokers are back: it reads the decision "
            f"log first and obeys any decision in it. {self._describe_hint()}"
        )

    def _describe_hint(self) -> str:
        topic = "" if self.topic == DEFAULT_DECISION_TOPIC else f" --decision-topic {shlex.quote(self.topic)}"
        if not self.prefixes:
            return (
                "To see whether a decision was written: kafka2pc describe --prefix with the exporter's "
                f"transactional id prefix{topic and f' and{topic}'}, with this task's connection settings."
            )
        commands = " ; ".join(f"kafka2pc describe --prefix {shlex.quote(p)}{topic}" for p in sorted(self.prefixes))
        return f"To see whether a decision was written (with this task's connection settings): {commands}"

    # -- topic --------------------------------------------------------------
    def ensure_topic(self) -> None:
        """Create the topic with safe settings, or check an existing one; once per instance."""
        if self._ready:
            return
        with self._budget():
            self._ensure_topic()

    def _ensure_topic(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient(with_log(connection_only(self._config)))
        md = self._retrying("reading the cluster's metadata", lambda t: admin.list_topics(timeout=t), None, "Describe")
        if self.topic not in md.topics:
            rf = self._replication_factor or min(3, len(md.brokers))
            new = NewTopic(
                self.topic,
                num_partitions=2,  # 0: the protocol, in one total order; 1: the history
                replication_factor=rf,
                config={**TOPIC_CONFIG, "min.insync.replicas": str(min(2, rf))},
            )
            if self._create_topic(new):
                log.info("created decision log topic %s (replication factor %d)", self.topic, rf)
                self._await_leaders(admin)
                self._ready = True
                return
            md = self._retrying("reading its metadata", lambda t: admin.list_topics(self.topic, timeout=t))
        self._partitions = len(md.topics[self.topic].partitions)
        self._check_topic(admin, md)
        self._ready = True

    def _new_admin(self) -> Any:
        """An admin client per try of a request that goes to the controller (CreateTopics,
        DescribeConfigs): librdkafka sends it to the broker its metadata named as controller (KRaft
        names a random live broker) and keeps waiting for that one if it dies (seen: 60 s on a
        SIGKILLed broker); a new client asks the metadata afresh."""
        from confluent_kafka.admin import AdminClient

        return AdminClient(with_log(connection_only(self._config)))

    def _create_topic(self, new: Any) -> bool:
        """True once created, False if it exists already (another actor created it first, or an
        earlier try whose answer was lost)."""
        from confluent_kafka import KafkaError, KafkaException

        with self._budget() as budget:
            while True:
                try:
                    step, admin = budget.step(), self._new_admin()  # held until answered: its futures die with it
                    admin.create_topics([new], operation_timeout=step, request_timeout=step)[self.topic].result()
                    return True
                except KafkaException as e:
                    err: Any = e.args[0] if e.args else None
                    if callable(getattr(err, "code", None)) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                        return False
                    self._wait_out(_failure(e), budget, "creating it", "Create", None)

    def _raise_if_unauthorized(self, error_name: str, operation: str) -> None:
        named = self._unauthorized(error_name, operation)
        if named is not None:
            raise named

    def _unauthorized(self, error_name: str, operation: str) -> Kafka2PCError | None:
        from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of

        resource = READER_GROUP if error_name == "GROUP_AUTHORIZATION_FAILED" else self.topic
        return authorization_error_of(error_name, self._config, resource, operation)

    def _await_leaders(self, admin: Any) -> None:
        """A new topic's partitions answer only once they have leaders."""
        with self._budget() as budget:
            while True:
                md = self._retrying("waiting for its leaders", lambda t: admin.list_topics(self.topic, timeout=t))
                parts = md.topics[self.topic].partitions
                if len(parts) == self._partitions and all(p.leader >= 0 for p in parts.values()):
                    return
                if budget.left() <= 0:
                    raise self._unavailable(budget, "waiting for the new topic's leaders", "no leader yet", None)
                time.sleep(0.05)

    def _check_topic(self, admin: Any, md: Any) -> None:
        from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

        res = ConfigResource(ConfigResource.Type.TOPIC, self.topic)

        def describe(timeout: float) -> Any:
            fresh = self._new_admin()  # held until answered: its futures die with it
            return fresh.describe_configs([res], request_timeout=timeout)[res].result(timeout=timeout + 5.0)

        described = self._retrying(
            "reading its settings",
            describe,
            None,
            "DescribeConfigs",
        )
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
            admin.incremental_alter_configs([alter], request_timeout=self.timeout_s)[alter].result(
                timeout=self.timeout_s + 5.0
            )
        except (KafkaException, TimeoutError) as e:  # e.g. no AlterConfigs ACL: the check below says what to do
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
                    # librdkafka retries a record (same producer id and sequence: never written twice)
                    # until it is acknowledged or this passes; append waits as long, not longer.
                    "message.timeout.ms": int(self.budget_s * 1000),
                }
            )
            producer = Producer(with_log(conf))
            # Connect now, not on the first write.
            self._retrying("connecting its producer", lambda t: producer.list_topics(timeout=t), None, "Write")
            self._producer = producer
        return self._producer

    def _drop_producer(self) -> None:
        """Forget a producer whose records' fate is unknown: what it still queues is purged, so this
        client sends nothing later, behind a decision another actor appends meanwhile (a request
        already on the wire may still be written: the error says the write is uncertain)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.purge(in_queue=True, in_flight=True, blocking=False)
                producer.poll(0)

    def append(self, items: Sequence[Item]) -> list[Position]:
        """Append and flush; returns once every record is acknowledged by all in-sync replicas.

        A leader change or a dead broker is waited out within ``budget_s`` by librdkafka's own
        retries of the idempotent producer, which the broker deduplicates (producer id and
        sequence number). A record is never produced a second time: replay keeps the copy of a key
        at its newest offset, as compaction does, so a decision sent again would move behind any
        decision another actor appended meanwhile, and an ABORT that was void could come to rule
        transactions this decision already committed (``tests/unit/test_decision_log_budget.py``).
        Past the budget the records' fate is uncertain: the producer is purged and dropped, and
        DecisionLogUnavailableError says so; the task's retry reads the log first and obeys a
        decision it finds, so a decision that did land is never contradicted.
        """
        with self._budget() as budget:
            self.ensure_topic()
            producer = self._get_producer()
            failures: list[Any] = []
            positions: dict[int, Position] = {}

            def _extra(err: Any, _msg: Any) -> None:
                if err is not None:
                    failures.append(err)

            def on_delivery(i: int) -> Callable[[Any, Any], None]:
                def cb(err: Any, msg: Any) -> None:
                    if err is not None:
                        failures.append(err)
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
                            f"a decision of {len(value)} bytes exceeds the decision topic's limit of "
                            f"{MAX_RECORD_BYTES}: commit fewer Spark partitions per run (coalesce the DataFrame)"
                        )
                    partition = HISTORY_PARTITION if batch is history else 0
                    self._produce(producer, key, value, partition, on_delivery(i))
                    if batch is history and value is not None and not _is_committed(value):
                        # LOST / ACKNOWLEDGED runs also live in the protocol's partition: recovery meets them.
                        self._produce(producer, key, value, 0, _extra)
                    producer.poll(0)
                remaining = producer.flush(max(0.0, budget.left()))
                if remaining or failures:
                    self._drop_producer()
                    raise self._append_failed(budget, failures, remaining, len(positions), len(items))
            if len(positions) != len(items):
                self._drop_producer()
                raise DecisionLogError(
                    f"decision log write to {self.topic!r} failed: not every record was acknowledged"
                )
        log.debug("appended %d record(s) to %s", len(items), self.topic)
        return [positions[i] for i in range(len(items))]

    def _produce(self, producer: Any, key: bytes, value: bytes | None, partition: int, cb: Any) -> None:
        from confluent_kafka import KafkaException

        try:
            producer.produce(self.topic, key=key, value=value, partition=partition, on_delivery=cb)
        except (KafkaException, BufferError) as e:  # refused locally, before anything was sent
            self._drop_producer()
            raise DecisionLogError(f"decision log write to {self.topic!r} refused by the client: {e}") from e

    def _append_failed(
        self, budget: _Budget, failures: Sequence[Any], remaining: int, acknowledged: int, total: int
    ) -> Kafka2PCError:
        for err in failures:
            named = self._unauthorized(err.name(), "Write")
            if named is not None:
                return named
        fatal = [e for e in failures if callable(getattr(e, "fatal", None)) and e.fatal()]
        if remaining or fatal or all(_is_transient(e) for e in failures):
            partitions = "partitions 1 and 0" if self._partitions > 1 else "partition 0"
            # Unacknowledged covers both a record with a delivery error (a local timeout: it may
            # have reached the broker) and one still waiting for an answer.
            budget.outcome = (
                f"The write of {total} record(s) is uncertain: {acknowledged} acknowledged, {total - acknowledged} "
                "not (timed out or unanswered); those may or may not be in the log."
            )
            last = failures[-1] if failures else None
            error = f"{last.name()}: {last.str()}" if last is not None else f"{remaining} record(s) unacknowledged"
            return self._unavailable(budget, f"appending to {partitions}", error, None)
        return DecisionLogError(
            f"decision log write to {self.topic!r} failed: {remaining} unacknowledged, errors "
            f"{[str(e) for e in failures[:3]]}"
        )

    def decide(self, decision: DecisionRecord, keep_run: KeepRun | None = _no_runs) -> LogState:
        """Append ``decision`` and read the log back up to it: the ruling every actor will see."""
        self.prefixes.update(decision.prefixes)
        pos = self.append([(decision.key, decision.to_json())])[0]
        appended = (
            f"Decision {decision.decision_id} ({decision.kind.value}) was appended at offset {pos.offset} but "
            "not read back; nothing was ended by this call."
        )
        with self._budget(appended):
            state = self.read(until=pos.offset, keep_run=keep_run, history=frozenset())
        if decision.decision_id not in state.decisions:
            raise DecisionLogError(f"decision {decision.decision_id} at offset {pos.offset} was not read back")
        return state

    def claim_prefix(self, prefix: str, owner: str) -> None:
        """Register ``owner`` as the only exporter of ``prefix``; refuse if another owns it."""
        validate_prefix(prefix)
        self.prefixes.add(prefix)
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
        self.prefixes.add(lease.prefix)
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
        first: see ``append``. Waits out an unavailable decision topic within ``budget_s``."""
        with self._budget():
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
        self.prefixes.add(prefix)
        return self.read(keep_run=self.keep_for(prefix, run), history={run_key(prefix, run)} if run else frozenset())

    def keep_for(self, prefix: str, run: str | None = None) -> KeepRun:
        """Run records of ``run`` and the prefix's runs that are not COMMITTED (a loss must be met)."""
        self.prefixes.add(prefix)
        return lambda p, r, raw: p == prefix and (r == run or not _is_committed(raw))

    def keep_run_of(self, prefixes: Sequence[str], run: str) -> KeepRun:
        wanted = set(prefixes)
        self.prefixes.update(wanted)
        return lambda p, r, _raw: r == run and p in wanted

    def scan(
        self, until: int | None = None, partition: int = 0, keys: frozenset[bytes] | None = None
    ) -> Iterator[Entry]:
        """The records of one partition in offset order; with ``keys``, only those keys. Waits out
        an unavailable decision topic within ``budget_s`` (shared with the ``read`` it serves)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

        with self._budget() as budget:
            self.ensure_topic()
            conf = connection_only(self._config)
            conf.update(
                {
                    # confluent-kafka insists on a group.id; no group is joined and no offset
                    # committed (assign(), no commits), but librdkafka looks the group's coordinator
                    # up all the same (READER_GROUP): its GROUP_AUTHORIZATION_FAILED is ignored below.
                    "group.id": READER_GROUP,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
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
                doing = f"reading it up to offset {last}"
                try:
                    consumer.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
                except KafkaException as e:
                    raise DecisionLogError(f"decision log topic {self.topic!r}: {doing} failed: {e}") from e
                last_error = "no record arrived"
                while True:
                    if budget.left() <= 0:
                        raise self._unavailable(budget, doing, last_error, partition)
                    # A short poll: consume() waits out its timeout whenever fewer records remain, and
                    # the last batch of every read does (5 ms, not 20: two reads per commit).
                    try:
                        batch = consumer.consume(num_messages=10000, timeout=0.005)
                    except KafkaException as e:
                        failure = _failure(e)
                        self._wait_out(failure, budget, doing, "Read", partition)
                        last_error = str(failure)
                        continue
                    for msg in batch:
                        err = msg.error()
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                if int(msg.offset() or 0) > last:
                                    return
                                continue
                            if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                                continue  # the group is never used (above)
                            if _is_transient(err):  # librdkafka fetches again from the new leader
                                last_error = f"{err.name()}: {err.str()}"
                                continue
                            self._raise_if_unauthorized(err.name(), "Read")
                            raise DecisionLogError(f"decision log topic {self.topic!r}: {doing} failed: {err}")
                        offset = int(msg.offset() or 0)
                        if offset > last:
                            return
                        key = msg.key() or b""
                        if keys is None or key in keys:
                            yield Entry(offset, msg.timestamp()[1], key, msg.value(), partition)
                        if offset == last:
                            return
            finally:
                with contextlib.suppress(Exception):
                    consumer.close()

    def _end_offset(self, consumer: Any, tp: Any) -> int:
        """The high watermark. A partition whose leader is being elected or whose new leader's high
        watermark has not caught up (OFFSET_NOT_AVAILABLE, right after a restart), and librdkafka's
        local timeouts and dropped connections while a broker is down, are waited out within the
        budget, asking in short steps; past it ``DecisionLogUnavailableError`` says so."""
        tries = 0

        def ask(timeout: float) -> tuple[int, int]:
            nonlocal tries
            tries += 1
            if tries > 1:
                # librdkafka asks the leader its metadata cache names, and nothing refreshes that
                # cache for a consumer that fetches nothing yet: a dead leader stayed asked for the
                # whole budget (seen: 60 s). A metadata request for the topic updates the cache.
                with contextlib.suppress(Exception):
                    consumer.list_topics(self.topic, timeout=timeout)
            low_high: tuple[int, int] = consumer.get_watermark_offsets(tp, timeout=timeout)
            return low_high

        _low, high = self._retrying("asking for its end offset", ask, tp.partition, "Read")
        return int(high)

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
