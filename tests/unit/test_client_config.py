"""One connection, two clients: librdkafka settings -> kafka-python, and what cannot be mapped."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.kafka2pc import client_config
from airflow_provider_kafka2pc.txn.kafka.config import (
    OidcTokenProvider,
    connection_only,
    kafka_python_settings,
    redact,
    write_pem_files,
)
from airflow_provider_kafka2pc.txn.kafka.errors import UnmappableConfigError

BASE = {"bootstrap.servers": "b1:9093"}
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_plaintext_keeps_only_how_to_connect() -> None:
    cfg, pems = kafka_python_settings({**BASE, "linger.ms": "5", "socket.timeout.ms": "1000", "client.id": "me"})
    assert cfg == {"bootstrap_servers": ["b1:9093"], "client_id": "me"} and pems == {}


def test_reconnect_tuning_is_accepted_and_left_to_kafka_pythons_defaults() -> None:
    """``reconnect.*`` is connection tuning librdkafka's clients get (kafka2pc defaults one of them):
    the commit side accepts it and connects with its own defaults, like ``socket.*``."""
    tuned = {**BASE, "reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "5000"}
    assert kafka_python_settings(tuned) == ({"bootstrap_servers": ["b1:9093"]}, {})
    assert kafka_python_settings(connection_only(tuned))[0] == {"bootstrap_servers": ["b1:9093"]}


def test_ssl_with_files_hostname_check_and_crl() -> None:
    cfg, pems = kafka_python_settings(
        {
            **BASE,
            "security.protocol": "ssl",
            "ssl.ca.location": "/ca.pem",
            "ssl.certificate.location": "/c.pem",
            "ssl.key.location": "/k.pem",
            "ssl.key.password": "kp",
            "ssl.crl.location": "/crl.pem",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert cfg == {
        "bootstrap_servers": ["b1:9093"],
        "security_protocol": "SSL",
        "ssl_cafile": "/ca.pem",
        "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/k.pem",
        "ssl_password": "kp",
        "ssl_crlfile": "/crl.pem",
        "ssl_check_hostname": False,
    }
    assert pems == {}
    assert kafka_python_settings({**BASE, "ssl.endpoint.identification.algorithm": "https"})[0]["ssl_check_hostname"]


def test_inline_pems_become_private_files() -> None:
    cfg, pems = kafka_python_settings(
        {**BASE, "security.protocol": "SSL", "ssl.ca.pem": PEM, "ssl.certificate.pem": PEM, "ssl.key.pem": "KEY"}
    )
    assert "ssl_cafile" not in cfg
    assert pems == {"ssl_cafile": PEM, "ssl_certfile": PEM, "ssl_keyfile": "KEY"}
    paths, directory = write_pem_files(pems)
    assert directory is not None
    try:
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        for setting, path in paths.items():
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert Path(path).read_text() == pems[setting]
    finally:
        import shutil

        shutil.rmtree(directory)
    assert write_pem_files({}) == ({}, None)


def test_a_pem_and_a_location_for_the_same_file_is_refused() -> None:
    with pytest.raises(UnmappableConfigError, match=r"'ssl\.ca\.pem'"):
        kafka_python_settings({**BASE, "ssl.ca.pem": PEM, "ssl.ca.location": "/ca.pem"})


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_username_and_password(mechanism: str) -> None:
    cfg, _ = kafka_python_settings(
        {
            **BASE,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism.lower(),
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert cfg["sasl_mechanism"] == mechanism
    assert (cfg["sasl_plain_username"], cfg["sasl_plain_password"]) == ("u", "p")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "sasl.mechanism"),  # librdkafka's default is GSSAPI
        ({"sasl.kerberos.keytab": "/k"}, "sasl.kerberos.keytab"),
        ({"ssl.keystore.location": "/ks.p12"}, "ssl.keystore.location"),
        ({"enable.ssl.certificate.verification": "false"}, "enable.ssl.certificate.verification"),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "ssl.endpoint.identification.algorithm"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "sasl.oauthbearer.method"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc"},
            "sasl.oauthbearer.client.id",
        ),
        ({"security.protocol": "KERBEROS"}, "security.protocol"),
    ],
)
def test_what_kafka_python_cannot_honour_is_refused_by_name(extra: dict[str, str], named: str) -> None:
    with pytest.raises(UnmappableConfigError) as e:
        kafka_python_settings({**BASE, **extra})
    assert e.value.key == named and f"'{named}'" in str(e.value)


def test_the_hook_refuses_it_when_it_builds_its_configs() -> None:
    extra = {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}
    with pytest.raises(Kafka2PCConfigError, match=r"connection setting 'sasl\.mechanism': GSSAPI is not supported"):
        client_config("kafka2pc", "b1", 9093, "u", "p", extra)
    with pytest.raises(Kafka2PCConfigError, match=r"'ssl\.keystore\.location'"):
        client_config("kafka", None, None, None, None, {**BASE, "ssl.keystore.location": "/ks.p12"})


class _TokenEndpoint(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []  # noqa: RUF012  (a test double's record)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        _TokenEndpoint.requests.append({"auth": self.headers["Authorization"], "body": body})
        payload = json.dumps({"access_token": f"tok{len(_TokenEndpoint.requests)}", "expires_in": 3600}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    _TokenEndpoint.requests = []
    server = HTTPServer(("127.0.0.1", 0), _TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()


def test_oauthbearer_oidc_client_credentials_on_both_sides(token_endpoint: str) -> None:
    config = {
        **BASE,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "exporter",
        "sasl.oauthbearer.client.secret": "s3cret",
        "sasl.oauthbearer.token.endpoint.url": token_endpoint,
        "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
    }
    cfg, _ = kafka_python_settings(config)
    provider = cfg["sasl_oauth_token_provider"]
    assert isinstance(provider, OidcTokenProvider)
    assert provider.token() == "tok1" and provider.token() == "tok1"  # reused until near expiry
    assert provider.extensions() == {"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}
    (request,) = _TokenEndpoint.requests
    assert request["body"] == "grant_type=client_credentials&scope=kafka"
    import base64

    assert base64.b64decode(request["auth"].split()[1]) == b"exporter:s3cret"
    # kafka-python logs its configuration: the provider shows no secret, redact() hides the rest.
    assert "s3cret" not in repr(provider)
    assert redact(config)["sasl.oauthbearer.client.secret"] == "***"
    # kafka-python accepts only its own AbstractTokenProvider subclasses: the adapter wraps ours.
    import kafka.net.sasl.oauth as oauth

    from airflow_provider_kafka2pc.txn.kafka.wire import kafka_python_token_provider

    wrapped = kafka_python_token_provider(provider)
    assert isinstance(wrapped, oauth.AbstractTokenProvider)
    assert wrapped.token() == "tok1" and wrapped.extensions() == provider.extensions()
    assert "s3cret" not in repr(wrapped)
