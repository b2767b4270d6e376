"""A small client of the Confluent-compatible schema registry REST API (Confluent Schema Registry,
Apicurio Registry's ``/apis/ccompat/v7``, Karapace, Redpanda).

Only what a driver needs once per export: look a schema up under a subject, read a subject's version
or a schema by id, ask the compatibility of a schema, register one. Standard library HTTP (``urllib``):
one request per question on the driver, nothing per record. Credentials travel in the
``Authorization`` header only; they are never logged, never in a message, never in ``repr``.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kafka2pc.registry import errors

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
DEFAULT_TIMEOUT_S = 10.0
# The Confluent API's error codes this client tells apart (its "error_code" field).
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403


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
        context = ssl.create_default_context(cafile=settings.ca_file) if settings.ca_file else None
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    # -- the API --------------------------------------------------------------------------------
    def lookup(self, subject: str, schema: str, schema_type: str) -> RegisteredSchema | None:
        """The version of ``subject`` that holds ``schema``; None when the subject or the schema is not
        there (``subject_exists`` tells which)."""
        try:
            body = self._call("POST", f"/subjects/{_q(subject)}", _schema_body(schema, schema_type))
        except _NotFound as e:
            if e.code in (SUBJECT_NOT_FOUND, SCHEMA_NOT_FOUND, None):
                return None
            raise
        return _registered(body, schema_type)

    def subject_exists(self, subject: str) -> bool:
        try:
            self._call("GET", f"/subjects/{_q(subject)}/versions")
        except _NotFound:
            return False
        return True

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema | None:
        """``subject``'s schema at ``version`` (a number or ``"latest"``); None if either is missing."""
        try:
            body = self._call("GET", f"/subjects/{_q(subject)}/versions/{_q(str(version))}")
        except _NotFound:
            return None
        return _registered(body, "AVRO")

    def schema_by_id(self, schema_id: int) -> RegisteredSchema | None:
        try:
            body = self._call("GET", f"/schemas/ids/{int(schema_id)}")
        except _NotFound:
            return None
        return RegisteredSchema(int(schema_id), str(body["schema"]), str(body.get("schemaType") or "AVRO"))

    def compatibility(self, subject: str, schema: str, schema_type: str) -> Compatibility:
        """Whether ``schema`` may follow ``subject``'s latest version, and under which level."""
        level = self.compatibility_level(subject)
        body = self._call(
            "POST",
            f"/compatibility/subjects/{_q(subject)}/versions/latest?verbose=true",
            _schema_body(schema, schema_type),
        )
        messages = tuple(str(m) for m in body.get("messages") or ())
        return Compatibility(bool(body.get("is_compatible")), level, messages)

    def compatibility_level(self, subject: str | None = None) -> str:
        """``subject``'s compatibility level, else the registry's global one."""
        if subject is not None:
            try:
                return _level(self._call("GET", f"/config/{_q(subject)}?defaultToGlobal=true"))
            except _NotFound:
                pass
        return _level(self._call("GET", "/config"))

    def set_compatibility_level(self, level: str, subject: str | None = None) -> None:
        path = f"/config/{_q(subject)}" if subject is not None else "/config"
        self._call("PUT", path, {"compatibility": level})

    def register(self, subject: str, schema: str, schema_type: str) -> int:
        """Register ``schema`` under ``subject`` (a no-op answer for a schema already there); its id."""
        try:
            body = self._call("POST", f"/subjects/{_q(subject)}/versions", _schema_body(schema, schema_type))
        except _Conflict as e:
            raise errors.incompatible(subject, self._safe_level(subject), e.detail) from None
        return int(body["id"])

    def subjects(self) -> list[str]:
        return [str(s) for s in self._call("GET", "/subjects")]

    # -- HTTP -----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        url = self.settings.base_url + path
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", f"{CONTENT_TYPE}, application/json")
        if data is not None:
            request.add_header("Content-Type", CONTENT_TYPE)
        auth = self._authorization()
        if auth:
            request.add_unredirected_header("Authorization", auth)
        log.debug("schema registry: %s %s", method, url)
        try:
            with self._opener.open(request, timeout=self.settings.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            raise self._http_error(e) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise errors.unreachable(self.settings.base_url, f"{type(reason).__name__}: {reason}") from None
        return json.loads(text) if text.strip() else {}

    def _authorization(self) -> str | None:
        s = self.settings
        if s.bearer_token:
            return f"Bearer {s.bearer_token}"
        if s.username and s.password:
            return "Basic " + base64.b64encode(f"{s.username}:{s.password}".encode()).decode()
        return None

    def _http_error(self, e: urllib.error.HTTPError) -> Exception:
        code, message = _error_body(e)
        if e.code in (401, 403):
            return errors.refused(self.settings.base_url, e.code, message)
        if e.code == 404:
            return _NotFound(self.settings.base_url, e.code, code, message)
        if e.code == 409:
            return _Conflict(self.settings.base_url, e.code, code, message)
        return errors.registry_answer(self.settings.base_url, e.code, message)

    def _safe_level(self, subject: str) -> str:
        try:
            return self.compatibility_level(subject)
        except errors.RegistryError:
            return "configured"


class _NotFound(errors.RegistryError):
    """A 404 the calling method answers (None, or its own error); any other caller sees the registry's words."""

    def __init__(self, url: str, status: int, code: int | None, detail: str) -> None:
        super().__init__(str(errors.registry_answer(url, status, detail)))
        self.code, self.detail = code, detail


class _Conflict(_NotFound):
    pass


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _schema_body(schema: str, schema_type: str) -> dict[str, str]:
    # Confluent's API takes no schemaType for Avro (the default); some registries refuse it there.
    return {"schema": schema} if schema_type == "AVRO" else {"schema": schema, "schemaType": schema_type}


def _registered(body: Any, default_type: str) -> RegisteredSchema:
    return RegisteredSchema(
        id=int(body["id"]),
        schema=str(body["schema"]),
        schema_type=str(body.get("schemaType") or default_type),
        subject=str(body["subject"]) if body.get("subject") is not None else None,
        version=int(body["version"]) if body.get("version") is not None else None,
    )


def _level(body: Any) -> str:
    return str(body.get("compatibilityLevel") or body.get("compatibility") or "NONE")


def _error_body(e: urllib.error.HTTPError) -> tuple[int | None, str]:
    """The registry's ``error_code`` and ``message``; the reason phrase when the body is not JSON."""
    try:
        body = json.loads(e.read().decode() or "{}")
    except (ValueError, OSError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    code = body.get("error_code")
    return (int(code) if isinstance(code, int) else None), str(body.get("message") or e.reason)


__all__ = ["Compatibility", "RegisteredSchema", "RegistryClient", "RegistrySettings"]
