"""A format's schema id, resolved once on the driver before any transaction opens.

The order of questions, and what each answer means:

1. ``version=`` given: the subject's schema at that version is read; a missing subject or version is
   an error (nothing is registered).
2. Otherwise the schema (given, or derived from the DataFrame) has its Avro names checked here first
   (a name Avro forbids, a record name defined twice: named with the column and the fix, where a
   registry would answer with a 422 of its own words), then is looked up under the subject. Found:
   its id and version are used as they are.
3. Not found and ``auto_register=False``: an error naming the subject.
4. Not found and registration allowed: when the subject has versions, the registry's compatibility
   answer is asked and logged, and an incompatible schema is an error; then the schema is registered.
   A refusal names the field: from the registry's words when they name one (Confluent's verbose
   compatibility answer, a 409 on registration), else from comparing the new Avro schema with the
   latest version here (``registry/avro_compat.py``; Apicurio's compatibility answer says no more
   than "incompatible").

Each step's answer is logged, so the task log says which schema id the records carry and why.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from airflow_provider_kafka2pc.registry import avro_compat, avro_names, errors
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
    if kind == "AVRO":
        _check_names(text, role, subject, given=fmt.schema is not None)
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
            reasons = _reasons(client, role, subject, text, kind, compat.level, "; ".join(compat.messages))
            raise errors.incompatible(subject, compat.level, reasons)
    else:
        said = "a new subject (no earlier version to be compatible with)"
    try:
        schema_id = client.register(subject, text, kind)
    except errors.IncompatibleSchemaError as e:  # a 409: the registry's words, and the field if they lack it
        level = client.compatibility_level(subject)
        raise errors.incompatible(
            subject, level, _reasons(client, role, subject, text, kind, level, e.details)
        ) from None
    registered = client.lookup(subject, text, kind)
    version = registered.version if registered is not None else None
    answer = f"{said}; registered as version {version} (id {schema_id})"
    return _said(ResolvedSchema(role, subject, schema_id, version, text, kind, answer))


def _check_names(text: str, role: str, subject: str, given: bool) -> None:
    try:
        schema = json.loads(text)
    except ValueError:  # a bare type name ("string") has no names; other text is the registry's to refuse
        return
    problems = avro_names.problems(schema, role)
    if problems:
        raise errors.bad_names(role, subject, problems, given)


def _reasons(
    client: RegistryClient, role: str, subject: str, text: str, kind: str, level: str, registry_said: str
) -> str:
    """Why the schema cannot follow the latest version: the registry's words when they name a field
    (Confluent's do: "... at path '/fields/3' ..."), else a comparison with the latest version."""
    latest = client.version(subject, "latest")
    if kind != "AVRO" or latest is None or latest.schema_type != "AVRO":
        return registry_said
    try:
        new, old = json.loads(text), json.loads(latest.schema)
    except ValueError:
        return registry_said
    found = avro_compat.differences(old, new, level, role)
    if registry_said and (not found or all(_leaf(d.path) in registry_said for d in found)):
        return registry_said
    return errors.compared(latest.version, found, registry_said)


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]


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
