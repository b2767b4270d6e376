"""Where the Kafka clients' own log lines go, so that a task log says what matters.

librdkafka writes its log lines to stderr unless the client has a ``logger``, and an Airflow 3
task supervisor logs stderr at ERROR: a retried InitProducerId ("Coordinator load in progress:
retrying", a warning) showed up as an error of a successful task. Clients built in the driver or
the Airflow task take ``with_log(config)``; the executors' writers keep stderr, whose lines the
Spark job forwards at their own level (``spark/jvm_logs.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

LIBRDKAFKA_LOG = logging.getLogger("airflow_provider_kafka2pc.librdkafka")
# kafka-python logs every connection at INFO (~19 lines a task), py4j its socket life cycle.
QUIET_BELOW_WARNING = ("kafka", "py4j")


# librdkafka retries that resolve themselves: a fresh broker's coordinator still loading.
SELF_RESOLVING = (r"Failed to acquire (idempotence|transactional) PID .*: retrying",)


class Demote(logging.Filter):
    """Known lines that say nothing about this run (start-up chatter, retries that resolve
    themselves) go to DEBUG: dropped unless the logger is at DEBUG, where they still show."""

    def __init__(self, patterns: Iterable[str]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not self.pattern.search(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def demote(logger: logging.Logger, patterns: Iterable[str]) -> None:
    """Install ``Demote(patterns)`` on ``logger`` once."""
    if not any(isinstance(f, Demote) for f in logger.filters):
        logger.addFilter(Demote(patterns))


demote(LIBRDKAFKA_LOG, SELF_RESOLVING)


def with_log(config: Mapping[str, Any]) -> dict[str, Any]:
    """A confluent-kafka config whose client logs through Python logging, at librdkafka's level.

    confluent-kafka forwards the lines when the client is polled or flushed."""
    return {**config, "logger": LIBRDKAFKA_LOG}


def quiet_third_party_logs() -> None:
    """Raise kafka-python's and py4j's loggers to WARNING, unless the user set their level or asked
    for DEBUG everywhere (Airflow's ``logging_level``): then they want the clients' chatter too."""
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in QUIET_BELOW_WARNING:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
