"""A small client of the Confluent-compatible schema registry REST API (Confluent Schema Registry,
Apicurio Registry's ``/apis/ccompat/v7``, Karapace, Redpanda).

Only what a driver needs once per export: look a schema up under a subject, read a subject's version
or a schema by id, ask the compatibility of a schema, register one. Standard library HTTP (``urllib``,
one deadline per request: ``registry/transport.py``): one request per question on the driver, nothing
per record. Credentials travel in the ``Authorization`` header only; they are never logged, never in a
message, never in ``repr``.

An answer is judged before it is used: a 404 no registry route gives (HTML, or no ``error_code``), or
an answer that is not JSON, is checked against ``<url>/apis/ccompat/v7`` (the path Apicurio serves
the API under) so the message can say which URL to use; an answer without the field asked for is
named as malformed. Only ``errors``' public types leave this module.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.transport import Answer, exchange

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
DEFAULT_TIMEOUT_S = 10.0
# The Confluent API's error codes this client tells apart (its "error_code" field).
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
# Where Apicurio Registry serves the Confluent-compatible API: the usual missing piece of a URL.
CCOMPAT_PATH = "/apis/ccompat/v7"
_T = TypeVar("_T")


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to authenticate: HTTP basic (``username``/``password``) or a
    bearer token, and a CA file for a registry whose certificate a private CA signed."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.RegistryConfigError(f"registry URL {self.url!r} is not an http(s) URL with a host")
        if parts.username or parts.password:
            raise errors.RegistryConfigError(
                "the registry URL holds credentials; give them as the connection's login and password "
                "instead, so that they are never shown with the URL"
            )
        if self.bearer_token and (self.username or self.password):
            raise errors.RegistryConfigError("give either a login and password or a bearer token, not both")
        if bool(self.username) != bool(self.password) and not self.bearer_token:
            raise errors.RegistryConfigError("basic auth needs both a login and a password")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry knows it; ``subject``/``version`` are None when read by id."""

    id: int
    schema: str
    schema_type: str  # AVRO, JSON or PROTOBUF
    subject: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class Compatibility:
    """The registry's answer to "may this schema be the subject's next version?"."""

    compatible: bool
    level: str  # the subject's compatibility level, e.g. BACKWARD, or NONE
    messages: tuple[str, ...] = ()


class RegistryClient:
    """One registry, the handful of calls an export makes (``RegistryError`` subclasses on failure)."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._tls = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else None

    # -- the API --------------------------------------------------------------------------------
    def lookup(self, subject: str, schema: str, schema_type: str) -> RegisteredSchema | None:
        """The version of ``subject`` that holds ``schema``; None when the subject or the schema is not
        there (``subject_exists`` tells which)."""
        reply = self._call("POST", f"/subjects/{_q(subject)}", _schema_body(schema, schema_type), tolerate=(404,))
        if reply.missing:
            if reply.code in (SUBJECT_NOT_FOUND, SCHEMA_NOT_FOUND):
                return None
            raise reply.error()
        return self._read(reply, lambda body: _registered(body, schema_type))

    def subject_exists(self, subject: str) -> bool:
        reply = self._call("GET", f"/subjects/{_q(subject)}/versions", tolerate=(404,))
        return not reply.missing

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema | None:
        """``subject``'s schema at ``version`` (a number or ``"latest"``); None if either is missing."""
        reply = self._call("GET", f"/subjects/{_q(subject)}/versions/{_q(str(version))}", tolerate=(404,))
        return None if reply.missing else self._read(reply, lambda body: _registered(body, "AVRO"))

    def schema_by_id(self, schema_id: int) -> RegisteredSchema | None:
        reply = self._call("GET", f"/schemas/ids/{int(schema_id)}", tolerate=(404,))
        if reply.missing:
            return None
        return self._read(
            reply,
            lambda body: RegisteredSchema(int(schema_id), _text(body, "schema"), str(body.get("schemaType") or "AVRO")),
        )

    def compatibility(self, subject: str, schema: str, schema_type: str) -> Compatibility:
        """Whether ``schema`` may follow ``subject``'s latest version, and under which level."""
        level = self.compatibility_level(subject)
        reply = self._call(
            "POST",
            f"/compatibility/subjects/{_q(subject)}/versions/latest?verbose=true",
            _schema_body(schema, schema_type),
        )
        return self._read(
            reply,
            lambda body: Compatibility(
                _flag(body, "is_compatible"), level, tuple(str(m) for m in body.get("messages") or ())
            ),
        )

    def compatibility_level(self, subject: str | None = None) -> str:
        """``subject``'s compatibility level, else the registry's global one."""
        if subject is not None:
            reply = self._call("GET", f"/config/{_q(subject)}?defaultToGlobal=true", tolerate=(404,))
            if not reply.missing:
                return self._read(reply, _level)
        return self._read(self._call("GET", "/config"), _level)

    def set_compatibility_level(self, level: str, subject: str | None = None) -> None:
        path = f"/config/{_q(subject)}" if subject is not None else "/config"
        self._call("PUT", path, {"compatibility": level})

    def register(self, subject: str, schema: str, schema_type: str) -> int:
        """Register ``schema`` under ``subject`` (a no-op answer for a schema already there); its id.
        A 409 is ``IncompatibleSchemaError`` with the registry's words as its ``details``."""
        reply = self._call(
            "POST", f"/subjects/{_q(subject)}/versions", _schema_body(schema, schema_type), tolerate=(409,)
        )
        if reply.missing:
            raise errors.incompatible(subject, self._safe_level(subject), reply.detail)
        return self._read(reply, lambda body: int(body["id"]))

    def subjects(self) -> list[str]:
        return self._read(self._call("GET", "/subjects"), lambda body: [str(s) for s in _array(body)])

    # -- HTTP -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, payload: Any = None, tolerate: tuple[int, ...] = ()) -> _Reply:
        """The registry's JSON answer; a status in ``tolerate`` comes back as a ``missing`` reply, any
        other failure is raised as the public error that names it."""
        answer = self._send(method, self.settings.base_url + path, payload, self.settings.timeout_s)
        parsed, body = _json(answer.body)
        code, message = _error_fields(body, answer)
        if answer.status == 404 and code in (None, 404):  # no registry route answered
            raise self._off_the_api(method, answer)
        if answer.status >= 400:
            reply = _Reply(self, method, answer, None, code, message)
            if answer.status in tolerate:
                return reply
            raise reply.error()
        if not parsed:
            raise self._off_the_api(method, answer)
        return _Reply(self, method, answer, body, None, "")

    def _send(self, method: str, url: str, payload: Any, timeout_s: float) -> Answer:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", f"{CONTENT_TYPE}, application/json")
        if data is not None:
            request.add_header("Content-Type", CONTENT_TYPE)
        auth = self._authorization()
        if auth:
            request.add_unredirected_header("Authorization", auth)
        log.debug("schema registry: %s %s", method, url)
        return exchange(request, timeout_s, self._tls, self.settings.base_url)

    def _read(self, reply: _Reply, read: Callable[[Any], _T]) -> _T:
        """``read(body)``; a body without the field asked for, or of another shape, is malformed."""
        try:
            return read(reply.body)
        except KeyError as e:
            what = f"without its {e.args[0]!r} field"
        except (TypeError, ValueError, AttributeError):
            what = "of another shape than the one asked for"
        a = reply.answer
        first = errors.snippet(a.body, self._secrets())
        raise errors.malformed(self.settings.base_url, reply.method, a.url, a.status, a.content_type, first, what)

    def _off_the_api(self, method: str, answer: Answer) -> errors.RegistryAnswerError:
        """The error for an answer no registry route gives: the URL to use when ``<url>/apis/ccompat/v7``
        answers as a registry (asked within what is left of the request's timeout)."""
        base = self.settings.base_url
        left = self.settings.timeout_s - answer.elapsed_s
        fixed = base + CCOMPAT_PATH
        if not base.endswith(CCOMPAT_PATH) and left > 0.05 and self._answers_as_registry(fixed, left):
            return errors.wrong_base_path(base, method, answer.url, answer.status, answer.content_type, fixed)
        first = errors.snippet(answer.body, self._secrets())
        if answer.status == 404:
            return errors.not_a_registry(base, method, answer.url, answer.status, answer.content_type, first)
        what = "that is not JSON" if answer.body.strip() else "that is empty"
        return errors.malformed(base, method, answer.url, answer.status, answer.content_type, first, what)

    def _answers_as_registry(self, url: str, timeout_s: float) -> bool:
        try:
            answer = self._send("GET", url + "/subjects", None, timeout_s)
        except errors.RegistryError:
            return False
        parsed, body = _json(answer.body)
        return answer.status == 200 and parsed and isinstance(body, list)

    def _authorization(self) -> str | None:
        s = self.settings
        if s.bearer_token:
            return f"Bearer {s.bearer_token}"
        if s.username and s.password:
            return "Basic " + base64.b64encode(f"{s.username}:{s.password}".encode()).decode()
        return None

    def _secrets(self) -> tuple[str, ...]:
        s = self.settings
        return tuple(x for x in (s.password, s.bearer_token, self._authorization()) if x)

    def _safe_level(self, subject: str) -> str:
        try:
            return self.compatibility_level(subject)
        except errors.RegistryError:
            return "configured"


@dataclass(frozen=True)
class _Reply:
    """One answer of the registry: JSON ``body``, or ``missing`` (a tolerated 4xx) with the registry's
    ``error_code`` and message."""

    client: RegistryClient
    method: str
    answer: Answer
    body: Any
    code: int | None
    detail: str

    @property
    def missing(self) -> bool:
        return self.answer.status >= 400

    def error(self) -> errors.RegistryError:
        """The public error for this failed answer."""
        base, status = self.client.settings.base_url, self.answer.status
        if status in (401, 403):
            return errors.refused(base, status, self.detail)
        return errors.registry_answer(base, status, self.detail)


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _schema_body(schema: str, schema_type: str) -> dict[str, str]:
    # Confluent's API takes no schemaType for Avro (the default); some registries refuse it there.
    return {"schema": schema} if schema_type == "AVRO" else {"schema": schema, "schemaType": schema_type}


def _json(body: bytes) -> tuple[bool, Any]:
    """(whether ``body`` is JSON, its value); an empty body is an empty object (a PUT may answer so)."""
    try:
        text = body.decode()
        return True, json.loads(text) if text.strip() else {}
    except ValueError:  # UnicodeDecodeError is one
        return False, None


def _error_fields(body: Any, answer: Answer) -> tuple[int | None, str]:
    """The registry's ``error_code`` and ``message``; for a page that is not a registry's error, what
    it is and how it starts (never a secret: the caller's credentials are not in the URL)."""
    if isinstance(body, dict) and isinstance(body.get("error_code"), int):
        return int(body["error_code"]), str(body.get("message") or "")
    page = errors.snippet(answer.body, ())
    return None, f"a {answer.content_type or 'page'} answer: {page!r}" if page else f"HTTP {answer.status}"


def _registered(body: Any, default_type: str) -> RegisteredSchema:
    return RegisteredSchema(
        id=int(body["id"]),
        schema=_text(body, "schema"),
        schema_type=str(body.get("schemaType") or default_type),
        subject=str(body["subject"]) if body.get("subject") is not None else None,
        version=int(body["version"]) if body.get("version") is not None else None,
    )


def _text(body: Any, name: str) -> str:
    value = body[name]
    if not isinstance(value, str):
        raise TypeError(name)
    return value


def _flag(body: Any, name: str) -> bool:
    value = body[name]
    if not isinstance(value, bool):
        raise TypeError(name)
    return value


def _array(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise TypeError("an array")
    return body


def _level(body: Any) -> str:
    return str(body.get("compatibilityLevel") or body.get("compatibility") or "NONE")


__all__ = ["CCOMPAT_PATH", "Compatibility", "RegisteredSchema", "RegistryClient", "RegistrySettings"]
