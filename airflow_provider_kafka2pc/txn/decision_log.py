"""The durable decision log: a compacted Kafka topic keyed by transactional id.

COMMIT is written and flushed (acks=all) before the first EndTxn of a run; COMMITTED, ABORTED
or LOST after. Records carry ids and counts only, never connection settings.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_provider_kafka2pc.txn.config import connection_only
from airflow_provider_kafka2pc.txn.errors import BrokerUnavailableError, Kafka2PCError, PrefixCollisionError
from airflow_provider_kafka2pc.txn.naming import validate_prefix
from airflow_provider_kafka2pc.txn.outcome import TxnRef

log = logging.getLogger(__name__)

DEFAULT_DECISION_TOPIC = "kafka2pc_decisions"
# Prefix claims and run marks live in the same topic; ':' never occurs in a transactional id we write.
_CLAIM_KEY = "kafka2pc.prefix:{}"
_RUN_KEY = "kafka2pc.run:{}:{}"  # prefix, run: one key per run, so later runs never compact it away


class Decision(StrEnum):
    COMMIT = "COMMIT"  # the coordinator decided; written before any EndTxn
    COMMITTED = "COMMITTED"  # EndTxn(commit) done, or the broker showed it committed
    ABORTED = "ABORTED"
    LOST = "LOST"


@dataclass(frozen=True)
class DecisionRecord:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    decision: Decision
    run: str
    at_ms: int
    records: int = 0
    reason: str = ""

    def is_for(self, ref: TxnRef) -> bool:
        return (self.transactional_id, self.producer_id, self.producer_epoch) == (
            ref.transactional_id,
            ref.producer_id,
            ref.producer_epoch,
        )

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "tid": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "decision": self.decision.value,
            "run": self.run,
            "at_ms": self.at_ms,
            "records": self.records,
        }
        if self.reason:
            d["reason"] = self.reason
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> DecisionRecord:
        d = json.loads(raw)
        return cls(
            d["tid"],
            int(d["pid"]),
            int(d["epoch"]),
            Decision(d["decision"]),
            str(d.get("run", "")),
            int(d.get("at_ms", 0)),
            int(d.get("records", 0)),
            str(d.get("reason", "")),
        )


@dataclass(frozen=True)
class RunMark:
    """A run of an exporter (prefix) reached its COMMIT decision: never export that run again."""

    prefix: str
    run: str
    at_ms: int
    transactions: int
    records: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "prefix": self.prefix,
                "run": self.run,
                "at_ms": self.at_ms,
                "txns": self.transactions,
                "records": self.records,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RunMark:
        d = json.loads(raw)
        return cls(str(d["prefix"]), str(d["run"]), int(d["at_ms"]), int(d["txns"]), int(d["records"]))


class DecisionSnapshot:
    """The latest decision per transactional id, as read from the log."""

    def __init__(
        self,
        latest: Mapping[str, DecisionRecord],
        claims: Mapping[str, str],
        runs: Mapping[tuple[str, str], RunMark] | None = None,
    ) -> None:
        self.latest = dict(latest)
        self.claims = dict(claims)
        self.runs = dict(runs or {})

    def run_mark(self, prefix: str, run: str) -> RunMark | None:
        return self.runs.get((prefix, run))

    def get(self, ref: TxnRef) -> DecisionRecord | None:
        rec = self.latest.get(ref.transactional_id)
        return rec if rec is not None and rec.is_for(ref) else None

    def decided_commit(self, ref: TxnRef) -> bool:
        rec = self.get(ref)
        return rec is not None and rec.decision in (Decision.COMMIT, Decision.COMMITTED)

    def committed(self, ref: TxnRef) -> bool:
        rec = self.get(ref)
        return rec is not None and rec.decision is Decision.COMMITTED


class DecisionLogError(Kafka2PCError):
    pass


class DecisionLog:
    """Reads and writes the decision topic with confluent-kafka."""

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
        self._timeout_s = timeout_s
        self._producer: Any = None
        self._ready = False

    # -- topic --------------------------------------------------------------
    def ensure_topic(self) -> None:
        if self._ready:
            return
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient(connection_only(self._config))
        try:
            md = admin.list_topics(timeout=self._timeout_s)
        except KafkaException as e:
            raise BrokerUnavailableError(
                f"cannot reach Kafka at {self._config.get('bootstrap.servers')} for the decision log: {e}"
            ) from e
        if self.topic not in md.topics:
            rf = self._replication_factor or min(3, len(md.brokers))
            new = NewTopic(
                self.topic,
                num_partitions=1,  # one partition reads back fastest; compaction keeps it small
                replication_factor=rf,
                config={"cleanup.policy": "compact", "min.insync.replicas": str(min(2, rf))},
            )
            try:
                admin.create_topics([new], operation_timeout=self._timeout_s)[self.topic].result()
                log.info("created decision log topic %s (replication factor %d)", self.topic, rf)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise DecisionLogError(f"cannot create decision log topic {self.topic!r}: {e}") from e
        self._ready = True

    # -- write --------------------------------------------------------------
    def _get_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            conf = dict(self._config)
            conf.update({"acks": "all", "enable.idempotence": True, "linger.ms": 0})
            self._producer = Producer(conf)
            self._producer.list_topics(timeout=self._timeout_s)  # connect now, not on the first write
        return self._producer

    def write(self, records: Iterable[DecisionRecord], marks: Iterable[RunMark] = ()) -> None:
        """Append and flush; returns only when every record is acknowledged by all in-sync replicas.

        Marks go first: the topic has one partition and the producer is idempotent, so a reader
        that sees a run's COMMIT decisions also sees its mark.
        """
        items = [(_RUN_KEY.format(m.prefix, m.run).encode(), m.to_json()) for m in marks]
        items += [(rec.transactional_id.encode(), rec.to_json()) for rec in records]
        self._append(items)

    def _append(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        self.ensure_topic()
        producer = self._get_producer()
        errors: list[str] = []
        count = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for key, value in items:
            producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
            count += 1
            producer.poll(0)
        remaining = producer.flush(self._timeout_s)
        if remaining or errors:
            raise DecisionLogError(
                f"decision log write to {self.topic!r} failed: {remaining} unacknowledged, errors {errors[:3]}"
            )
        log.debug("wrote %d record(s) to %s", count, self.topic)

    def record(
        self,
        refs: Iterable[TxnRef],
        decision: Decision,
        run: str,
        reasons: Mapping[str, str] | None = None,
        counts: Mapping[str, int] | None = None,
        mark_prefixes: Iterable[str] = (),
    ) -> None:
        """Write ``decision`` for every ref; ``mark_prefixes`` also marks the run done for those exporters."""
        now = int(time.time() * 1000)
        refs = list(refs)  # read twice: the marks count them
        total = sum((counts or {}).values())
        marks = [RunMark(p, run, now, len(refs), total) for p in sorted(set(mark_prefixes))]
        self.write(
            (
                DecisionRecord(
                    r.transactional_id,
                    r.producer_id,
                    r.producer_epoch,
                    decision,
                    run,
                    now,
                    (counts or {}).get(r.transactional_id, 0),
                    (reasons or {}).get(r.transactional_id, ""),
                )
                for r in refs
            ),
            marks,
        )

    def claim_prefix(self, prefix: str, owner: str) -> None:
        """Register ``owner`` as the only exporter of ``prefix``; refuse if another owns it."""
        validate_prefix(prefix)
        current = self.read().claims.get(prefix)
        if current is not None and current != owner:
            raise PrefixCollisionError(prefix, current, owner)
        if current is None:
            value = json.dumps({"prefix": prefix, "owner": owner, "at_ms": int(time.time() * 1000)}).encode()
            self._append([(_CLAIM_KEY.format(prefix).encode(), value)])

    # -- read ---------------------------------------------------------------
    def read(self) -> DecisionSnapshot:
        """Everything from the beginning up to the current end, latest record per key."""
        self.ensure_topic()
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        conf = connection_only(self._config)
        conf.update(
            {
                "group.id": "kafka2pc-decision-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            }
        )
        consumer = Consumer(conf)
        latest: dict[str, DecisionRecord] = {}
        claims: dict[str, str] = {}
        runs: dict[tuple[str, str], RunMark] = {}
        try:
            md = consumer.list_topics(self.topic, timeout=self._timeout_s)
            parts = [p for p in md.topics[self.topic].partitions]
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self._timeout_s)[1]
                for p in parts
            }
            pending = {p for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in pending])
            deadline = time.monotonic() + self._timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise DecisionLogError(f"timed out reading decision log {self.topic!r}")
                # A short poll: a long one waits out its timeout whenever fewer records remain.
                for msg in consumer.consume(num_messages=10000, timeout=0.02):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pending.discard(msg.partition())
                            continue
                        raise DecisionLogError(f"reading decision log {self.topic!r}: {err}")
                    key = (msg.key() or b"").decode()
                    partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                    if offset + 1 >= ends[partition]:
                        pending.discard(partition)
                    value = msg.value()
                    if key.startswith(_CLAIM_KEY.format("")):
                        if value:
                            claims[key.split(":", 1)[1]] = json.loads(value)["owner"]
                    elif key.startswith(_RUN_KEY.format("", "")[:-1]):
                        if value:
                            mark = RunMark.from_json(value)
                            runs[(mark.prefix, mark.run)] = mark
                    elif value:
                        latest[key] = DecisionRecord.from_json(value)
        finally:
            consumer.close()
        return DecisionSnapshot(latest, claims, runs)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self._timeout_s)
            self._producer = None
