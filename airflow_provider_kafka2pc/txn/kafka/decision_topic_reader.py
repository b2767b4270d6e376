"""Reading one partition of the decision topic in offset order, the one reader every read of the
decision log goes through (``txn/kafka/decision_log.py``): a librdkafka consumer that assigns the
partition (no group joined, no offset committed), reads up to the end offset it found first, and
waits out an unavailable topic within the caller's budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.decision_topic import DecisionTopic
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import READER_GROUP, Failure, failure_of
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError
from airflow_provider_kafka2pc.txn.protocol.records import Entry
from airflow_provider_kafka2pc.txn.protocol.run_history import run_key_of


class DecisionTopicReader(DecisionTopic):
    """The decision topic, read partition by partition."""

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
                        failure = failure_of(e)
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
                            failure = Failure.of_error(err)
                            if failure.transient:  # librdkafka fetches again from the new leader
                                last_error = str(failure)
                                continue
                            self._raise_if_unauthorized(failure.name, "Read")
                            raise DecisionLogError(f"decision log topic {self.topic!r}: {doing} failed: {err}")
                        offset = int(msg.offset() or 0)
                        if offset > last:
                            return
                        key = msg.key() or b""
                        if keys is None or run_key_of(key) in keys:
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


__all__ = ["DecisionTopicReader"]
