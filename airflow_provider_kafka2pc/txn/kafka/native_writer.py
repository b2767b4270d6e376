"""The writers on the native path: ``TransactionalWriter`` and ``DeliveryWriter`` (same life cycle,
same proof, same errors) whose producer is ``NativeProducer``, fed Arrow columns (``produce_arrow``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.java_partitioner import java_partitions
from airflow_provider_kafka2pc.txn.kafka.message_arrays import (
    as_bytes,
    binary_column,
    bytes_at,
    explicit_partitions,
    message_array,
    partition_order,
)
from airflow_provider_kafka2pc.txn.kafka.native import ERR_UNKNOWN_PARTITION, NativeProducer
from airflow_provider_kafka2pc.txn.kafka.writer import DeliveryWriter, TransactionalWriter
from airflow_provider_kafka2pc.txn.protocol.errors import NativeUnsupportedError


class _NativeWriting(DeliveryWriter):
    """What the native writers add to the Python ones: another producer and Arrow columns in."""

    # (topic, partition) -> records given their partition before librdkafka (see _placed_here).
    _assigned: dict[tuple[str, int], int]
    # Java's partitioner, computed here: the setting librdkafka would run it for (the default).
    _java_partitioner: bool

    def _new_producer(self) -> Any:
        self._assigned = {}
        self._java_partitioner = self._config.get("partitioner") == "murmur2_random"
        return NativeProducer(self._config)

    def produce_arrow(
        self, topic: str, values: Any, keys: Any = None, partitions: Any = None, nbytes: int | None = None
    ) -> None:
        """One Arrow batch's records to ``topic``: values, optional keys and partitions (pyarrow arrays)."""
        import numpy as np
        from confluent_kafka import KafkaError

        values, keys = binary_column(values), None if keys is None else binary_column(keys)  # alive to the end
        self._before_write()
        refusals: list[tuple[int, Any]] = []
        try:
            chosen = explicit_partitions(partitions, len(values))
            # The topic's partitions are known before its first record, so a record with its
            # partition goes straight to that partition's queue, never through the unassigned one.
            count = self._producer.partition_count(topic)
            if count is not None:
                beyond = np.flatnonzero(chosen >= count)
                if len(beyond):  # refused here: librdkafka would keep (leak) it and stall the abort
                    row = int(beyond[0])
                    key = None if keys is None else as_bytes(keys[row].as_py())
                    value = as_bytes(values[row].as_py())
                    raise self._refused(KafkaError(ERR_UNKNOWN_PARTITION), topic, int(chosen[row]), key, value)
                if self._java_partitioner:
                    chosen = java_partitions(keys, chosen, count, random.randrange(count))
            order = partition_order(chosen) if int(chosen.min(initial=0)) >= 0 else None
            messages = message_array(values, keys, chosen, order)
            self._producer.produce_messages(topic, messages, lambda i, err: refusals.append((i, err)))
        except BaseException as e:
            self._broken(e)
            raise
        if refusals:  # produce_messages stops at the first
            i, err = refusals[0]
            m = messages[i]
            key, value = bytes_at(int(m["key"]), int(m["key_len"])), bytes_at(int(m["payload"]), int(m["len"]))
            raise self._refused(err, topic, int(m["partition"]), key, value)
        self._after_write(len(messages), nbytes, (), None)
        self._counts[topic] = self._counts.get(topic, 0) + len(messages)
        if count is None:
            # librdkafka knows no partitions of the topic either: it parked these records on its
            # unassigned queue, and its partitioner counts them when it learns the partitions.
            return
        placed = np.bincount(chosen[chosen >= 0], minlength=count)  # a count per partition, no sort
        for partition in np.flatnonzero(placed).tolist():
            tp = (topic, partition)
            self._assigned[tp] = self._assigned.get(tp, 0) + int(placed[partition])

    def produce_batch(self, *args: Any, **kwargs: Any) -> None:
        raise NativeUnsupportedError("the native writer takes Arrow columns: produce_arrow()")

    def produce_rows(self, *args: Any, **kwargs: Any) -> None:
        raise NativeUnsupportedError("the native writer takes Arrow columns: produce_arrow()")

    def _release(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.destroy()


class NativeDeliveryWriter(_NativeWriting):
    """``DeliveryWriter`` (AT_LEAST_ONCE, NONE) on the native path."""


class NativeTransactionalWriter(_NativeWriting, TransactionalWriter):
    """``TransactionalWriter`` on the native path: init (fences), begin, ``produce_arrow``…, ``prepare()``."""

    def _placed_here(self) -> Mapping[tuple[str, int], int]:
        """The records given their partition here (a partition column, ``java_partitions``).

        librdkafka's statistics count a record ("msgs") when its partitioner assigns it;
        ``rd_kafka_produce_batch`` puts a record that already has its partition on that
        partition's queue without the partitioner, uncounted (the topic's partitions are known
        before: ``NativeProducer.partition_count``). Known here at once, so a prepare whose
        records were all placed here waits for no statistics report after its flush."""
        return self._assigned


__all__ = ["NativeDeliveryWriter", "NativeTransactionalWriter"]
