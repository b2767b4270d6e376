"""The decision topic itself: created with safe settings, or checked before it is trusted.

Compacted, LogAppendTime, two partitions (0: the protocol, in one total order; 1: the history),
replicated, ``min.insync.replicas`` at least 2 where the cluster allows: ``check_topic_settings``
refuses anything that could drop, reorder or lose decisions, and says how to fix it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import TOPIC_CONFIG, DecisionTopicClient, failure_of
from airflow_provider_kafka2pc.txn.kafka.errors import UnsafeDecisionTopicError
from airflow_provider_kafka2pc.txn.protocol.run_history import HISTORY

log = logging.getLogger(__name__)

HISTORY_PARTITION = HISTORY  # the run records of finished runs (``txn.protocol.run_history``)


class DecisionTopic(DecisionTopicClient):
    """The client, with the topic made or checked once per instance (``ensure_topic``)."""

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
                    self._wait_out(failure_of(e), budget, "creating it", "Create", None)

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


__all__ = ["HISTORY_PARTITION", "DecisionTopic", "check_topic_settings"]
