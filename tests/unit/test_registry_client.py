"""The registry client and the driver-side resolution against a fake Confluent-compatible registry
(an HTTP server on loopback that keeps subjects in memory), and the connection's settings; and the
registry's misbehaviours (a slow drip, a proxy's page, a wrong base path, a malformed answer, a
refusal without a reason), each named within the connection's timeout before anything is sent on."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
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
    messages: list[str] = field(default_factory=list)  # the compatibility answer's reasons (Apicurio: none)
    # (method, path after the API's base) -> (status, answer); bytes are sent as an HTML page
    canned: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    api_only: bool = False  # only /apis/ccompat/v7 is the API; anything else is a 404 page, as Apicurio's

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.fail_with:
            return self.fail_with, {"error_code": self.fail_with, "message": "no"}
        if self.api_only and not path.startswith("/apis/ccompat/v7/"):
            return 404, b"<html><body><h1>Resource not found</h1></body></html>"
        route = path.split("?")[0].removeprefix("/apis/ccompat/v7").strip("/")
        if (method, route) in self.canned:
            return self.canned[method, route]
        parts = route.split("/")
        if parts == ["config"]:
            return 200, {"compatibilityLevel": self.level}
        if parts[0] == "config":
            return 404, {"error_code": 40408, "message": "no subject config"}
        if parts[0] == "compatibility":
            return 200, {"is_compatible": self.compatible, "messages": [] if self.compatible else self.messages}
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
            page = isinstance(payload, bytes)
            data = payload if page else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header(
                "Content-Type", "text/html; charset=utf-8" if page else "application/vnd.schemaregistry.v1+json"
            )
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
    registry.compatible, registry.messages = (
        False,
        ["{errorType:'TYPE_MISMATCH', description:'The type at path '/fields/0/type' ...', additionalInfo:'id'}"],
    )
    with pytest.raises(
        errors.IncompatibleSchemaError,
        match=r"BACKWARD compatibility: \{errorType:'TYPE_MISMATCH'.*'id'\}; no transaction",
    ):
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


# -- a misbehaving registry: each named within the connection's timeout, nothing registered ----------


def _drip(part: str) -> Iterator[str]:
    """A server on loopback that answers every request slowly, a line every 2 s: its headers
    (``part="headers"``) or, after prompt headers, its body (``"body"``); yields its URL."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            lines = [b"HTTP/1.1 200 OK\r\n", *[f"X-Slow-{n}: 1\r\n".encode() for n in range(30)]]
            if part == "body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 90\r\n\r\n")
                lines = [b'["orders-value",' for _ in range(30)]
            for n, line in enumerate(lines):
                if n and stop.wait(2.0):
                    return
                try:
                    conn.sendall(line)
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/apis/ccompat/v7"
    finally:
        stop.set()
        server.close()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_registry_that_drips_its_answer_is_given_one_timeout_for_the_whole_request(part: str) -> None:
    for url in _drip(part):
        client = RegistryClient(RegistrySettings(url, "exporter", PASSWORD, timeout_s=3))
        started = time.monotonic()
        with pytest.raises(errors.RegistryUnreachableError) as raised:
            resolve(client, AvroFormat(), "value", "orders", SCHEMA)
        took = time.monotonic() - started
        assert 2.9 < took < 3.5, took  # a header every 2 s held urllib's per-read timeout for 40 s
        message = str(raised.value)
        assert "did not answer POST /subjects/orders-value within the registry connection's timeout of 3 s" in message
        assert errors.NOTHING_WRITTEN in message and PASSWORD not in message


def test_a_proxy_login_page_answered_with_200_is_named_with_its_first_bytes(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    page = f"<html>\n<head><title>Sign in</title></head><body>token {PASSWORD}</body></html>".encode()
    registry.canned[("POST", "subjects/orders-value")] = (200, page)
    with pytest.raises(errors.RegistryAnswerError) as raised:
        resolve(RegistryClient(RegistrySettings(url, "exporter", PASSWORD)), AvroFormat(), "value", "orders", SCHEMA)
    message = str(raised.value)
    assert f"the schema registry at {url} answered POST /subjects/orders-value with HTTP 200 (text/html" in message
    assert "that is not JSON" in message and "'<html> <head><title>Sign in</title>" in message, message
    assert "token ***" in message and PASSWORD not in message and errors.NOTHING_WRITTEN in message
    assert not any(path.endswith("/versions") for _, path, _ in registry.seen)  # nothing registered


def test_a_base_url_without_the_ccompat_path_is_told_which_url_to_use(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    registry.api_only = True
    root = url.removesuffix("/apis/ccompat/v7")
    with pytest.raises(errors.RegistryAnswerError) as raised:
        resolve(RegistryClient(RegistrySettings(root)), AvroFormat(), "value", "orders", SCHEMA)
    message = str(raised.value)
    assert f"POST /subjects/orders-value answered HTTP 404 (text/html; charset=utf-8), while {url}/subjects" in message
    assert f"Use {url} as the registry connection's URL" in message and errors.NOTHING_WRITTEN in message
    # Where no registry answers under the path either, the URL is said not to be one.
    with pytest.raises(errors.RegistryAnswerError, match=r"does not look like a Confluent-compatible schema registry"):
        RegistryClient(RegistrySettings(root + "/other")).subjects()
    assert [path for method, path, _ in registry.seen if method == "POST"] == ["/subjects/orders-value"]


def test_an_answer_without_the_field_asked_for_is_named_as_malformed(fake: tuple[FakeRegistry, str]) -> None:
    registry, url = fake
    registry.canned[("POST", "subjects/orders-value/versions")] = (200, {"identifier": 3})
    with pytest.raises(errors.RegistryAnswerError) as raised:
        resolve(RegistryClient(RegistrySettings(url)), AvroFormat(), "value", "orders", SCHEMA)
    message = str(raised.value)
    assert "answered POST /subjects/orders-value/versions with HTTP 200" in message
    assert "without its 'id' field" in message and '{"identifier": 3}' in message, message


_NO_FIELD = "Schema being registered is incompatible with an earlier schema"
_FIELD = "Incompatible artifact: READER_FIELD_MISSING_DEFAULT_VALUE at /fields/1 (field 'code')"


@pytest.mark.parametrize(
    ("said", "words"),
    [
        (_FIELD, f"BACKWARD compatibility: {_FIELD}; {errors.NOTHING_WRITTEN}"),  # the registry's words name it
        (
            _NO_FIELD,
            f"the registry said {_NO_FIELD!r}; compared with version 1: field 'value.code' is new and has no default",
        ),
    ],
)
def test_a_409_on_registration_names_the_field(fake: tuple[FakeRegistry, str], said: str, words: str) -> None:
    registry, url = fake
    client = RegistryClient(RegistrySettings(url))
    resolve(client, AvroFormat(), "value", "orders", SCHEMA)
    registry.canned[("POST", "subjects/orders-value/versions")] = (409, {"error_code": 409, "message": said})
    added = json.loads(SCHEMA)
    added["fields"].append({"name": "code", "type": "string"})
    with pytest.raises(errors.IncompatibleSchemaError) as raised:
        resolve(client, AvroFormat(), "value", "orders", json.dumps(added))
    assert words in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    ("level", "change", "words"),
    [
        ("FULL", "added", "field 'value.code' is new and has no default"),
        ("FULL", "removed", "field 'value.name' is gone, and the latest version gives it no default"),
        ("FULL", "retyped", "field 'value.id' changes type from long to string"),
        ("BACKWARD", "removed", None),  # BACKWARD lets a field go: the registry refused for a reason of its own
    ],
)
def test_a_refusal_without_a_reason_names_the_field_by_a_local_comparison(
    fake: tuple[FakeRegistry, str], level: str, change: str, words: str | None
) -> None:
    registry, url = fake
    latest = json.loads(SCHEMA)
    latest["fields"].append({"name": "name", "type": "string"})
    registry.subjects["orders-value"] = [(3, json.dumps(latest))]
    registry.compatible, registry.level = False, level  # Apicurio: is_compatible false, no messages
    new = json.loads(json.dumps(latest))
    if change == "added":
        new["fields"].append({"name": "code", "type": "string"})
    elif change == "removed":
        new["fields"].pop()
    else:
        new["fields"][0]["type"] = "string"
    with pytest.raises(errors.IncompatibleSchemaError) as raised:
        resolve(RegistryClient(RegistrySettings(url)), AvroFormat(), "value", "orders", json.dumps(new))
    message = str(raised.value)
    assert f"under the registry's {level} compatibility: the registry gave no reason; " in message
    assert (words or "none of the common causes (a field added or removed without a default") in message, message
    assert errors.NOTHING_WRITTEN in message
    assert not any(method == "POST" and path.endswith("/versions") for method, path, _ in registry.seen)


def test_avro_names_are_checked_before_the_registry_is_asked(fake: tuple[FakeRegistry, str]) -> None:
    from pyspark.sql import types as T

    from airflow_provider_kafka2pc.spark import avro_schema

    registry, url = fake
    client = RegistryClient(RegistrySettings(url))
    inner = T.StructType([T.StructField("x", T.LongType(), False)])
    struct = T.StructType(
        [
            T.StructField("order-id", T.LongType(), False),
            T.StructField("a", T.StructType([T.StructField("b", inner, False)]), False),
            T.StructField("a_b", inner, False),
        ]
    )
    derived = json.dumps(avro_schema.derive(struct, "orders_value"))
    with pytest.raises(errors.SchemaMismatchError) as raised:
        resolve(client, AvroFormat(), "value", "orders", derived)
    message = str(raised.value)
    assert "field 'value.order-id': 'order-id' is not a valid Avro name" in message
    assert "rename the column with an alias, e.g. F.col('`order-id`').alias('order_id')" in message
    assert "fields 'value.a.b' and 'value.a_b' are both the Avro type 'orders_value_a_b'" in message
    assert errors.NOTHING_WRITTEN in message
    given = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "order-id", "type": "long"}]})
    with pytest.raises(errors.SchemaMismatchError, match=r"rename it in the schema \(and the column\).*'order_id'"):
        resolve(client, AvroFormat(schema=given), "value", "orders", None)
    assert registry.seen == []  # nothing was sent
