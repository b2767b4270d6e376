"""Client configuration helpers shared by every Kafka client kafka2pc builds."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.errors import UnmappableConfigError

_CONNECTION_PREFIXES = (
    "bootstrap.servers",
    "security.protocol",
    "sasl.",
    "ssl.",
    "client.id",
    "socket.",
    "reconnect.",
    "broker.address.family",
)
# librdkafka drops its bootstrap connection once the first metadata names the brokers, and opens
# the next one no sooner than reconnect.backoff.ms / 2 later (at least 11 ms): with the default of
# 100 ms, every new client's first request waited ~50 ms more (a list_topics 54 → 14 ms). Each
# Spark task opens a writer and each commit a few clients, so it adds up. After a failure the
# backoff still doubles up to reconnect.backoff.max.ms (10 s), from 20 ms instead of 100: a
# couple more attempts per broker in an outage's first seconds.
CONNECTION_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 20}
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
    # Java client settings a properties file written for the Java client may carry (librdkafka
    # refuses them, but only after they were read): the JAAS line holds the password, the other the key.
    "jaas",  # sasl.jaas.config
    "keystore.key",  # ssl.keystore.key (a PEM private key)
)
REDACTED = "***"


def properties_lines(path: str) -> list[tuple[str, str]]:
    """The settings lines of a Java-style properties file, each with its ``path:line`` (``OSError``
    when it cannot be read); comments and blank lines left out."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return [
        (f"{path}:{n}", line.strip())
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith(("#", "!"))
    ]


def connection_only(config: Mapping[str, Any]) -> dict[str, Any]:
    """How to connect, over ``CONNECTION_DEFAULTS``; producer tuning dropped, so one config can
    build consumers and admin clients too."""
    return {**CONNECTION_DEFAULTS, **{k: v for k, v in config.items() if k.startswith(_CONNECTION_PREFIXES)}}


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
        trace = record.exc_text
        if not trace and record.exc_info and record.exc_info[1] is not None:
            trace = logging.Formatter().formatException(record.exc_info)
        if trace and any(s in trace for s in self._secrets):
            # Handlers that render the exception object itself (structlog's, in every Airflow process)
            # would show the secret whatever exc_text says: the scrubbed traceback joins the message
            # and the exception leaves the record.
            record.msg = f"{self._scrub(message)}\n{self._scrub(trace)}"  # message: never raises
            record.args, record.exc_info, record.exc_text = None, None, None
            record.kafka2pc_traceback = True  # still a record with a traceback (ConnectionNoiseFilter)
        return True


SECRET_FILTER = SecretRedactingFilter()

# kafka-python's connection life cycle: ~4 WARNING/ERROR lines per failed attempt ("Connection
# failed: 111 ECONNREFUSED", "Bootstrap ... not ready"), 18 in a 30 s outage. kafka2pc reports the
# failure itself, once, so these are DEBUG detail. Its IO loop's selector also warns whenever one
# step took more than 0.1 s of wall time ("blocking the event loop"), which a busy host (an Airflow
# worker beside a Spark job) makes common and which says nothing about the transaction.
_CONNECTION_LOGGERS = (
    "kafka.net.manager",
    "kafka.net.selector",
    "kafka.net.connection",
    "kafka.net.transport",
    "kafka.net.inet",
    "kafka.conn",
)


class ConnectionNoiseFilter(logging.Filter):
    """Demotes kafka-python's connection-failure records (WARNING and ERROR, without a traceback) to
    DEBUG: dropped unless the logger is enabled for DEBUG, where they then show as DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        # kafka2pc_traceback: SECRET_FILTER moved the record's traceback into its message
        if (
            not (logging.DEBUG < record.levelno < logging.CRITICAL)
            or record.exc_info
            or getattr(record, "kafka2pc_traceback", False)
        ):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


CONNECTION_NOISE_FILTER = ConnectionNoiseFilter()


def protect_kafka_python_logs(config: Mapping[str, Any]) -> None:
    """Install ``SECRET_FILTER`` on every kafka-python logger that exists now, knowing ``config``'s secrets.

    A logger's filters see only the records logged on that logger (not those propagated from its
    children), so the filter goes on each ``kafka.*`` logger; kafka-python's connection loggers also
    get ``CONNECTION_NOISE_FILTER``. Call it after importing kafka-python and before building a
    client; calling it again is cheap and adds loggers created since.
    """
    SECRET_FILTER.add_secrets(str(v) for k, v in config.items() if is_secret_key(str(k)) and isinstance(v, str))
    manager = logging.Logger.manager
    for name in list(manager.loggerDict):
        if name != "kafka" and not name.startswith("kafka."):
            continue
        logger = manager.loggerDict.get(name)
        if not isinstance(logger, logging.Logger):
            continue
        if SECRET_FILTER not in logger.filters:
            logger.addFilter(SECRET_FILTER)
        if name in _CONNECTION_LOGGERS and CONNECTION_NOISE_FILTER not in logger.filters:
            logger.addFilter(CONNECTION_NOISE_FILTER)


# -- one connection, two clients --------------------------------------------------------------
# librdkafka setting -> kafka-python setting, for the settings that decide how to connect. Every
# other ``sasl.*`` / ``ssl.*`` setting is refused by ``kafka_python_settings``: the producers would
# connect with it and the commit side without it, and fail later as "cannot reach Kafka".
_KAFKA_PYTHON_NAMES = {
    "bootstrap.servers": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
    "client.id": "client_id",
}
# Inline PEM (librdkafka) -> the kafka-python file setting it is written to.
_INLINE_PEM = {"ssl.ca.pem": "ssl_cafile", "ssl.certificate.pem": "ssl_certfile", "ssl.key.pem": "ssl_keyfile"}
_OIDC_KEYS = frozenset(
    {
        "sasl.oauthbearer.method",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.extensions",
    }
)
# Connection settings that change nothing kafka-python needs (tuning, platform specifics).
_KAFKA_PYTHON_IRRELEVANT = frozenset({"ssl.ca.certificate.stores", "sasl.oauthbearer.grant.type"})
# What both clients support, in the order the connection form offers them.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = frozenset(SASL_MECHANISMS)
_PROTOCOLS = frozenset(SECURITY_PROTOCOLS)


def kafka_python_settings(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """kafka-python's settings for the same connection, and the inline PEMs it needs as files.

    Pure (no files, no network), so the hook calls it when it builds its configs and an unmappable
    setting is refused there, named. Returns ``(settings, {kafka-python file setting: PEM text})``.
    """
    out: dict[str, Any] = {}
    pems: dict[str, str] = {}
    for key, value in config.items():
        if key == "enable.ssl.certificate.verification":
            if str(value).lower() not in ("true", "1"):
                raise UnmappableConfigError(key, "certificate verification cannot be turned off on the commit side")
            continue
        if not key.startswith(_CONNECTION_PREFIXES) or key in _KAFKA_PYTHON_IRRELEVANT or key in _OIDC_KEYS:
            continue
        if key.startswith(("socket.", "reconnect.", "broker.address.family")):
            continue  # tuning; kafka-python's defaults connect the same way
        if key in _INLINE_PEM:
            pems[_INLINE_PEM[key]] = str(value)
        elif key == "ssl.endpoint.identification.algorithm":
            if str(value).lower() not in ("https", "none"):
                raise UnmappableConfigError(key, f"{value!r} is neither 'https' nor 'none'")
            out["ssl_check_hostname"] = str(value).lower() == "https"
        elif key in _KAFKA_PYTHON_NAMES:
            target = _KAFKA_PYTHON_NAMES[key]
            if target == "bootstrap_servers":
                value = [s.strip() for s in str(value).split(",") if s.strip()]
            elif target in ("security_protocol", "sasl_mechanism"):
                value = str(value).upper()
            out[target] = value
        else:
            raise UnmappableConfigError(
                key, "kafka2pc's commit side (kafka-python) has no equivalent; use a supported setting (docs/design.md)"
            )
    for target in pems:
        if target in out:
            raise UnmappableConfigError(
                next(k for k, t in _INLINE_PEM.items() if t == target), "set either the PEM or the file location"
            )
    protocol = str(out.get("security_protocol", "PLAINTEXT"))
    if protocol not in _PROTOCOLS:
        raise UnmappableConfigError("security.protocol", f"{protocol!r} is not one of {sorted(_PROTOCOLS)}")
    if protocol.startswith("SASL"):
        mechanism = str(out.setdefault("sasl_mechanism", "GSSAPI"))
        if mechanism not in _MECHANISMS:
            raise UnmappableConfigError(
                "sasl.mechanism",
                f"{mechanism} is not supported by kafka2pc (librdkafka and kafka-python configure it too "
                f"differently to share one connection); use one of {sorted(_MECHANISMS)}",
            )
        if mechanism == "OAUTHBEARER":
            out["sasl_oauth_token_provider"] = oidc_token_provider(config)
    if not out.get("bootstrap_servers"):
        raise UnmappableConfigError("bootstrap.servers", "missing")
    return out, pems


def oidc_token_provider(config: Mapping[str, Any]) -> Any:
    """kafka-python's token provider for librdkafka's ``sasl.oauthbearer.method=oidc`` settings."""
    method = str(config.get("sasl.oauthbearer.method", "default")).lower()
    if method != "oidc":
        raise UnmappableConfigError(
            "sasl.oauthbearer.method",
            "OAUTHBEARER needs sasl.oauthbearer.method=oidc (client credentials) so both clients can fetch tokens",
        )
    for key in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.token.endpoint.url"):
        if not config.get(key):
            raise UnmappableConfigError(key, "required with sasl.oauthbearer.method=oidc")
    extensions = {}
    for item in str(config.get("sasl.oauthbearer.extensions") or "").split(","):
        k, sep, v = item.partition("=")
        if sep:
            extensions[k.strip()] = v.strip()
    return OidcTokenProvider(
        token_url=str(config["sasl.oauthbearer.token.endpoint.url"]),
        client_id=str(config["sasl.oauthbearer.client.id"]),
        client_secret=str(config["sasl.oauthbearer.client.secret"]),
        scope=str(config.get("sasl.oauthbearer.scope") or "") or None,
        extensions=extensions,
    )


class OidcTokenProvider:
    """OIDC client credentials (RFC 6749 §4.4) for kafka-python's SASL/OAUTHBEARER.

    kafka-python asks ``token()`` on every connection; the token is reused until a minute before
    it expires. Duck-typed to kafka-python's ``AbstractTokenProvider`` so ``txn/config`` needs no
    kafka-python import.
    """

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        extensions: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.token_url, self.client_id, self._secret = token_url, client_id, client_secret
        self.scope, self._extensions, self.timeout_s = scope, dict(extensions or {}), timeout_s
        self._token: str | None = None
        self._expires_at = 0.0

    def __repr__(self) -> str:  # kafka-python logs its configuration: never the secret
        return f"OidcTokenProvider(token_url={self.token_url!r}, client_id={self.client_id!r})"

    def token(self) -> str:
        import base64
        import json
        import time
        import urllib.parse
        import urllib.request

        if self._token is not None and time.monotonic() < self._expires_at:
            return self._token
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        basic = base64.b64encode(
            f"{urllib.parse.quote(self.client_id)}:{urllib.parse.quote(self._secret)}".encode()
        ).decode()
        request = urllib.request.Request(
            self.token_url,
            data=urllib.parse.urlencode(form).encode(),
            headers={"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            body = json.loads(response.read())
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise ValueError(f"the token endpoint {self.token_url} returned no access_token")
        lifetime = float(body.get("expires_in") or 300)
        self._token, self._expires_at = token, time.monotonic() + max(lifetime - 60, lifetime / 2)
        return token

    def extensions(self) -> dict[str, str]:
        return dict(self._extensions)


def write_pem_files(pems: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """Inline PEMs as files in a new private directory (0700, files 0600): kafka-python reads files.

    Returns ``({setting: path}, directory)``; the caller removes the directory when done.
    """
    if not pems:
        return {}, None
    import os
    import tempfile

    directory = tempfile.mkdtemp(prefix="kafka2pc-pem-")  # mkdtemp makes it 0700
    paths = {}
    for setting, text in pems.items():
        path = os.path.join(directory, f"{setting}.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        paths[setting] = path
    return paths, directory
