"""The registry layer's exceptions and their sentences, in one place: each names the cause and the fix.

Every one is raised on the driver before any transaction opens, so each message can say that
nothing was written.
"""

from __future__ import annotations

from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

NOTHING_WRITTEN = "no transaction was opened and nothing was written"


class RegistryError(Kafka2PCError):
    """A schema registry answered with an error, or a format cannot be resolved against it."""


class RegistryConfigError(RegistryError, ValueError):
    """The registry settings themselves are wrong (a URL with credentials in it, two kinds of auth)."""


class RegistryUnreachableError(RegistryError):
    """The registry did not answer: refused, unresolved, timed out, or a TLS failure."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (401) or the principal's rights (403)."""


class SubjectNotFoundError(RegistryError):
    """The subject (or its version) does not exist and registration is not allowed."""


class IncompatibleSchemaError(RegistryError):
    """The registry's compatibility check refused the schema."""


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
        "subject's compatibility level changed"
    )


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
    "RegistryAuthError",
    "RegistryConfigError",
    "RegistryError",
    "RegistryUnreachableError",
    "SchemaMismatchError",
    "SubjectNotFoundError",
]
