"""The registry client and the driver-side resolution against a fake Confluent-compatible registry
(an HTTP server on loopback that keeps subjects in memory), and the connection's settings."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError
from airflow_provider_kafka2pc.hooks.schema_registry import registry_settings
from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.client import RegistryClient, RegistrySettings
from airflow_provider_kafka2pc.registry.formats import AvroFormat, JsonSchemaFormat, SubjectStrategy, subject_name
from airflow_provider_kafka2pc.registry.resolve import record_name, resolve

PASSWORD = "pa55-word-never-shown"
SCHEMA = json.dumps(
    {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
)


@dataclass
class FakeRegistry:
    """Subjects -> [(id, schema)], a compatibility answer, and the requests seen."""

    subjects: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    compatible: bool = True
    level: str = "BACKWARD"
    fail_with: int | None = None  # answer every request with this status
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Authorization
    next_id: int = 7

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.fail_with:
            return self.fail_with, {"error_code": self.fail_with, "message": "no"}
        parts = path.split("?")[0].removeprefix("/apis/ccompat/v7").strip("/").split("/")
        if parts == ["config"]:
            return 200, {"compatibilityLevel": self.level}
        if parts[0] == "config":
            return 404, {"error_code": 40408, "message": "no subject config"}
        if parts[0] == "compatibility":
            return 200, {"is_compatible": self.compatible, "messages": [] if self.compatible else ["field removed"]}
        if parts == ["subjects"]:
            return 200, list(self.subjects)
        subject = parts[1]
        versions = self.subjects.get(subject)
        if method == "POST" and len(parts) == 3:  # register
            if versions and not self.compatible:
                return 409, {"error_code": 409, "message": "incompatible"}
            for schema_id, text in versions or []:
                if text == body["schema"]:
                    return 200, {"id": schema_id}
            self.next_id += 1
            self.subjects.setdefault(subject, []).append((self.next_id, body["schema"]))
            return 200, {"id": self.next_id}
        if versions is None:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        if method == "POST":  # lookup
            for n, (schema_id, text) in enumerate(versions, 1):
                if text == body["schema"]:
                    return 200, {"subject": subject, "version": n, "id": schema_id, "schema": text}
            return 404, {"error_code": 40403, "message": "Schema not found"}
        if len(parts) == 3:
            return 200, list(range(1, len(versions) + 1))
        n = len(versions) if parts[3] == "latest" else int(parts[3])
        if not 1 <= n <= len(versions):
            return 404, {"error_code": 40402, "message": "Version not found."}
        schema_id, text = versions[n - 1]
        return 200, {"subject": subject, "version": n, "id": schema_id, "schema": text}


def _serve(registry: FakeRegistry, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """The fake on loopback, over TLS with ``tls``; yields its ccompat URL."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            registry.seen.append((self.command, self.path, self.headers.get("Authorization")))
            status, payload = registry.answer(self.command, self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _serve

        def log_message(self, *args: Any) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake() -> Iterator[tuple[FakeRegistry, str]]:
    registry = FakeRegistry()
    for url in _serve(registry):
        yield registry, url


def test_a_registry_whose_certificate_a_private_ca_signed_is_trusted_with_its_ca_file(tmp_path: Path) -> None:
    from tests.helpers.kafka import kafka_local

    ca, _, _ = kafka_local()._make_tls(tmp_path)  # a CA and a certificate for 127.0.0.1, by openssl
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "tls" / "broker.pem", tmp_path / "tls" / "broker.key")
    registry = FakeRegistry(subjects={"orders-value": [(3, SCHEMA)]})
    for url in _serve(registry, tls):
        assert RegistryClient(RegistrySettings(url, ca_file=str(ca))).subjects() == ["orders-value"]
        with pytest.raises(errors.RegistryUnreachableError, match=r"CERTIFICATE_VERIFY_FAILED.*URL and CA"):
            RegistryClient(RegistrySettings(url)).subjects()


def test_basic_auth_and_bearer_token_go_in_the_authorization_header_only(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    RegistryClient(RegistrySettings(url, "exporter", PASSWORD)).subjects()
    RegistryClient(RegistrySettings(url, bearer_token="tok-123")).subjects()
    basic = "Basic " + base64.b64encode(f"exporter:{PASSWORD}".encode()).decode()
    assert [auth for _, _, auth in registry.seen] == [basic, "Bearer tok-123"]
    shown = repr(RegistrySettings(url, "exporter", PASSWORD)) + repr(RegistrySettings(url, bearer_token="tok-123"))
    assert PASSWORD not in shown and "tok-123" not in shown


def test_settings_refuse_credentials_in_the_url_and_two_kinds_of_auth() -> None:
    with pytest.raises(errors.RegistryConfigError, match="login and password instead"):
        RegistrySettings(f"https://exporter:{PASSWORD}@registry.example.com")
    with pytest.raises(errors.RegistryConfigError, match="not both"):
        RegistrySettings("https://registry.example.com", "exporter", PASSWORD, bearer_token="t")
    with pytest.raises(errors.RegistryConfigError, match="http"):
        RegistrySettings("registry.example.com")


@pytest.mark.parametrize(
    ("status", "kind", "words"),
    [
        (401, errors.RegistryAuthError, "refused the credentials (HTTP 401"),
        (403, errors.RegistryAuthError, "denied this principal the request (HTTP 403"),
        (500, errors.RegistryError, "answered HTTP 500: no"),
    ],
)
def test_refusals_are_named_without_the_secret(
    fake: tuple[FakeRegistry, str], status: int, kind: type[Exception], words: str
) -> None:
    registry, url = fake
    registry.fail_with = status
    with pytest.raises(kind) as raised:
        resolve(RegistryClient(RegistrySettings(url, "exporter", PASSWORD)), AvroFormat(), "value", "orders", SCHEMA)
    assert words in str(raised.value) and errors.NOTHING_WRITTEN in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_an_unreachable_registry_is_named() -> None:
    client = RegistryClient(RegistrySettings("http://127.0.0.1:9/apis/ccompat/v7", timeout_s=2))
    with pytest.raises(
        errors.RegistryUnreachableError, match=r"cannot reach the schema registry at http://127.0.0.1:9"
    ):
        client.subjects()


def test_a_new_subject_is_registered_and_found_again_without_registering(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    client = RegistryClient(RegistrySettings(url))
    first = resolve(client, AvroFormat(), "value", "orders", SCHEMA)
    again = resolve(client, AvroFormat(), "value", "orders", SCHEMA)
    assert (first.subject, first.id, first.version) == ("orders-value", 8, 1)
    assert (again.id, again.version) == (8, 1) and "already registered" in again.answer
    registered = [path for method, path, _ in registry.seen if method == "POST" and path.endswith("/versions")]
    assert registered == ["/apis/ccompat/v7/subjects/orders-value/versions"]  # once


def test_a_changed_schema_is_checked_for_compatibility_first(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    client = RegistryClient(RegistrySettings(url))
    resolve(client, AvroFormat(), "value", "orders", SCHEMA)
    changed = SCHEMA.replace('"long"', '"string"')
    registry.compatible = False
    with pytest.raises(errors.IncompatibleSchemaError, match=r"BACKWARD compatibility: field removed; no transaction"):
        resolve(client, AvroFormat(), "value", "orders", changed)
    registry.compatible = True
    resolved = resolve(client, AvroFormat(), "value", "orders", changed)
    assert resolved.version == 2 and "under BACKWARD: compatible" in resolved.answer


def test_registration_forbidden_names_the_subject_and_the_fix(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    client = RegistryClient(RegistrySettings(url))
    with pytest.raises(errors.SubjectNotFoundError, match=r"subject 'orders-value' does not exist.*auto_register=True"):
        resolve(client, AvroFormat(auto_register=False), "value", "orders", SCHEMA)
    registry.subjects["orders-value"] = [(3, SCHEMA)]
    with pytest.raises(errors.SubjectNotFoundError, match="not registered under subject 'orders-value'"):
        resolve(client, AvroFormat(auto_register=False), "value", "orders", SCHEMA.replace("long", "int"))
    assert resolve(client, AvroFormat(auto_register=False), "value", "orders", SCHEMA).id == 3
    assert not any(method == "POST" and path.endswith("/versions") for method, path, _ in registry.seen)


def test_a_given_version_is_read_not_registered(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    registry.subjects["orders-value"] = [(3, SCHEMA), (5, SCHEMA.replace("long", "int"))]
    client = RegistryClient(RegistrySettings(url))
    assert resolve(client, AvroFormat(version=1), "value", "orders", None).id == 3
    assert resolve(client, AvroFormat(version="latest"), "value", "orders", None).id == 5
    with pytest.raises(errors.SubjectNotFoundError, match="has no version 9"):
        resolve(client, AvroFormat(version=9), "value", "orders", None)


def test_subject_strategies() -> None:
    assert subject_name(SubjectStrategy.TOPIC, "orders", "key", None) == "orders-key"
    assert subject_name(SubjectStrategy.RECORD, None, "value", "shop.Order") == "shop.Order"
    assert subject_name(SubjectStrategy.TOPIC_RECORD, "orders", "value", "shop.Order") == "orders-shop.Order"
    with pytest.raises(ValueError, match="needs the export's topic"):
        subject_name(SubjectStrategy.TOPIC, None, "value", None)
    assert record_name(SCHEMA, "AVRO") == "shop.Order"
    assert record_name(json.dumps({"title": "Order", "type": "object"}), "JSON") == "Order"
    with pytest.raises(ValueError, match="not both"):
        JsonSchemaFormat(schema="{}", version=1)


def test_connection_settings_from_the_form() -> None:
    s = registry_settings("registry.example.com/apis/ccompat/v7", 8081, "exporter", PASSWORD, {})
    assert (s.url, s.username, s.password, s.bearer_token) == (
        "http://registry.example.com:8081/apis/ccompat/v7",
        "exporter",
        PASSWORD,
        None,
    )
    s = registry_settings("https://r.example.com:8443", 8081, None, "tok", {"auth": "bearer", "ca_file": "/ca.pem"})
    assert (s.url, s.bearer_token, s.username, s.ca_file) == ("https://r.example.com:8443", "tok", None, "/ca.pem")
    with pytest.raises(Kafka2PCConfigError, match=r"Login .basic auth.*empty with bearer"):
        registry_settings("https://r.example.com", None, "exporter", "tok", {"auth": "bearer"})
    with pytest.raises(Kafka2PCConfigError, match=r"Registry URL.*holds credentials"):
        registry_settings(f"https://exporter:{PASSWORD}@r.example.com", None, None, None, {})
    with pytest.raises(Kafka2PCConfigError, match="Timeout"):
        registry_settings("https://r.example.com", None, None, None, {"timeout_s": "soon"})
