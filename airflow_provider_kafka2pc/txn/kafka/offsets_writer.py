"""The offsets participant: the run's transaction that carries its consumer group's offsets (KIP-447).

``prepare_offsets`` opens the run's ``{prefix}-offsets`` transaction (InitProducerId fences an
older holder of the id, as for every participant), sends the range's end offsets into it
(AddOffsetsToTxn and TxnOffsetCommit, as a group without members: generation -1, no member id, which
is what an unsubscribed librdkafka consumer's group metadata says), proves them written, and leaves
the transaction open. The commit and abort end it by producer id and epoch like every other
participant; the group's new offsets become visible exactly when the run commits, and vanish when it
aborts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange


class OffsetsWriter(TransactionalWriter):
    """A ``TransactionalWriter`` whose transaction holds the group's offsets and no record."""

    def open(self) -> OffsetsWriter:
        super().open()
        return self

    def send_offsets(self, source: SourceRange) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        # A consumer that never subscribes never joins: its group metadata is member-less.
        consumer = Consumer(
            with_log({**connection_only(self._config), "group.id": source.group_id, "enable.auto.commit": False})
        )
        try:
            metadata = consumer.consumer_group_metadata()
        finally:
            consumer.close()
        offsets = [TopicPartition(t, p, end) for (t, p), end in sorted(source.ends().items())]
        try:
            self._producer.send_offsets_to_transaction(offsets, metadata, self._init_timeout_s)
        except KafkaException as e:
            self._abort_own()
            named = authorization_error_of(e.args[0].name(), self._config, source.group_id, "Read")
            if named is not None:
                raise named from e
            raise Kafka2PCError(
                f"could not add consumer group {source.group_id!r}'s offsets to transaction "
                f"{self.transactional_id!r}: {e.args[0].name()}: {e.args[0].str()}"
            ) from e

    def prepare_offsets(self, stats_timeout_s: float = 5.0) -> Committable:
        """The open transaction's committable (no records): its producer id and epoch."""
        deadline = time.monotonic() + stats_timeout_s
        while self._eos[0] < 0 and time.monotonic() < deadline:
            self._producer.poll(0.01)
        if self._eos[0] < 0:
            self._abort_own()
            raise Kafka2PCError(f"librdkafka reported no producer id for {self.transactional_id!r}")
        self._prepared = True
        self._release()
        return Committable(
            transactional_id=self.transactional_id,
            producer_id=self._eos[0],
            producer_epoch=self._eos[1],
            records=0,
            bytes=0,
            transaction_timeout_ms=self.transaction_timeout_ms,
        )


def prepare_offsets(
    producer_config: Mapping[str, Any],
    transactional_id: str,
    source: SourceRange,
    transaction_timeout_ms: int | None = None,
    id_prefix: str | None = None,
) -> Committable:
    """Open ``transactional_id``'s transaction with ``source``'s end offsets in it, and leave it open."""
    writer = OffsetsWriter(producer_config, transactional_id, transaction_timeout_ms, id_prefix=id_prefix)
    writer.open()
    try:
        writer.send_offsets(source)
        return writer.prepare_offsets()
    except BaseException:
        writer.abandon()
        raise
