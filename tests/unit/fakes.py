"""In-memory stand-ins for the broker, the decision log and the clock (no network anywhere).

``FakeBroker`` plays the transaction coordinator behind the four raw APIs that
``TransactionInspector`` and ``TransactionResolver`` use. It keeps one ``TxnState`` per
transactional id and answers EndTxn the way a coordinator under transaction version 1 does;
tests script error codes and state changes on top of that.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from time import struct_time
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog, Position
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.kafka.errors import BrokerErrorResponse, error_name
from airflow_provider_kafka2pc.txn.kafka.markers import Fate, PartitionFate
from airflow_provider_kafka2pc.txn.kafka.wire import Coordinator, TxnListing, TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TXN_STATE,
    NONE,
    NOT_COORDINATOR,
    PRODUCER_FENCED,
    TRANSACTIONAL_ID_NOT_FOUND,
    TxnRef,
)
from airflow_provider_kafka2pc.txn.protocol.records import (
    DECISION_KEY,
    Covered,
    DecisionRecord,
    Entry,
    Kind,
    new_decision,
)

INVALID_TRANSACTION_TIMEOUT = 50  # a timeout above the broker's transaction.max.timeout.ms
TOPIC = "events"
DEFAULT_TIMEOUT_MS = 900_000  # the broker's default transaction.max.timeout.ms


def now_ms() -> int:
    return int(time.time() * 1000)


def committable(
    tid: str,
    producer_id: int = 1000,
    producer_epoch: int = 0,
    records: int = 10,
    partitions: Sequence[int] = (0,),
    first_write_ms: int | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> Committable:
    return Committable(
        transactional_id=tid,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        records=records,
        bytes=records * 100,
        topic_partitions=tuple((TOPIC, p) for p in partitions),
        first_write_ms=now_ms() if first_write_ms is None else first_write_ms,
        transaction_timeout_ms=timeout_ms,
        counts_by_topic={TOPIC: records},
    )


def ref(tid: str, producer_id: int = 1000, producer_epoch: int = 0) -> TxnRef:
    return TxnRef(tid, producer_id, producer_epoch)


def txn_state(
    tid: str,
    state: str = "Ongoing",
    producer_id: int = 1000,
    producer_epoch: int = 0,
    partitions: Sequence[int] = (0,),
    coordinator_id: int = 1,
    start_time_ms: int | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> TxnState:
    return TxnState(
        transactional_id=tid,
        error_code=NONE,
        state=state,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timeout_ms=timeout_ms,
        start_time_ms=now_ms() if start_time_ms is None else start_time_ms,
        topic_partitions=tuple((TOPIC, p) for p in partitions),
        coordinator_id=coordinator_id,
    )


def legacy_record(
    tid: str, decision: str, producer_id: int = 1000, producer_epoch: int = 0, run: str = "run-1"
) -> tuple[bytes, bytes]:
    """A per-id record as 0.1.0 wrote it (key = transactional id), for the upgrade path."""
    value = json.dumps(
        {"tid": tid, "pid": producer_id, "epoch": producer_epoch, "decision": decision, "run": run, "at_ms": now_ms()}
    )
    return tid.encode(), value.encode()


def decision_item(
    kind: Kind, refs: Sequence[TxnRef], run: str = "run-1", actor: str = "test", prefixes: Sequence[str] = ()
) -> tuple[bytes, bytes]:
    """One decision record covering ``refs``, ready to seed a ``MemoryDecisionLog``."""
    d = new_decision(
        kind,
        (Covered(r.transactional_id, r.producer_id, r.producer_epoch, 10) for r in refs),
        run,
        actor,
        prefixes,
        now_ms(),
    )
    return d.key, d.to_json()


@dataclass(frozen=True)
class EndTxnCall:
    node_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


# A scripted EndTxn answer: an error code, or a function that changes the broker and returns one.
# NONE (0) means "no scripted error": the broker then answers by its own rules.
EndTxnStep = int | Callable[["FakeBroker"], int]


class FakeBroker(WireClient):
    """A transaction coordinator in memory, implementing the ``WireClient`` calls the core makes."""

    def __init__(self, events: list[str] | None = None) -> None:  # no super(): nothing to connect
        self._lock = threading.RLock()
        self.states: dict[str, TxnState] = {}
        self.coordinators: dict[str, int] = {}  # transactional id -> node id; node 1 by default
        # kafka-python's coordinator cache, which routes describe_transactions: the node each id was
        # last found on (an id never found is looked up by kafka-python itself: its real coordinator).
        self.routes: dict[str, int] = {}
        self.end_txn_script: dict[str, list[EndTxnStep]] = defaultdict(list)
        self.find_errors: dict[str, list[int]] = defaultdict(list)
        self.describe_errors: dict[str, list[int]] = defaultdict(list)
        self.list_errors: list[int] = []  # whole-response codes of the next ListTransactions, in order
        self.upcoming_states: dict[str, list[TxnState]] = defaultdict(list)  # shown by later describes
        self.supports_pattern = True
        self.max_transaction_timeout_ms = 900_000  # the broker's transaction.max.timeout.ms
        self.end_txn_barrier: threading.Barrier | None = None
        self.events: list[str] = events if events is not None else []
        self.end_txn_calls: list[EndTxnCall] = []
        self.find_calls: list[tuple[str, ...]] = []
        self.describe_calls: list[tuple[int, tuple[str, ...]]] = []
        self.list_calls: list[tuple[tuple[str, ...], str | None]] = []
        # What the data partitions show of each (id, producer id, epoch) once ended: its markers.
        self.fates: dict[tuple[str, int, int], Fate] = {}

    # -- arranging the broker -------------------------------------------------
    def add(self, *states: TxnState) -> None:
        with self._lock:
            for s in states:
                self.states[s.transactional_id] = s

    def prepared(self, c: Committable) -> None:
        """The broker holds ``c`` open, as the writer left it."""
        self.add(
            txn_state(
                c.transactional_id,
                "Ongoing",
                c.producer_id,
                c.producer_epoch,
                partitions=[p for _, p in c.topic_partitions],
                coordinator_id=self.coordinator_of(c.transactional_id),
                start_time_ms=c.first_write_ms,
                timeout_ms=c.transaction_timeout_ms,
            )
        )

    def set_state(
        self, tid: str, state: str, producer_id: int | None = None, producer_epoch: int | None = None
    ) -> None:
        with self._lock:
            s = self.states[tid]
            if state in ("PrepareCommit", "CompleteCommit", "PrepareAbort", "CompleteAbort"):
                ended = Fate.COMMITTED if "Commit" in state else Fate.ABORTED
                self.fates.setdefault((tid, s.producer_id, s.producer_epoch), ended)  # markers stay
            self.states[tid] = dataclasses.replace(
                s,
                state=state,
                producer_id=s.producer_id if producer_id is None else producer_id,
                producer_epoch=s.producer_epoch if producer_epoch is None else producer_epoch,
                topic_partitions=s.topic_partitions if state == "Ongoing" else (),
            )

    def time_out(self, tid: str) -> None:
        """The coordinator aborts the transaction after transaction.timeout.ms: epoch + 1."""
        self.set_state(tid, "CompleteAbort", producer_epoch=self.states[tid].producer_epoch + 1)

    def coordinator_of(self, tid: str) -> int:
        return self.coordinators.get(tid, 1)

    def state_of(self, tid: str) -> str | None:
        s = self.states.get(tid)
        return None if s is None else s.state

    def commits_sent(self) -> list[str]:
        return [c.transactional_id for c in self.end_txn_calls if c.commit]

    def aborts_sent(self) -> list[str]:
        return [c.transactional_id for c in self.end_txn_calls if not c.commit]

    # -- WireClient ------------------------------------------------------------
    def close(self) -> None:
        pass

    def find_transaction_coordinators(self, transactional_ids: Sequence[str]) -> dict[str, Coordinator]:
        with self._lock:
            self.find_calls.append(tuple(transactional_ids))
            out = {}
            for tid in transactional_ids:
                errors = self.find_errors[tid]
                if errors:
                    out[tid] = Coordinator(-1, errors.pop(0))
                else:
                    out[tid] = Coordinator(self.coordinator_of(tid), NONE)
                    self.routes[tid] = out[tid].node_id
            return out

    def describe_transactions(self, transactional_ids: Sequence[str]) -> dict[str, TxnState]:
        with self._lock:
            self.events.append(f"describe {','.join(transactional_ids)}")
            by_node: dict[int, list[str]] = defaultdict(list)
            for tid in transactional_ids:
                by_node[self.routes.get(tid, self.coordinator_of(tid))].append(tid)
            out = {}
            for node_id, group in by_node.items():
                self.describe_calls.append((node_id, tuple(group)))
                out.update(self._describe_on(node_id, group))
            return out

    def _describe_on(self, node_id: int, transactional_ids: list[str]) -> dict[str, TxnState]:
        out = {}
        for tid in transactional_ids:
            if self.upcoming_states[tid]:
                self.states[tid] = self.upcoming_states[tid].pop(0)
            errors = self.describe_errors[tid]
            if errors:
                out[tid] = _error_row(tid, errors.pop(0), node_id)
            elif node_id != self.coordinator_of(tid):
                out[tid] = _error_row(tid, NOT_COORDINATOR, node_id)
            elif tid not in self.states:
                out[tid] = _error_row(tid, TRANSACTIONAL_ID_NOT_FOUND, node_id)
            else:
                out[tid] = dataclasses.replace(self.states[tid], coordinator_id=node_id)
        return out

    def end_txn(self, node_id: int, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        if self.end_txn_barrier is not None:
            self.end_txn_barrier.wait()  # outside the lock: proves the calls are concurrent
        with self._lock:
            self.end_txn_calls.append(EndTxnCall(node_id, transactional_id, producer_id, producer_epoch, commit))
            self.events.append(f"end_txn {'commit' if commit else 'abort'} {transactional_id}")
            script = self.end_txn_script[transactional_id]
            if script:
                step = script.pop(0)
                code = step if isinstance(step, int) else step(self)
                if code != NONE:
                    return code
            return self._end_txn_rules(node_id, transactional_id, producer_id, producer_epoch, commit)

    def init_producer_id(self, node_id: int, transactional_id: str, timeout_ms: int) -> tuple[int, int, int]:
        """A new id gets producer id 1000 + n at epoch 0; a known one keeps its producer id at epoch + 1,
        its open transaction aborted."""
        with self._lock:
            self.events.append(f"init_producer_id {transactional_id}")
            if node_id != self.coordinator_of(transactional_id):
                return NOT_COORDINATOR, -1, -1
            if timeout_ms > self.max_transaction_timeout_ms:
                return INVALID_TRANSACTION_TIMEOUT, -1, -1
            s = self.states.get(transactional_id)
            if s is None:
                producer_id, epoch = 1000 + len(self.states), 0
                self.add(txn_state(transactional_id, "Empty", producer_id, epoch, timeout_ms=timeout_ms))
            else:
                if s.state == "Ongoing":
                    self.set_state(transactional_id, "CompleteAbort")
                producer_id, epoch = s.producer_id, s.producer_epoch + 1
                self.set_state(transactional_id, "Empty", producer_epoch=epoch)
            return NONE, producer_id, epoch

    def _end_txn_rules(self, node_id: int, tid: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """What a coordinator answers under transaction version 1 (EndTxn <= v4)."""
        if node_id != self.coordinator_of(tid):
            return NOT_COORDINATOR
        s = self.states.get(tid)
        if s is None or s.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if s.producer_epoch != producer_epoch:
            return PRODUCER_FENCED
        if s.state == "Ongoing":
            self.set_state(tid, "CompleteCommit" if commit else "CompleteAbort")
            return NONE
        if (s.state, commit) in (("CompleteCommit", True), ("CompleteAbort", False)):
            return NONE  # the same end again: no epoch bump under these rules, so it answers NONE
        if s.state in ("PrepareCommit", "PrepareAbort"):
            return CONCURRENT_TRANSACTIONS
        return INVALID_TXN_STATE

    def transaction_fate(
        self, ref: Any, partitions: Sequence[str], since_ms: int, timeout_s: float
    ) -> tuple[Fate, tuple[PartitionFate, ...]]:
        with self._lock:
            fate = self.fates.get((ref.transactional_id, ref.producer_id, ref.producer_epoch), Fate.ABSENT)
            return fate, tuple(
                PartitionFate(p, fate, 7 if fate in (Fate.COMMITTED, Fate.ABORTED) else None) for p in partitions
            )

    def list_transactions(
        self, states: Iterable[str], pattern: str | None, prefix: str | None = None, timeout_s: float = 30.0
    ) -> list[TxnListing]:
        wanted = tuple(states)
        with self._lock:
            self.list_calls.append((wanted, pattern))
            if self.list_errors:
                code = self.list_errors.pop(0)
                raise BrokerErrorResponse("ListTransactions", code, error_name(code))
            return [
                TxnListing(s.transactional_id, s.producer_id, s.state)
                for s in self.states.values()
                if s.state in wanted
                and (pattern is None or not self.supports_pattern or re.fullmatch(pattern, s.transactional_id))
            ]


def _error_row(tid: str, code: int, node_id: int) -> TxnState:
    return TxnState(tid, code, "", -1, -1, -1, -1, (), node_id)


class MemoryDecisionLog(DecisionLog):
    """The decision log without Kafka: the real protocol over an in-memory ``append``/``scan``.

    Offsets grow by one per record; timestamps play LogAppendTime from the wall clock (or
    ``broker_time_ms`` when a test sets it). ``compact()`` does what Kafka's cleaner does.
    """

    def __init__(self, events: list[str] | None = None, initial: Iterable[tuple[bytes, bytes | None]] = ()) -> None:
        super().__init__({"bootstrap.servers": "unused:9092"})
        self._lock = threading.Lock()
        self.events: list[str] = events if events is not None else []
        self.entries: list[Entry] = []
        self.broker_time_ms: int | None = None
        self._partitions = 1
        self.append(list(initial))

    def ensure_topic(self) -> None:
        """Nothing to create: append and scan never leave memory."""

    def sibling(self) -> MemoryDecisionLog:
        """The same memory: another thread's client of one log (its lock keeps appends whole)."""
        return self

    def close(self) -> None:
        """Nothing to close: a sibling's close must not end the log its test still reads."""

    def append(self, items: Sequence[tuple[bytes, bytes | None]]) -> list[Position]:
        out = []
        with self._lock:
            for key, value in items:
                offset = self.entries[-1].offset + 1 if self.entries else 0
                ts = self.broker_time_ms if self.broker_time_ms is not None else now_ms()
                self.entries.append(Entry(offset, ts, key, value))
                out.append(Position(offset, ts))
                self.events.append(_describe(key, value))
        return out

    def scan(
        self, until: int | None = None, partition: int = 0, keys: frozenset[bytes] | None = None
    ) -> Iterator[Entry]:
        assert partition == 0, "the fake is a one-partition log (as 0.1.0 made it): run records live in partition 0"
        with self._lock:
            entries = list(self.entries)
        return iter([e for e in entries if until is None or e.offset <= until])

    def compact(self) -> None:
        """Keep the latest record per key and drop tombstones, as the log cleaner eventually does."""
        with self._lock:
            latest = {e.key: e for e in self.entries}
            self.entries = sorted((e for e in latest.values() if e.value is not None), key=lambda e: e.offset)

    def decisions_of(self, tid: str) -> list[DecisionRecord]:
        """Every decision ever appended that covers ``tid``, in log order (tombstoned ones too)."""
        out = []
        for e in self.entries:
            if e.key.startswith(DECISION_KEY.encode()) and e.value is not None:
                d = DecisionRecord.from_json(e.value)
                if any(c.transactional_id == tid for c in d.txns):
                    out.append(d)
        return out

    def decisions(self, tid: str) -> list[Kind]:
        return [d.kind for d in self.decisions_of(tid)]


def _describe(key: bytes, value: bytes | None) -> str:
    k = key.decode()
    if value is None:
        return f"tombstone {k}"
    if k.startswith(DECISION_KEY):
        d = DecisionRecord.from_json(value)
        return f"decision {d.kind.value} {' '.join(c.transactional_id for c in d.txns)}"
    return f"record {k}"


class FakeClients(KafkaClients):
    """A prepare's or a command's clients: one fake broker and one in-memory decision log, kept
    (not closed) across the calls of a test."""

    def __init__(self, broker: FakeBroker, log: MemoryDecisionLog, bootstrap: str = "b:9092") -> None:
        super().__init__({"bootstrap.servers": bootstrap}, DEFAULT_DECISION_TOPIC, timeout_s=1.0)
        self.broker, self.log = broker, log

    def wire(self) -> WireClient:
        return self.broker

    def decision_log(self) -> DecisionLog:
        return self.log

    def close(self) -> None:
        pass


class FakeClock:
    """Monotonic time that only moves when someone sleeps; wall-clock time stays real."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 1_000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._now += seconds

    @staticmethod
    def time() -> float:
        return time.time()

    # Formatting a wall-clock time stays real too (the core names the time of a winning decision).
    @staticmethod
    def gmtime(seconds: float | None = None) -> struct_time:
        return time.gmtime(seconds)

    @staticmethod
    def strftime(fmt: str, t: struct_time) -> str:
        return time.strftime(fmt, t)
