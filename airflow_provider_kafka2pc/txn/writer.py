"""The prepare side: one Kafka transaction written by librdkafka and left open.

``TransactionalWriter`` initialises the transactional id (fencing any older holder), begins,
produces while counting every delivery report, flushes, and returns a ``Committable``. It never
commits, never aborts and never closes the producer: recent confluent-kafka aborts an open
transaction when the producer is closed, and the transaction has to outlive this process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.committable import Committable
from airflow_provider_kafka2pc.txn.config import connection_only
from airflow_provider_kafka2pc.txn.errors import DeliveryError, Kafka2PCError

log = logging.getLogger(__name__)

# Throughput-leaning defaults; anything the user passes wins except the transactional settings.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.max.bytes": 1_000_000,
    "max.in.flight.requests.per.connection": 5,
}
# Statistics carry the producer id and epoch (eos.producer_id/producer_epoch); prepare() waits
# for the first report, so the interval is a floor on every partition's prepare time.
_STATS_INTERVAL_MS = 100


class DeliveryWriter:
    """A producer that counts every delivery report and proves, at flush, that all arrived.

    Used as is for AT_LEAST_ONCE (idempotent) and NONE; ``TransactionalWriter`` adds the
    transaction around it.
    """

    def __init__(self, producer_config: Mapping[str, Any], name: str, init_timeout_s: float = 60.0) -> None:
        self.name = name
        self._config: dict[str, Any] = {**PRODUCER_DEFAULTS, **producer_config, "on_delivery": self._on_delivery}
        self._init_timeout_s = init_timeout_s
        self._producer: Any = None
        self.records = 0
        self.bytes = 0
        self.delivered = 0
        self.failed = 0
        self._first_error: str | None = None
        self._partitions: set[tuple[str, int]] = set()
        self._counts: dict[str, int] = {}
        self._first_write_ms: int | None = None

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed += 1
            if self._first_error is None:
                self._first_error = f"{err.name()}: {err.str()} ({msg.topic()})"
            return
        self.delivered += 1
        self._partitions.add((msg.topic(), msg.partition()))

    def open(self) -> DeliveryWriter:
        from confluent_kafka import Producer

        self._producer = Producer(self._config)
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
        if self._first_write_ms is None:
            self._first_write_ms = int(time.time() * 1000)
        kwargs: dict[str, Any] = {}
        if partition is not None and partition >= 0:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        p = self._producer
        while True:
            try:
                p.produce(topic, value, key, **kwargs)
                break
            except BufferError:
                p.poll(0.05)  # local queue full: let deliveries drain
        self.records += 1
        self.bytes += (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        self._counts[topic] = self._counts.get(topic, 0) + 1
        if self.records % 10_000 == 0:
            p.poll(0)

    def flush_and_verify(self) -> None:
        """Flush; raise ``DeliveryError`` unless every record was acknowledged."""
        remaining = self._producer.flush(self._init_timeout_s)
        if remaining or self.failed or self.delivered != self.records:
            raise DeliveryError(
                self.name,
                self.failed + remaining or self.records - self.delivered,
                self._first_error or f"{remaining} record(s) still queued after flush",
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
    ) -> None:
        super().__init__(producer_config, transactional_id, init_timeout_s)
        self.transactional_id = transactional_id
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
        self._prepared = False

    def _on_stats(self, raw: str) -> None:
        eos = json.loads(raw).get("eos") or {}
        pid, epoch = int(eos.get("producer_id", -1)), int(eos.get("producer_epoch", -1))
        if pid >= 0:
            self._eos = (pid, epoch)

    def open(self) -> TransactionalWriter:
        super().open()
        # InitProducerId bumps the epoch: an older writer of this id (a failed Spark task
        # attempt, the previous POOLING run) is fenced and its open transaction aborted.
        self._producer.init_transactions(self._init_timeout_s)
        self._producer.begin_transaction()
        return self

    def prepare(self, stats_timeout_s: float = 5.0) -> Committable | None:
        """Flush and vote yes: every record acknowledged, the transaction still open.

        Returns None when nothing was written (an empty transaction needs no commit)."""
        if self._prepared:
            raise Kafka2PCError(f"{self.transactional_id!r} is already prepared")
        self.flush_and_verify()
        self._prepared = True
        p = self._producer
        if self.records == 0:
            self._release()
            return None
        deadline = time.monotonic() + stats_timeout_s
        while self._eos[0] < 0 and time.monotonic() < deadline:
            p.poll(0.1)
        self._release()
        if self._eos[0] < 0:
            raise Kafka2PCError(f"librdkafka reported no producer id for {self.transactional_id!r}")
        assert self._first_write_ms is not None
        return Committable(
            transactional_id=self.transactional_id,
            producer_id=self._eos[0],
            producer_epoch=self._eos[1],
            records=self.records,
            bytes=self.bytes,
            topic_partitions=tuple(sorted(self._partitions)),
            first_write_ms=self._first_write_ms,
            transaction_timeout_ms=self.transaction_timeout_ms,
            counts_by_topic=self.counts_by_topic,
        )


def broker_max_transaction_timeout_ms(config: Mapping[str, Any], timeout_s: float = 30.0) -> int:
    """The broker's cap ``transaction.max.timeout.ms``: the longest a prepared transaction may live."""
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient(connection_only(config))
    md = admin.list_topics(timeout=timeout_s)
    broker = str(min(md.brokers))
    res = ConfigResource(ConfigResource.Type.BROKER, broker)
    entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout=timeout_s)
    return int(entries["transaction.max.timeout.ms"].value)
