"""No secret reaches a log record, at any level, whatever logging the user configured."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from airflow_provider_kafka2pc.txn.kafka.config import SECRET_FILTER, protect_kafka_python_logs, redact
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

PASSWORD = "pw-Hunter2-never-logged"
KEY_PASSWORD = "key-pass-never-logged"


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def texts(self) -> list[str]:
        """Every way a handler could render a record: message, raw arguments, exception text."""
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        out = []
        for r in self.records:
            out += [formatter.format(r), repr(r.args), str(r.msg), r.exc_text or ""]
        return out


@pytest.fixture
def everything_at_debug() -> Iterator[Capture]:
    """The root logger at DEBUG with a handler that keeps every record of every logger."""
    root = logging.getLogger()
    capture = Capture()
    old_level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(capture)
    kafka_levels = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("kafka") and isinstance(logger, logging.Logger)
    }
    for name in kafka_levels:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(old_level)
        for name, level in kafka_levels.items():
            logging.getLogger(name).setLevel(level)


def test_wire_client_logs_no_password_at_debug(everything_at_debug: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka's probe would answer first (nothing listens); this is about kafka-python.
    monkeypatch.setattr("airflow_provider_kafka2pc.txn.kafka.wire.check_reachable", lambda *a, **k: None)
    config = {
        "bootstrap.servers": "127.0.0.1:1",  # nothing listens: bootstrap fails after the config is logged
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "exporter",
        "sasl.password": PASSWORD,
        "ssl.key.password": KEY_PASSWORD,
    }
    with pytest.raises(BrokerUnavailableError) as failed:
        WireClient(config, request_timeout_ms=500, bootstrap_timeout_ms=300)
    assert PASSWORD not in str(failed.value)

    records = everything_at_debug.records
    started = [r for r in records if r.name == "kafka.admin.client" and "Starting KafkaAdminClient" in r.getMessage()]
    assert started, "kafka-python's DEBUG configuration record was not produced: the test proves nothing"
    assert "'sasl_plain_password': '***'" in started[0].getMessage()
    assert "'sasl_plain_username': 'exporter'" in started[0].getMessage()
    leaked = [t for t in everything_at_debug.texts() for s in (PASSWORD, KEY_PASSWORD) if s in t]
    assert leaked == []


def test_a_secret_value_anywhere_in_a_kafka_record_is_replaced(everything_at_debug: Capture) -> None:
    protect_kafka_python_logs({"sasl_plain_password": PASSWORD})
    logger = logging.getLogger("kafka.net.manager")
    assert SECRET_FILTER in logger.filters
    logger.warning("login as %s with %s", "exporter", PASSWORD)
    logger.debug("nested %s", {"outer": {"ssl_password": KEY_PASSWORD, "client_id": "me"}})
    try:
        raise RuntimeError(f"auth failed for {PASSWORD}")
    except RuntimeError:
        logger.exception("failed")
    texts = everything_at_debug.texts()
    assert not [t for t in texts if PASSWORD in t or KEY_PASSWORD in t]
    messages = [r.getMessage() for r in everything_at_debug.records]
    assert "login as exporter with ***" in messages
    assert "nested {'outer': {'ssl_password': '***', 'client_id': 'me'}}" in messages
    last = everything_at_debug.records[-1]
    assert last.getMessage().startswith("failed\nTraceback") and "auth failed for ***" in last.getMessage()
    assert last.exc_info is None  # nothing left that a handler could render the secret from


def test_a_handler_that_renders_the_exception_object_sees_no_secret(
    capsys: pytest.CaptureFixture[str], everything_at_debug: Capture
) -> None:
    """Airflow's structlog handler renders a foreign record's exception from ``exc_info``, not ``exc_text``."""
    import structlog

    logger = logging.getLogger("kafka.net.manager")
    # Levels come from the fixture; an earlier test's logging configuration in this process (the
    # suite's workers run Airflow and Spark tests first) may have disabled the logger.
    disabled, logger.disabled = logger.disabled, False
    disabled_below = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    protect_kafka_python_logs({"sasl_plain_password": PASSWORD})
    handler = logging.StreamHandler()
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(processor=structlog.dev.ConsoleRenderer(colors=False)))
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"auth failed for {PASSWORD}")
        except RuntimeError:
            logger.error("failed", exc_info=True)
    finally:
        logger.removeHandler(handler)
        logger.disabled = disabled
        logging.disable(disabled_below)
    shown = capsys.readouterr().err
    assert "auth failed for ***" in shown and PASSWORD not in shown


def test_filter_does_not_touch_the_clients_own_config(everything_at_debug: Capture) -> None:
    protect_kafka_python_logs({})
    config = {"sasl_plain_password": PASSWORD}
    logging.getLogger("kafka.admin.client").debug("configuration: %s", config)
    assert config == {"sasl_plain_password": PASSWORD}


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "ssl.certificate.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.config",
        "sasl.kerberos.keytab",
        "sasl_plain_password",
        "ssl_password",
        "some.access.token",
        "Any.SECRET.key",
        "sasl.jaas.config",  # a Java client's properties file, read by an application's export
        "ssl.keystore.key",
    ],
)
def test_redact_hides_every_secret_key(key: str) -> None:
    assert redact({key: "x", "bootstrap.servers": "b:9092"}) == {key: "***", "bootstrap.servers": "b:9092"}


@pytest.mark.parametrize(
    "key", ["bootstrap.servers", "sasl.username", "sasl.mechanism", "security.protocol", "ssl.ca.location"]
)
def test_redact_keeps_what_is_not_secret(key: str) -> None:
    assert redact({key: "x"}) == {key: "x"}


def test_a_broken_format_string_with_a_secret_traceback_still_logs_scrubbed(everything_at_debug: Capture) -> None:
    protect_kafka_python_logs({"sasl_plain_password": PASSWORD})
    logger = logging.getLogger("kafka.net.manager")
    try:
        raise RuntimeError(f"auth failed for {PASSWORD}")
    except RuntimeError:
        logger.error("failed %s %s", "only one argument", exc_info=True)
    last = everything_at_debug.records[-1]
    assert last.getMessage().startswith("failed %s %s\nTraceback") and "auth failed for ***" in last.getMessage()
    assert not [t for t in everything_at_debug.texts() if PASSWORD in t]
