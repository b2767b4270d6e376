"""The decision topic's client core: its settings, and waiting out an unavailable topic.

Every read and every append of the decision log runs within one budget (``budget_s``): transient
errors (a leader being elected, a broker restarting) are waited out in short steps; past the budget
the call raises ``DecisionLogUnavailableError`` naming the topic, the partition, the last error,
what the call wrote and what to do; an authorization failure names the ACL at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from airflow_provider_kafka2pc.txn.kafka.errors import (
    DecisionLogError,
    DecisionLogUnavailableError,
    UnsafeDecisionTopicError,
)
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

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
    # A request still queued for a dead leader's connection when its step ran out (seen: a recovery
    # started as the decision topic's leader was SIGKILLed, on a loaded machine).
    "_TIMED_OUT_QUEUE",
    "_TRANSPORT",
    "_DESTROY_BROKER",
    "_ALL_BROKERS_DOWN",
    "_RESOLVE",
    "_WAIT_COORD",
    "_NODE_UPDATE",
)
T = TypeVar("T")


@functools.cache
def _transient_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, n) for n in _TRANSIENT_ERRORS if hasattr(KafkaError, n))


def is_transient(err: Any) -> bool:
    """A KafkaError that a leader change or a dead broker causes, and that passes."""
    return err.code() in _transient_codes()


@dataclass(frozen=True)
class Failure:
    name: str
    text: str
    transient: bool

    @classmethod
    def of_error(cls, err: Any) -> Failure:
        """A KafkaError's name and text, and whether it passes."""
        return cls(err.name(), err.str(), is_transient(err))

    def __str__(self) -> str:
        return f"{self.name}: {self.text}"


def failure_of(exc: BaseException) -> Failure:
    """What a confluent-kafka call raised: a KafkaError's name and text, or a future's timeout."""
    err: Any = exc.args[0] if exc.args else None
    if callable(getattr(err, "code", None)) and callable(getattr(err, "name", None)):
        return Failure.of_error(err)
    if isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError)):
        return Failure("_TIMED_OUT", str(exc) or "no answer in time", True)
    return Failure(type(exc).__name__, str(exc), False)


class Budget:
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


class DecisionTopicClient:
    """What every call on the decision topic shares: the client settings, the topic, the exporters
    it serves (its errors name them) and the budget of the read or append running on each thread."""

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

    def sibling(self) -> Self:
        """A client of the same topic with the same settings, for another thread: a client's producer
        and budget are its own (a failed append purges its producer's queue)."""
        twin = type(self)(self._config, self.topic, self._replication_factor, self.timeout_s)
        twin.prefixes = set(self.prefixes)
        return twin

    @property
    def budget_s(self) -> float:
        """How long one read or one append waits out an unavailable decision topic (a leader being
        elected, a dead broker) before ``DecisionLogUnavailableError``: twice ``timeout_s``."""
        return BUDGET_FACTOR * self.timeout_s

    @contextlib.contextmanager
    def _budget(self, outcome: str = NOTHING_WRITTEN) -> Iterator[Budget]:
        """The budget of the outermost read or append on this thread; nested calls share it."""
        current: Budget | None = getattr(self._local, "budget", None)
        if current is not None:
            yield current
            return
        self._local.budget = budget = Budget(self.budget_s, outcome)
        try:
            yield budget
        finally:
            self._local.budget = None

    def _wait_out(self, failure: Failure, budget: Budget, doing: str, operation: str, partition: int | None) -> None:
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
                    self._wait_out(failure_of(e), budget, doing, operation, partition)

    def _unavailable(
        self, budget: Budget, doing: str, error: str, partition: int | None
    ) -> DecisionLogUnavailableError:
        where = f"partition {partition} of " if partition is not None else ""
        return DecisionLogUnavailableError(
            f"decision log unavailable: {where}decision topic {self.topic!r} (Kafka at "
            f"{self._config.get('bootstrap.servers')}) did not answer for {budget.seconds:g} s while {doing}; "
            f"last error {error}.{self._unreachable()} Its leader is down or being elected (a broker crashed or "
            f"restarts), or no broker answers. {budget.outcome} Retry the task once the brokers are back: it reads "
            f"the decision log first and obeys any decision in it. {self._describe_hint()}"
        )

    def _unreachable(self) -> str:
        """ " Now: cannot reach Kafka at ...: connection refused ..." when no broker answers at all, in
        the words of every other "cannot reach Kafka"; "" when one does (a leader being elected)."""
        from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S, check_reachable

        try:
            check_reachable(self._config, min(self.timeout_s, DEFAULT_CONNECT_TIMEOUT_S))
        except Kafka2PCError as e:
            return f" Now: {e}."
        except Exception:  # a courtesy: it must never hide the error it adds to
            log.debug("could not ask whether Kafka is reachable", exc_info=True)
        return ""

    def _describe_hint(self) -> str:
        topic = "" if self.topic == DEFAULT_DECISION_TOPIC else f" --decision-topic {shlex.quote(self.topic)}"
        if not self.prefixes:
            return (
                "To see whether a decision was written: kafka2pc describe --prefix with the exporter's "
                f"transactional id prefix{topic and f' and{topic}'}, with this task's connection settings."
            )
        commands = " ; ".join(f"kafka2pc describe --prefix {shlex.quote(p)}{topic}" for p in sorted(self.prefixes))
        return f"To see whether a decision was written (with this task's connection settings): {commands}"

    def _raise_if_unauthorized(self, error_name: str, operation: str) -> None:
        named = self._unauthorized(error_name, operation)
        if named is not None:
            raise named

    def _unauthorized(self, error_name: str, operation: str) -> Kafka2PCError | None:
        from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of

        resource = READER_GROUP if error_name == "GROUP_AUTHORIZATION_FAILED" else self.topic
        return authorization_error_of(error_name, self._config, resource, operation)


__all__ = [
    "DEFAULT_DECISION_TOPIC",
    "MAX_RECORD_BYTES",
    "NOTHING_WRITTEN",
    "READER_GROUP",
    "TOPIC_CONFIG",
    "Budget",
    "DecisionLogError",
    "DecisionLogUnavailableError",
    "DecisionTopicClient",
    "Failure",
    "UnsafeDecisionTopicError",
    "failure_of",
    "is_transient",
]
