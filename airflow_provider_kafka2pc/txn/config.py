"""Client configuration helpers shared by every Kafka client kafka2pc builds."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

_CONNECTION_PREFIXES = (
    "bootstrap.servers",
    "security.protocol",
    "sasl.",
    "ssl.",
    "client.id",
    "socket.",
    "broker.address.family",
)
# Matched against the key lower-cased with '_' read as '.', so kafka-python's names
# (``sasl_plain_password``, ``ssl_password``, ``sasl_oauth_token_provider``) are caught too.
_SECRET_MARKERS = (
    "password",  # sasl.password, ssl.key.password, ssl.keystore.password, sasl_plain_password
    "secret",  # sasl.oauthbearer.client.secret
    "passphrase",  # sasl.oauthbearer.assertion.private.key.passphrase
    "private.key",  # sasl.oauthbearer.assertion.private.key.pem / .file
    "token",
    ".pem",  # ssl.key.pem, ssl.certificate.pem, ssl.ca.pem: inline key material
    "keytab",  # sasl.kerberos.keytab
    "sasl.oauthbearer.config",
)
REDACTED = "***"


def connection_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """Drop producer tuning so one config can build consumers and admin clients too."""
    return {k: v for k, v in config.items() if k.startswith(_CONNECTION_PREFIXES)}


def is_secret_key(key: str) -> bool:
    """True for a librdkafka or kafka-python setting whose value must never be shown."""
    normalized = key.lower().replace("_", ".")
    return any(m in normalized for m in _SECRET_MARKERS)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config safe for logs and XCom."""
    return {k: (REDACTED if is_secret_key(str(k)) else v) for k, v in config.items()}


def _redact_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_key(k) and v is not None else _redact_value(v))
            for k, v in value.items()
        }
    return value


class SecretRedactingFilter(logging.Filter):
    """Rewrites a log record so that no secret reaches any handler.

    Mappings among the arguments lose the values of secret keys (kafka-python's admin client logs
    its whole configuration at DEBUG), and every secret value we have handed to kafka-python is
    replaced wherever it shows up in the formatted message or the exception text. Installed on the
    loggers themselves, so it works whatever handlers, levels or formatters the user configured.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()

    def add_secrets(self, values: Iterable[str]) -> None:
        self._secrets.update(v for v in values if v)

    def _scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, Mapping):
            record.args = _redact_value(args)
        elif isinstance(args, tuple):
            record.args = tuple(_redact_value(a) for a in args)
        if not self._secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: drop the arguments rather than risk them
            message = str(record.msg)
        if any(s in message for s in self._secrets):
            record.msg, record.args = self._scrub(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            if any(s in text for s in self._secrets):
                record.exc_text = self._scrub(text)
        if record.exc_text and any(s in record.exc_text for s in self._secrets):
            record.exc_text = self._scrub(record.exc_text)
        return True


SECRET_FILTER = SecretRedactingFilter()


def protect_kafka_python_logs(config: Mapping[str, Any]) -> None:
    """Install ``SECRET_FILTER`` on every kafka-python logger that exists now, knowing ``config``'s secrets.

    A logger's filters see only the records logged on that logger (not those propagated from its
    children), so the filter goes on each ``kafka.*`` logger. Call it after importing kafka-python
    and before building a client; calling it again is cheap and adds loggers created since.
    """
    SECRET_FILTER.add_secrets(str(v) for k, v in config.items() if is_secret_key(str(k)) and isinstance(v, str))
    manager = logging.Logger.manager
    for name in list(manager.loggerDict):
        if name != "kafka" and not name.startswith("kafka."):
            continue
        logger = manager.loggerDict.get(name)
        if isinstance(logger, logging.Logger) and SECRET_FILTER not in logger.filters:
            logger.addFilter(SECRET_FILTER)
