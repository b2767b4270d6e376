"""A format's schema id, resolved once on the driver before any transaction opens.

The order of questions, and what each answer means:

1. ``version=`` given: the subject's schema at that version is read; a missing subject or version is
   an error (nothing is registered).
2. Otherwise the schema (given, or derived from the DataFrame) is looked up under the subject. Found:
   its id and version are used as they are.
3. Not found and ``auto_register=False``: an error naming the subject.
4. Not found and registration allowed: when the subject has versions, the registry's compatibility
   answer is asked and logged, and an incompatible schema is an error; then the schema is registered.

Each step's answer is logged, so the task log says which schema id the records carry and why.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.client import RegistryClient
from airflow_provider_kafka2pc.registry.formats import RegistryFormat, SubjectStrategy, subject_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedSchema:
    """The schema a column is encoded with, and the id its records' header carries."""

    role: str  # key or value
    subject: str
    id: int
    version: int | None
    schema: str
    schema_type: str
    answer: str  # what the registry said, as logged


def record_name(schema: str, schema_type: str) -> str | None:
    """The schema's full record name: Avro's ``namespace.name``, JSON Schema's ``title``."""
    try:
        parsed = json.loads(schema)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    if schema_type == "JSON":
        title = parsed.get("title")
        return str(title) if title else None
    name = parsed.get("name")
    if not name:
        return None
    namespace = parsed.get("namespace")
    return str(name) if "." in str(name) or not namespace else f"{namespace}.{name}"


def resolve(
    client: RegistryClient, fmt: RegistryFormat, role: str, topic: str | None, derived: str | None
) -> ResolvedSchema:
    """The schema id for ``fmt`` on ``role`` (see the module's doc); ``derived`` is the schema made from
    the DataFrame's column, used when the format gives neither ``schema`` nor ``version``."""
    kind = fmt.schema_type
    text = fmt.schema if fmt.schema is not None else derived
    subject = fmt.subject or subject_name(
        fmt.subject_strategy,
        topic,
        role,
        record_name(text, kind) if text and fmt.subject_strategy is not SubjectStrategy.TOPIC else None,
    )
    if fmt.version is not None:
        found = client.version(subject, fmt.version)
        if found is None:
            raise errors.subject_missing(subject, str(fmt.version))
        if found.schema_type != kind:
            raise errors.registry_answer(
                client.settings.base_url, 200, f"subject {subject!r} holds a {found.schema_type} schema, not {kind}"
            )
        answer = f"using the registered version {found.version} (id {found.id}); nothing registered"
        return _said(ResolvedSchema(role, subject, found.id, found.version, found.schema, kind, answer))
    if text is None:
        raise ValueError(f"{type(fmt).__name__} for the {role}: no schema given and none derived")
    found = client.lookup(subject, text, kind)
    if found is not None:
        answer = f"already registered as version {found.version} (id {found.id})"
        return _said(ResolvedSchema(role, subject, found.id, found.version, text, kind, answer))
    if not fmt.auto_register:
        raise (
            errors.schema_not_registered(subject)
            if client.subject_exists(subject)
            else errors.subject_missing(subject, None)
        )
    if client.subject_exists(subject):
        compat = client.compatibility(subject, text, kind)
        said = f"compatibility with the latest version under {compat.level}: " + (
            "compatible" if compat.compatible else "INCOMPATIBLE"
        )
        log.info("schema registry: subject %r: %s", subject, said)
        if not compat.compatible:
            raise errors.incompatible(subject, compat.level, "; ".join(compat.messages))
    else:
        said = "a new subject (no earlier version to be compatible with)"
    schema_id = client.register(subject, text, kind)
    registered = client.lookup(subject, text, kind)
    version = registered.version if registered is not None else None
    answer = f"{said}; registered as version {version} (id {schema_id})"
    return _said(ResolvedSchema(role, subject, schema_id, version, text, kind, answer))


def _said(resolved: ResolvedSchema) -> ResolvedSchema:
    log.info(
        "schema registry: the %s is %s under subject %r: %s",
        resolved.role,
        resolved.schema_type,
        resolved.subject,
        resolved.answer,
    )
    return resolved


__all__ = ["ResolvedSchema", "record_name", "resolve"]
