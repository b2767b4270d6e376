"""The Kafka clients of one prepare, one command of the ``kafka2pc`` CLI or one load of the exporters
page: a wire client and the decision log, built on first use and closed together, and the one question asked
before any read (does the decision topic exist, without creating it?).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import authorization_error_of
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.reachability import check_connection
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

log = logging.getLogger(__name__)

# Where librdkafka's own lines go (a logger of their own, so the CLI can quiet them).
LIBRDKAFKA_LOGGER = "kafka2pc.librdkafka"


class KafkaClients:
    """The Kafka clients one prepare, command or page load needs, built on first use, closed at the end
    (``close``, or leaving a ``with`` block). ``timeout_s`` bounds the decision log's calls and the
    describe of its topic; ``request_timeout_s`` (default: the same) one request of the wire client;
    ``connect_timeout_s`` (default: the same) connecting, for every client."""

    def __init__(
        self,
        config: Mapping[str, Any],
        decision_topic: str,
        timeout_s: float,
        request_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        reachable: bool = False,
    ) -> None:
        self.config = dict(config)
        self.decision_topic = decision_topic
        self.timeout_s = timeout_s
        self.request_timeout_s = timeout_s if request_timeout_s is None else request_timeout_s
        self.connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        self._checked = reachable  # the caller's check_connection has just passed with this config
        self._wire: WireClient | None = None
        self._log: DecisionLog | None = None

    def check(self) -> None:
        """Reach Kafka once, before the first client: a broker down, a wrong address, a refused login
        or certificate is named (``reachability.check_connection``), not met as a request's timeout."""
        if not self._checked:
            check_connection(self.config, self.connect_timeout_s)
            self._checked = True

    def wire(self) -> WireClient:
        if self._wire is None:
            self._wire = WireClient(
                self.config,
                request_timeout_ms=int(self.request_timeout_s * 1000),
                bootstrap_timeout_ms=int(self.connect_timeout_s * 1000),
                reachable=self._checked,
            )
        return self._wire

    def decision_log(self) -> DecisionLog:
        if self._log is None:
            self._log = DecisionLog(self.config, topic=self.decision_topic, timeout_s=self.timeout_s)
        return self._log

    def decision_topic_exists(self) -> bool:
        """Asked before reading, because DecisionLog.read() and append() create a missing topic.

        A topic this principal may not describe is hidden by Kafka exactly like a missing one in a
        listing; DescribeTopics (which never creates a topic) tells them apart, and a topic we may not
        see raises ``KafkaAuthorizationError``: "no decisions" would be a lie that aborts committed runs.
        """
        from confluent_kafka import KafkaError, KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        self.check()  # a broker that cannot be reached is named as such, not as a describe's timeout
        # librdkafka logs every failed connect to stderr; we report the failure ourselves.
        conf: dict[str, Any] = {**connection_only(self.config), "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}
        admin = AdminClient(conf)
        future = admin.describe_topics(TopicCollection([self.decision_topic]), request_timeout=self.timeout_s)
        try:
            future[self.decision_topic].result(timeout=self.timeout_s + 1)
        except KafkaException as e:
            err = e.args[0]
            if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return False
            named = authorization_error_of(err.name(), self.config, self.decision_topic, "Describe")
            if named is not None:
                raise named from None
            raise BrokerUnavailableError(
                f"cannot describe the decision topic {self.decision_topic!r} at "
                f"{self.config.get('bootstrap.servers')} within {self.timeout_s:g} s: {err.name()}: {err.str()}"
            ) from e
        return True

    def close(self) -> None:
        wire, decision_log, self._wire, self._log = self._wire, self._log, None, None
        try:
            if wire is not None:
                wire.close()
        finally:
            if decision_log is not None:
                decision_log.close()

    def __enter__(self) -> KafkaClients:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # never instead of the error (or skip) already on its way out
            log.warning("could not close the Kafka clients cleanly", exc_info=True)


__all__ = ["LIBRDKAFKA_LOGGER", "KafkaClients"]
