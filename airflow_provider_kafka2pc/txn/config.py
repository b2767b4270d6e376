"""Client configuration helpers shared by every Kafka client kafka2pc builds."""

from __future__ import annotations

from collections.abc import Mapping
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
_SECRET_MARKERS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem", "token")


def connection_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """Drop producer tuning so one config can build consumers and admin clients too."""
    return {k: v for k, v in config.items() if k.startswith(_CONNECTION_PREFIXES)}


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config safe for logs and XCom."""
    return {k: ("***" if any(m in k for m in _SECRET_MARKERS) else v) for k, v in config.items()}
