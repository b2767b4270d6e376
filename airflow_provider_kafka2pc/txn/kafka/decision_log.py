"""The decision topic: reading and appending records of the decision protocol (``txn/protocol/decisions.py``).

Compacted, LogAppendTime, acks=all with an idempotent producer. Partition 0 is the protocol (its
one total order); partition 1 holds the run records of finished runs, the history, which only a
task that asks about its own run reads. Records carry ids and counts only, never connection
settings. An existing topic is checked before it is trusted; a one-partition topic (0.1.0) keeps
everything in partition 0.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import CONNECTION_DEFAULTS
from airflow_provider_kafka2pc.txn.kafka.decision_topic import HISTORY_PARTITION
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import (
    MAX_RECORD_BYTES,
    Budget,
    is_transient,
)
from airflow_provider_kafka2pc.txn.kafka.decision_topic_reader import DecisionTopicReader
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError
from airflow_provider_kafka2pc.txn.protocol.decisions import LogState, replay
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, PrefixCollisionError, SourceError
from airflow_provider_kafka2pc.txn.protocol.naming import validate_prefix
from airflow_provider_kafka2pc.txn.protocol.records import (
    CLAIM_KEY,
    GROUP_KEY,
    POSITION_KEY,
    RUN_KEY,
    SOURCE_FILES_KEY,
    DecisionRecord,
    Entry,
    Lease,
    RunStatus,
    run_key,
)
from airflow_provider_kafka2pc.txn.protocol.run_history import history_key
from airflow_provider_kafka2pc.txn.protocol.source_files import (
    Dealing,
    Splits,
    decode_dealt,
    decode_splits,
    encode_dealt,
    encode_splits,
    source_files_key,
)

log = logging.getLogger(__name__)

RUN_KEY_BYTES = RUN_KEY.encode()
SOURCE_FILES_KEY_BYTES = SOURCE_FILES_KEY.encode()


def _of_history(key: bytes, value: bytes | None) -> bool:
    """Records of the history partition: run records (their tombstones are partition 0's only) and
    source-file listings (with their tombstones)."""
    return (key.startswith(RUN_KEY_BYTES) and value is not None) or key.startswith(SOURCE_FILES_KEY_BYTES)


Item = tuple[bytes, bytes | None]
History = Collection[bytes] | Literal["all"]  # which run records of finished runs a read needs
KeepRun = Callable[[str, str, bytes], bool]  # (prefix, run, raw value): keep this run record?


def _no_runs(_prefix: str, _run: str, _raw: bytes) -> bool:
    return False


def is_committed(raw: bytes) -> bool:
    return f'"status":"{RunStatus.COMMITTED.value}"'.encode() in raw


@dataclass(frozen=True)
class Position:
    offset: int
    timestamp_ms: int  # LogAppendTime: the broker's clock


class DecisionLog(DecisionTopicReader):
    """Reads and appends the decision topic with confluent-kafka.

    ``append`` and ``scan`` are the only I/O; everything else is the protocol's ``replay``.
    """

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
            # A run record's tombstone is for partition 0 only: the history keeps every run record.
            history = [i for i, (key, v) in enumerate(items) if _of_history(key, v)] if self._partitions > 1 else []
            for batch in (history, [i for i in range(len(items)) if i not in set(history)]):
                for i in batch:
                    key, value = items[i]
                    if value is not None and len(value) > MAX_RECORD_BYTES:
                        raise DecisionLogError(
                            f"a decision of {len(value)} bytes exceeds the decision topic's limit of "
                            f"{MAX_RECORD_BYTES}: commit fewer Spark partitions per run (coalesce the DataFrame)"
                        )
                    partition = HISTORY_PARTITION if batch is history else 0
                    run_record = value if key.startswith(RUN_KEY_BYTES) else None
                    # One history key per run, status and generation: compaction keeps every rank.
                    at = history_key(key, run_record) if batch is history and run_record is not None else key
                    self._produce(producer, at, value, partition, on_delivery(i))
                    if batch is history and run_record is not None and not is_committed(run_record):
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
        self, budget: Budget, failures: Sequence[Any], remaining: int, acknowledged: int, total: int
    ) -> Kafka2PCError:
        for err in failures:
            named = self._unauthorized(err.name(), "Write")
            if named is not None:
                return named
        fatal = [e for e in failures if callable(getattr(e, "fatal", None)) and e.fatal()]
        if remaining or fatal or all(is_transient(e) for e in failures):
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

    def claim_group(self, group: str, prefix: str) -> None:
        """Register exporter ``prefix`` as the only one moving Kafka source group ``group``: two
        exporters committing one group would both read the same records. The first claim in the log
        wins, read back after appending, so two exporters claiming at once cannot both have it."""
        self.prefixes.add(prefix)
        owner = self.read(keep_run=_no_runs).group_owners.get(group)
        if owner is None:
            value = json.dumps({"group": group, "prefix": prefix, "at_ms": int(time.time() * 1000)}).encode()
            self.append([((GROUP_KEY + group).encode(), value)])
            owner = self.read(keep_run=_no_runs).group_owners.get(group)
        if owner != prefix:
            raise SourceError(
                f"consumer group {group!r} is the Kafka source group of exporter {owner!r}; exporter {prefix!r} must "
                "use a group of its own, or both would read and export the same records"
            )

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
            state = self._replay(until, keep_run, history)
            if history != "all" and self._partitions > 1:
                # A loss kept from partition 0 alone may be a stale writer's copy: its history decides.
                unread = {run_key(*k) for k, rec in state.runs.items() if rec.status is RunStatus.LOST} - set(history)
                if unread:
                    history = frozenset(history) | unread
                    state = self._replay(until, keep_run, history)
        self.settle(state, history if self._partitions > 1 else "all")
        return state

    def _replay(self, until: int | None, keep_run: KeepRun | None, history: History) -> LogState:
        entries: Iterable[Entry] = self.scan(until)
        if history and self._partitions > 1:
            keys = None if history == "all" else frozenset(history)
            entries = itertools.chain(entries, self.scan(None, HISTORY_PARTITION, keys))
        return replay(entries, keep_run)

    def settle(self, state: LogState, history: History = "all") -> None:
        """Append again each run's record in effect whose key's latest value is a record that came too
        late to take effect (a stale writer's, ``txn.protocol.run_history``): compaction keeps a key's
        latest value, and must keep the truth. A COMMITTED run also loses the overruled copy on
        partition 0, where recovery would meet it. Best effort: a reader without Write leaves it to
        the next writer, and replay ignores the overruled record meanwhile."""
        items: list[Item] = []
        for key, status in state.overruled.items():
            rec = state.overruled_records.get(key)  # a COMMITTED run recovery's read does not keep too
            if rec is None or (history != "all" and run_key(*key) not in history):
                continue  # only where the history was read: partition 0's order of copies may differ
            log.warning(
                "run %s of %s: a %s record came after its %s record and changes nothing; writing the %s record again",
                key[1], key[0], status.value, rec.status.value, rec.status.value,
            )  # fmt: skip
            items.append((rec.key, rec.to_json()))
            if rec.status is RunStatus.COMMITTED and self._partitions > 1:
                items.append((rec.key, None))
        for prefix in sorted(state.stale_positions):
            if (position := state.positions.get(prefix)) is not None:
                log.warning(
                    "exporter %s: a stale source position came last; writing run %s's again", prefix, position.run
                )
                items.append(((POSITION_KEY + prefix).encode(), position.to_json()))
        if not items:
            return
        try:
            self.append(items)
        except Kafka2PCError as e:
            log.warning("could not write the run records in effect again (%s); the next reader will", e)
        state.overruled.clear()
        state.overruled_records.clear()
        state.stale_positions.clear()

    def read_for(self, prefix: str, run: str | None = None) -> LogState:
        """The state one exporter needs: the protocol, the prefix's losses, and its own run's
        record if ``run`` is given; not the hundred thousand runs it finished before."""
        self.prefixes.add(prefix)
        return self.read(keep_run=self.keep_for(prefix, run), history={run_key(prefix, run)} if run else frozenset())

    def keep_for(self, prefix: str, run: str | None = None) -> KeepRun:
        """Run records of ``run`` and the prefix's runs that are not COMMITTED (a loss must be met)."""
        self.prefixes.add(prefix)
        return lambda p, r, raw: p == prefix and (r == run or not is_committed(raw))

    def keep_run_of(self, prefixes: Sequence[str], run: str) -> KeepRun:
        wanted = set(prefixes)
        self.prefixes.update(wanted)
        return lambda p, r, _raw: r == run and p in wanted

    def record_source_files(self, prefix: str, run: str, splits: Splits) -> bool:
        """Append the files each Spark partition of ``run`` read (``txn.protocol.source_files``) to
        the history partition; False, writing nothing, on a topic without one (0.1.0's) or for an
        export of more splits than a record holds."""
        return self._record_source(prefix, run, encode_splits(splits))

    def record_dealt(self, prefix: str, run: str, dealing: Dealing) -> bool:
        """Append how the barrier stage dealt ``run``'s frame, under the same key; False, writing
        nothing, on a topic without a history partition."""
        return self._record_source(prefix, run, encode_dealt(dealing))

    def source_files(self, prefix: str, run: str) -> Splits | None:
        """What ``record_source_files`` recorded for ``run``, or None."""
        value = self._source_record(prefix, run)
        return decode_splits(value) if value else None

    def dealing(self, prefix: str, run: str) -> Dealing | None:
        """What ``record_dealt`` recorded for ``run``, or None."""
        value = self._source_record(prefix, run)
        return decode_dealt(value) if value else None

    def _record_source(self, prefix: str, run: str, value: bytes | None) -> bool:
        with self._budget():
            self.ensure_topic()
            if value is None or self._partitions < 2:
                return False
        self.append([(source_files_key(prefix, run), value)])
        return True

    def _source_record(self, prefix: str, run: str) -> bytes | None:
        with self._budget():
            self.ensure_topic()
            if self._partitions < 2:
                return None
        key = source_files_key(prefix, run)
        value = None
        for e in self.scan(None, HISTORY_PARTITION, frozenset({key})):
            value = e.value  # the latest of the key
        return value

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None
