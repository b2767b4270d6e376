"""The prepare side: one Kafka transaction written by librdkafka and left open.

``TransactionalWriter`` initialises the transactional id (fencing any older holder), begins,
produces, flushes, proves every record acknowledged, and returns a ``Committable``. It never
commits, never aborts a prepared transaction (only one that failed to prepare) and never closes
the producer: recent confluent-kafka aborts an open transaction when the producer is closed, and
the transaction has to outlive this process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.config import CONNECTION_DEFAULTS
from airflow_provider_kafka2pc.txn.kafka.transactions import broker_max_transaction_timeout_ms
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import DeliveryError, Kafka2PCError

log = logging.getLogger(__name__)

# Throughput-leaning defaults; anything the user passes wins except the transactional settings.
PRODUCER_DEFAULTS: dict[str, Any] = {
    **CONNECTION_DEFAULTS,
    # Java's partitioner (murmur2), as Spark's Kafka sink and every Java producer use: a key lands
    # on the same partition whichever of them wrote it (librdkafka's default, CRC32, does not).
    # Null keys go to a random partition, kept for sticky.partitioning.linger.ms like Java's.
    "partitioner": "murmur2_random",
    # 5 ms, not 20: a shorter queue frees each message's memory sooner, and the writing thread
    # spent ~20% less CPU per record (benchmarks/loop_cpu.py) with batches still well filled.
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    # 128 MiB, not librdkafka's 1 GiB: a broker slower than the writer fills the queue, and this
    # bound is what a writing task holds beyond its Arrow batch (Java's producer: 32 MB).
    "queue.buffering.max.kbytes": 131_072,
    "message.max.bytes": 1_000_000,
    "max.in.flight.requests.per.connection": 5,
}
# Delivery errors that are the consequence of another failure, never its cause.
_CONSEQUENCES = frozenset({"_PURGE_QUEUE", "_PURGE_INFLIGHT"})
# Statistics carry the producer id and epoch (eos.producer_id/producer_epoch) and the records
# enqueued per partition; prepare() waits for a report that counts every record, so the interval
# bounds how long a partition's prepare waits after its flush.
_STATS_INTERVAL_MS = 100


class RefusedRecord:
    """A record librdkafka would not take, shown to ``_on_delivery`` as confluent-kafka's ``Message``
    shows a failed one (rare path: one Python object for the record that failed)."""

    def __init__(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._partition, self._key, self._value = topic, partition, key, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class DeliveryWriter:
    """A producer that proves, at flush, that every record was acknowledged.

    Used as is for AT_LEAST_ONCE (idempotent) and NONE; ``TransactionalWriter`` adds the
    transaction around it.

    The proof: librdkafka ends every message with exactly one delivery report, success or error,
    and ``flush()`` returns how many are still outstanding (queued, in flight, or reported but not
    yet served). confluent-kafka implements ``delivery.report.only.error`` in its own C callback
    (librdkafka still reports every message; only the Python call is skipped for a success), so
    ``flush() == 0`` and no error callback means every record was acknowledged, without building a
    Python message object and calling Python once per record.
    """

    def __init__(self, producer_config: Mapping[str, Any], name: str, init_timeout_s: float = 60.0) -> None:
        self.name = name
        self._config: dict[str, Any] = {
            **PRODUCER_DEFAULTS,
            **producer_config,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
            "delivery.report.only.error": True,  # the proof above depends on it: not overridable
        }
        self._purged: str | None = None
        self._client_error: str | None = None
        self._too_large: tuple[str, int, int] | None = None  # topic, partition, record bytes
        self._init_timeout_s = init_timeout_s
        self._producer: Any = None
        self.records = 0
        self.bytes = 0
        self.failed = 0
        self._first_error: str | None = None
        self._counts: dict[str, int] = {}
        self._first_write_ms: int | None = None

    def _on_delivery(self, err: Any, msg: Any) -> None:
        # Called for failures only (delivery.report.only.error).
        self.failed += 1
        if err.name() in _CONSEQUENCES:
            # A transaction that failed purges every queued record; the cause is elsewhere.
            self._purged = self._purged or f"{err.name()}: {err.str()} ({msg.topic()} [{msg.partition()}])"
            return
        if self._first_error is None:
            self._first_error = f"{err.name()}: {err.str()} ({msg.topic()} [{msg.partition()}])"
        if err.name() == "MSG_SIZE_TOO_LARGE":
            # The broker refuses a whole batch, small records too: name the largest one.
            size = len(msg.value() or b"") + len(msg.key() or b"")
            if self._too_large is None or size > self._too_large[2]:
                self._too_large = (str(msg.topic()), int(msg.partition()), size)

    def _on_error(self, err: Any) -> None:
        # librdkafka reports a transaction's failure (e.g. TOPIC_AUTHORIZATION_FAILED when adding
        # a partition) here, while the records only see _PURGE_QUEUE.
        if self._client_error is None and err.name() not in _CONSEQUENCES:
            self._client_error = f"{err.name()}: {err.str()}"
            from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of

            topics = ",".join(sorted(self._counts)) or "?"
            named = authorization_error_of(err.name(), self._config, topics, "Write")
            if named is not None:
                self._client_error = str(named)

    def _new_producer(self) -> Any:
        """The librdkafka producer: confluent-kafka's here, the native one in ``txn/kafka/native.py``."""
        from confluent_kafka import Producer

        return Producer(self._config)

    def open(self) -> DeliveryWriter:
        self._producer = self._new_producer()
        # Connect first: otherwise the first request (InitProducerId, or an idempotent
        # producer's first batch) waits on librdkafka's ~0.5 s retry (benchmarks/README.md).
        self._producer.list_topics(timeout=self._init_timeout_s)
        return self

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> None:
        """One record; ``partition`` None or negative lets librdkafka's partitioner choose."""
        part = -1 if partition is None or partition < 0 else partition
        self.produce_rows([topic], [value], [key], [part], [headers or None])

    def produce_batch(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, nbytes: int | None = None
    ) -> None:
        """Records to one topic, partitioned by librdkafka, without headers: the hot path.

        ``nbytes`` is the sum of the lengths of keys and values when the caller knows it cheaply
        (Arrow does); otherwise it is counted here."""
        from confluent_kafka import KafkaException

        self._before_write()
        produce = self._producer.produce
        try:
            # Two loops so that neither tests for a key column per record.
            if keys is None:
                for value in values:
                    try:
                        produce(topic, value)
                    except BufferError:
                        self._produce_when_room(topic, value, None, -1, None)
                    except KafkaException as e:
                        raise self._refused(e.args[0], topic, -1, None, value) from e
            else:
                for value, key in zip(values, keys, strict=True):
                    try:
                        produce(topic, value, key)
                    except BufferError:
                        self._produce_when_room(topic, value, key, -1, None)
                    except KafkaException as e:
                        raise self._refused(e.args[0], topic, -1, key, value) from e
        except BaseException as e:
            self._broken(e)
            raise
        self._after_write(len(values), nbytes, values, keys)
        self._counts[topic] = self._counts.get(topic, 0) + len(values)

    def produce_rows(
        self,
        topics: Sequence[str],
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        partitions: Sequence[int],
        headers: Sequence[Sequence[tuple[str, bytes | None]] | None],
        nbytes: int | None = None,
    ) -> None:
        """Records with a topic, key, partition (negative: librdkafka's partitioner) and headers each."""
        from confluent_kafka import KafkaException

        self._before_write()
        produce = self._producer.produce
        try:
            for topic, value, key, partition, hdrs in zip(topics, values, keys, partitions, headers, strict=True):
                try:
                    # Positional: topic, value, key, partition, callback, on_delivery, timestamp
                    # (0: now), headers; no keyword dict per record.
                    produce(topic, value, key, partition, None, None, 0, hdrs)
                except BufferError:
                    self._produce_when_room(topic, value, key, partition, hdrs)
                except KafkaException as e:
                    raise self._refused(e.args[0], topic, partition, key, value) from e
        except BaseException as e:
            self._broken(e)
            raise
        self._after_write(len(values), nbytes, values, keys)
        for topic in topics:
            self._counts[topic] = self._counts.get(topic, 0) + 1

    def _produce_when_room(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int, headers: Any
    ) -> None:
        from confluent_kafka import KafkaException

        while True:
            self._producer.poll(0.05)  # local queue full: let deliveries drain
            try:
                self._producer.produce(topic, value, key, partition, None, None, 0, headers)
                return
            except BufferError:
                continue
            except KafkaException as e:
                raise self._refused(e.args[0], topic, partition, key, value) from e

    def _before_write(self) -> None:
        if self._first_write_ms is None:
            self._first_write_ms = int(time.time() * 1000)

    def _after_write(
        self, n: int, nbytes: int | None, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        if nbytes is None:
            nbytes = sum(len(v) for v in values if v is not None)
            if keys is not None:
                nbytes += sum(len(k) for k in keys if k is not None)
        before = self.records
        self.records += n
        self.bytes += nbytes
        # Serve delivery reports every ~10,000 records: each holds its message's memory until served.
        if self.records // 10_000 != before // 10_000 or n >= 10_000:
            self._producer.poll(0)

    def _broken(self, e: BaseException) -> None:
        # Some records of the call may be queued and some not, so the counts are wrong: make
        # sure this writer can never vote yes (a refused record already counts as failed).
        if isinstance(e, DeliveryError):
            return
        self.failed += 1
        if self._first_error is None:
            self._first_error = f"produce() raised {type(e).__name__}: {e}"

    def _refused(self, err: Any, topic: str, partition: int, key: bytes | None, value: bytes | None) -> DeliveryError:
        """A record librdkafka would not take (a partition the topic lacks, too large, a failed
        transaction), counted and named as a failed delivery is: the error to raise."""
        self._on_delivery(err, RefusedRecord(topic, partition, key, value))
        cause = self.failure_cause() or f"{err.name()}: {err.str()}"
        if err.name() == "_UNKNOWN_PARTITION":
            cause += f"; {topic} has no partition {partition} (as this producer knows the topic)"
        return DeliveryError(self.name, self.failed, cause)

    def abandon(self) -> None:
        """After a failed write: let the producer go; nothing of this writer stays open."""
        self._release()

    def flush_and_verify(self) -> None:
        """Flush; raise ``DeliveryError`` unless every record was acknowledged."""
        remaining = self._producer.flush(self._init_timeout_s)
        if remaining or self.failed:
            cause = self.failure_cause() or f"{remaining} record(s) still queued after flush"
            raise DeliveryError(self.name, self.failed + remaining, cause)

    def failure_cause(self) -> str | None:
        """What made records fail, the most telling first; None while nothing did."""
        return self._too_large_message() or self._first_error or self._client_error or self._purged

    def _too_large_message(self) -> str | None:
        """Which partition refused which record, and the limits, read when it happens (rare)."""
        if self._too_large is None:
            return None
        from airflow_provider_kafka2pc.txn.kafka.access import topic_config_value

        topic, partition, size = self._too_large
        limit = topic_config_value(self._config, topic, "max.message.bytes") or "unknown (no DescribeConfigs on it)"
        return (
            f"MSG_SIZE_TOO_LARGE: a record of {size} bytes (key + value; the largest refused) to {topic} partition "
            f"{partition} is over the limit: the topic's max.message.bytes is {limit}, the producer's "
            f"message.max.bytes {self._config.get('message.max.bytes')}; compression and batch overhead count too"
        )

    def finish(self) -> None:
        """Flush, prove every record acknowledged, and let the producer go (no transaction here)."""
        self.flush_and_verify()
        self._release()

    @property
    def counts_by_topic(self) -> dict[str, int]:
        return dict(self._counts)

    def _release(self) -> None:
        # Dropping the last reference destroys the librdkafka handle, which (unlike close())
        # leaves a transaction open: every real-broker test proves it, as each writer
        # process prepares, drops its producer and exits.
        self._producer = None


class TransactionalWriter(DeliveryWriter):
    """Writes one transaction; use ``open()``, ``produce()`` …, then ``prepare()``."""

    def __init__(
        self,
        producer_config: Mapping[str, Any],
        transactional_id: str,
        transaction_timeout_ms: int | None = None,
        init_timeout_s: float = 60.0,
        id_prefix: str | None = None,
    ) -> None:
        super().__init__(producer_config, transactional_id, init_timeout_s)
        self.transactional_id = transactional_id
        self._id_prefix = id_prefix  # named in an authorization error: ACLs grant the prefix
        if transaction_timeout_ms is None:
            transaction_timeout_ms = int(
                self._config.get("transaction.timeout.ms") or broker_max_transaction_timeout_ms(producer_config)
            )
        self.transaction_timeout_ms = transaction_timeout_ms
        self._config.update(
            {
                "transactional.id": transactional_id,
                "transaction.timeout.ms": transaction_timeout_ms,
                "enable.idempotence": True,
                "acks": "all",
                "statistics.interval.ms": _STATS_INTERVAL_MS,
                "stats_cb": self._on_stats,
            }
        )
        self._eos: tuple[int, int] = (-1, -1)
        # (topic, partition) -> records librdkafka enqueued on it, from the latest statistics.
        self._enqueued: dict[tuple[str, int], int] = {}
        self._prepared = False

    def _on_stats(self, raw: str) -> None:
        stats = json.loads(raw)
        eos = stats.get("eos") or {}
        pid, epoch = int(eos.get("producer_id", -1)), int(eos.get("producer_epoch", -1))
        if pid >= 0:
            self._eos = (pid, epoch)
        self._enqueued = enqueued_by_partition(stats)

    def _partitions_of_every_record(self) -> tuple[tuple[str, int], ...] | None:
        """The partitions of this transaction, once the statistics account for every record.

        Success reports are not delivered to Python (see ``DeliveryWriter``), so the partitions
        come from librdkafka's per-partition count of enqueued messages ("msgs"). Each record is
        counted once on the partition it was assigned to; a report that counts fewer records than
        were produced predates the last ones (None: wait for the next), one that counts more
        cannot be matched to this transaction's records. Records this writer placed itself
        (``_placed_here``) are added as they are now: no report is waited for them."""
        enqueued = dict(self._enqueued)
        for tp, n in self._placed_here().items():
            enqueued[tp] = enqueued.get(tp, 0) + n
        counted = sum(enqueued.values())
        if counted < self.records:
            return None
        if counted > self.records:
            raise Kafka2PCError(
                f"librdkafka's statistics count {counted} records enqueued for {self.transactional_id!r}, "
                f"which produced {self.records}: its partitions cannot be told"
            )
        return tuple(sorted(tp for tp, n in enqueued.items() if n > 0))

    def _placed_here(self) -> Mapping[tuple[str, int], int]:
        """(topic, partition) -> records given to librdkafka with their partition, which its
        statistics do not count (the native writer's); none on this path."""
        return {}

    def abandon(self) -> None:
        """After a failed write: abort the transaction now (it can never be prepared) instead of
        leaving it Ongoing, holding read_committed consumers back, until its timeout."""
        if self._producer is not None and not self._prepared:
            self._abort_own()
        self._release()

    def _abort_own(self) -> None:
        """End this writer's failed transaction now instead of leaving it Ongoing until its timeout."""
        try:
            self._producer.abort_transaction(self._init_timeout_s)
        except Exception as e:  # a fatal error (fenced, ...): the broker or the next writer ends it
            log.warning("could not abort the failed transaction %s: %s", self.transactional_id, e)
        self._release()

    def open(self) -> TransactionalWriter:
        from confluent_kafka import KafkaException

        from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of

        super().open()
        # InitProducerId bumps the epoch: an older writer of this id (a failed Spark task
        # attempt, the previous POOLING run) is fenced and its open transaction aborted.
        try:
            self._producer.init_transactions(self._init_timeout_s)
        except KafkaException as e:
            named = authorization_error_of(
                e.args[0].name(),
                self._config,
                self._id_prefix or self.transactional_id,
                "Write",
                "PREFIXED" if self._id_prefix else "LITERAL",
            )
            if named is not None:
                raise named from e
            raise
        self._producer.begin_transaction()
        return self

    def prepare(self, stats_timeout_s: float = 5.0) -> Committable | None:
        """Flush and vote yes: every record acknowledged, the transaction still open.

        Returns None when nothing was written (an empty transaction needs no commit)."""
        if self._prepared:
            raise Kafka2PCError(f"{self.transactional_id!r} is already prepared")
        try:
            self.flush_and_verify()
        except DeliveryError:
            self._abort_own()
            raise
        self._prepared = True
        p = self._producer
        if self.records == 0:
            self._release()
            return None
        deadline = time.monotonic() + stats_timeout_s
        try:
            partitions = self._partitions_of_every_record()
            while (self._eos[0] < 0 or partitions is None) and time.monotonic() < deadline:
                p.poll(0.01)
                partitions = self._partitions_of_every_record()
            if self._eos[0] < 0:
                raise Kafka2PCError(f"librdkafka reported no producer id for {self.transactional_id!r}")
            if partitions is None:
                raise Kafka2PCError(
                    f"librdkafka's statistics did not account for all {self.records} records of "
                    f"{self.transactional_id!r} within {stats_timeout_s} s"
                )
        except Kafka2PCError:
            self._abort_own()  # no committable can name this transaction's partitions: nothing stays open
            raise
        self._release()
        assert self._first_write_ms is not None
        return Committable(
            transactional_id=self.transactional_id,
            producer_id=self._eos[0],
            producer_epoch=self._eos[1],
            records=self.records,
            bytes=self.bytes,
            topic_partitions=partitions,
            first_write_ms=self._first_write_ms,
            transaction_timeout_ms=self.transaction_timeout_ms,
            counts_by_topic=self.counts_by_topic,
        )


def enqueued_by_partition(stats: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> messages librdkafka enqueued on it ("msgs"), from one statistics report.

    The unassigned partition (-1) is left out: a record produced before its topic's metadata
    arrived is counted there first and again on the partition it is then assigned to."""
    out: dict[tuple[str, int], int] = {}
    for topic, t in (stats.get("topics") or {}).items():
        for p in (t.get("partitions") or {}).values():
            partition, msgs = int(p.get("partition", -1)), int(p.get("msgs", 0))
            if partition >= 0 and msgs > 0:
                out[(str(topic), partition)] = msgs
    return out
