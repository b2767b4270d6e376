"""What the CLI prints besides its reports: log lines on stderr, with every secret value of the
client settings scrubbed from them, and the Kafka clients' own chatter kept quiet unless --debug.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.clients import LIBRDKAFKA_LOGGER
from airflow_provider_kafka2pc.txn.kafka.config import redact


def _secret_values(config: Mapping[str, Any]) -> list[str]:
    hidden = redact(config)
    return sorted({str(config[k]) for k in config if hidden[k] != config[k] and str(config[k])}, key=len, reverse=True)


def scrub(text: str, config: Mapping[str, Any]) -> str:
    """Whatever reaches the terminal passes here: a library may quote a setting in an error."""
    for secret in _secret_values(config):
        text = text.replace(secret, "***")
    return text


class _ScrubFilter(logging.Filter):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = config

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrub(record.getMessage(), self.config), None
        if record.exc_info:
            record.exc_text = scrub("".join(traceback.format_exception(*record.exc_info)), self.config)
            record.exc_info = None
        return True


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler main() installed, so a second main() in one process replaces it."""


def setup_logging(debug: bool, config: Mapping[str, Any]) -> None:
    handler = _CliHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kafka2pc: %(levelname)s: %(name)s: %(message)s"))
    handler.addFilter(_ScrubFilter(config))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _CliHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("airflow_provider_kafka2pc").setLevel(logging.DEBUG if debug else logging.WARNING)
    # kafka-python reports every failed connect attempt, and at DEBUG it logs request bodies,
    # SASL ones included: never below INFO, and silent unless --debug (we report failures).
    for noisy in ("kafka", LIBRDKAFKA_LOGGER):
        logging.getLogger(noisy).setLevel(logging.INFO if debug else logging.CRITICAL)


__all__ = ["scrub", "setup_logging"]
