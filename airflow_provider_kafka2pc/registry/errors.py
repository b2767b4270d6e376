"""The registry layer's exceptions and their sentences, in one place: each names the cause and the fix.

Every one is raised on the driver before any transaction opens, so each message can say that
nothing was written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.registry.avro_compat import Difference
    from airflow_provider_kafka2pc.registry.avro_names import NameProblem

NOTHING_WRITTEN = "no transaction was opened and nothing was written"


class RegistryError(Kafka2PCError):
    """A schema registry answered with an error, or a format cannot be resolved against it."""


class RegistryConfigError(RegistryError, ValueError):
    """The registry settings themselves are wrong (a URL with credentials in it, two kinds of auth)."""


class RegistryUnreachableError(RegistryError):
    """The registry did not answer: refused, unresolved, timed out, or a TLS failure."""


class RegistryAnswerError(RegistryError):
    """The URL answered, but not as a Confluent-compatible registry: a wrong base path, a proxy's
    page, an answer that is not JSON or lacks the field asked for."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (401) or the principal's rights (403)."""


class SubjectNotFoundError(RegistryError):
    """The subject (or its version) does not exist and registration is not allowed."""


class IncompatibleSchemaError(RegistryError):
    """The registry's compatibility check refused the schema; ``details`` is the reason given."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class SchemaMismatchError(RegistryError, ValueError):
    """The DataFrame's column does not fit the schema it is to be encoded with."""


def unreachable(url: str, reason: str) -> RegistryUnreachableError:
    return RegistryUnreachableError(
        f"cannot reach the schema registry at {url}: {reason}; {NOTHING_WRITTEN}. Check the registry "
        "connection's URL and CA, and that the registry runs and is reachable from the task"
    )


def refused(url: str, status: int, message: str) -> RegistryAuthError:
    what = "refused the credentials" if status == 401 else "denied this principal the request"
    return RegistryAuthError(
        f"the schema registry at {url} {what} (HTTP {status}: {message}); {NOTHING_WRITTEN}. Fix the "
        "registry connection's login and password or bearer token, or grant the principal read (and, "
        "to register, write) access to the subject"
    )


def subject_missing(subject: str, version: str | None) -> SubjectNotFoundError:
    if version is not None:
        return SubjectNotFoundError(
            f"subject {subject!r} has no version {version} in the schema registry; {NOTHING_WRITTEN}. "
            "Register the schema under that subject first, or name a version the subject has"
        )
    return SubjectNotFoundError(
        f"subject {subject!r} does not exist in the schema registry and registration is forbidden "
        f"(auto_register=False); {NOTHING_WRITTEN}. Register the schema under {subject!r} first (your "
        "registry's owners may have to), or allow registration with auto_register=True"
    )


def schema_not_registered(subject: str) -> SubjectNotFoundError:
    return SubjectNotFoundError(
        f"the schema is not registered under subject {subject!r} and registration is forbidden "
        f"(auto_register=False); {NOTHING_WRITTEN}. Register this schema under {subject!r} first, "
        "encode with a version the subject has (version='latest' or a number), or allow registration"
    )


def incompatible(subject: str, level: str, details: str) -> IncompatibleSchemaError:
    said = f": {details}" if details else ""
    return IncompatibleSchemaError(
        f"the schema is incompatible with the latest version of subject {subject!r} under the registry's "
        f"{level} compatibility{said}; {NOTHING_WRITTEN}. Change the DataFrame (or the given schema) so that "
        "it evolves compatibly (e.g. add fields with defaults, do not remove or retype fields), or have the "
        "subject's compatibility level changed",
        details,
    )


def compared(version: int | None, differences: list[Difference], registry_said: str) -> str:
    """The reasons found by comparing the new schema with the latest version, after the registry's
    own words (when they name no field)."""
    said = f"the registry said {registry_said!r}; " if registry_said else "the registry gave no reason; "
    latest = f"version {version}" if version is not None else "the latest version"
    if not differences:
        return (
            f"{said}compared with {latest} here, none of the common causes (a field added or removed without "
            "a default, a field's type changed) was found"
        )
    return f"{said}compared with {latest}: " + "; ".join(_difference(d) for d in differences)


def _difference(d: Difference) -> str:
    if d.what == "added":
        return (
            f"field {d.path!r} is new and has no default, so records written with the latest version cannot "
            "be read with the new schema: give it a default (a derived field has default null when its column "
            "may hold nulls)"
        )
    if d.what == "removed":
        return (
            f"field {d.path!r} is gone, and the latest version gives it no default, so its readers cannot read "
            "the new records: keep the field"
        )
    return (
        f"field {d.path!r} changes type from {d.old} to {d.new}, which one side cannot read: keep {d.old} "
        "(Avro reads int as long, float or double, long as float or double, float as double, string and "
        "bytes as each other)"
    )


def bad_names(role: str, subject: str, problems: list[NameProblem], given: bool) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"the {role} schema for subject {subject!r} has names Avro does not allow, so no registry or "
        f"spark-avro would take it; {NOTHING_WRITTEN}: " + "; ".join(_name_problem(p, given) for p in problems)
    )


def _name_problem(p: NameProblem, given: bool) -> str:
    from airflow_provider_kafka2pc.registry.avro_names import suggested

    if p.what == "redefined":
        rename = (
            "rename one of them in the schema"
            if given
            else f"rename one of the columns with an alias (e.g. F.col('{_leaf(p.path)}').alias("
            f"'{_leaf(p.path)}_2')), or give the schema"
        )
        return (
            f"fields {p.first!r} and {p.path!r} are both the Avro type {p.name!r}, and a schema defines a name "
            f"once (a derived schema names a struct's record after its path): {rename}"
        )
    if p.what == "duplicate":
        return f"field {p.path!r} appears twice in its record: rename one of them"
    rule = "letters, digits and _, not starting with a digit"
    if p.what == "namespace":
        return f"{p.path!r}: the namespace {p.name!r} is not dot-separated Avro names ({rule}): fix it in record_name="
    fix = suggested(p.name)
    if p.what == "field" and not given:
        how = f"rename the column with an alias, e.g. F.col('`{p.name}`').alias('{fix}')"
    elif p.what in ("record", "enum", "fixed") and not given:
        how = f"give the format a valid record_name=, e.g. {fix!r}"
    else:
        how = f"rename it in the schema (and the column) to a valid name, e.g. {fix!r}"
    return f"{p.what} {p.path!r}: {p.name!r} is not a valid Avro name ({rule}): {how}"


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]


def snippet(body: bytes, secrets: tuple[str, ...]) -> str:
    """The first bytes of an answer, one line, without any of ``secrets`` (a page may echo them)."""
    text = " ".join(body[:400].decode("utf-8", "replace").split())[:160]
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def timed_out(url: str, method: str, full_url: str, timeout_s: float) -> RegistryUnreachableError:
    return RegistryUnreachableError(
        f"the schema registry at {url} did not answer {method} {_path(url, full_url)} within the registry "
        f"connection's timeout of {timeout_s:g} s (connect, headers and body together); {NOTHING_WRITTEN}. "
        "Check that the registry, or a proxy in front of it, is healthy and answers promptly from the task's "
        "host, or raise the connection's Timeout (s)"
    )


_CHECK_URL = (
    "Check that the registry connection's URL is the registry's Confluent-compatible API (Confluent, "
    "Karapace, Redpanda: https://host:port; Apicurio Registry: https://host/apis/ccompat/v7) and that no "
    "proxy answers in the registry's place (a login page: the proxy wants credentials of its own)"
)


def malformed(
    url: str, method: str, full_url: str, status: int, content_type: str, first: str, what: str
) -> RegistryAnswerError:
    return RegistryAnswerError(
        f"the schema registry at {url} answered {method} {_path(url, full_url)} with HTTP {status} "
        f"({content_type or 'no content type'}) {what}, not a Confluent-compatible registry's answer "
        f"(first bytes: {first!r}); {NOTHING_WRITTEN}. {_CHECK_URL}"
    )


def wrong_base_path(
    url: str, method: str, full_url: str, status: int, content_type: str, fixed: str
) -> RegistryAnswerError:
    return RegistryAnswerError(
        f"the schema registry URL {url} is not its Confluent-compatible API: {method} {_path(url, full_url)} "
        f"answered HTTP {status} ({content_type or 'no content type'}), while {fixed}/subjects answers as a "
        f"registry; {NOTHING_WRITTEN}. Use {fixed} as the registry connection's URL (Apicurio Registry serves "
        "the Confluent-compatible API under /apis/ccompat/v7)"
    )


def not_a_registry(
    url: str, method: str, full_url: str, status: int, content_type: str, first: str
) -> RegistryAnswerError:
    return RegistryAnswerError(
        f"the URL {url} does not look like a Confluent-compatible schema registry: {method} "
        f"{_path(url, full_url)} answered HTTP {status} ({content_type or 'no content type'}; first bytes: "
        f"{first!r}), which no registry route answers; {NOTHING_WRITTEN}. {_CHECK_URL}"
    )


def _path(url: str, full_url: str) -> str:
    return full_url.removeprefix(url) or "/"


def registry_answer(url: str, status: int, message: str) -> RegistryError:
    return RegistryError(f"the schema registry at {url} answered HTTP {status}: {message}; {NOTHING_WRITTEN}")


def mismatch(role: str, subject: str, problems: list[str]) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"the DataFrame's {role!r} column does not fit the schema of subject {subject!r}; {NOTHING_WRITTEN}: "
        + "; ".join(problems)
    )


__all__ = [
    "NOTHING_WRITTEN",
    "IncompatibleSchemaError",
    "RegistryAnswerError",
    "RegistryAuthError",
    "RegistryConfigError",
    "RegistryError",
    "RegistryUnreachableError",
    "SchemaMismatchError",
    "SubjectNotFoundError",
]
