"""The Kafka clients' exceptions, in one place: authentication, TLS and authorization (with the
``kafka-acls`` command that grants what is missing), client settings, the coordinator's retriable
answers, librdkafka through ctypes, and the decision topic.
"""

from __future__ import annotations

import shlex

from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, CoordinatorError, Kafka2PCError

_RESOURCE_FLAGS = {
    "Topic": "--topic",
    "Group": "--group",
    "TransactionalId": "--transactional-id",
    "Cluster": "--cluster",
}


def acl_command(
    principal: str, resource_type: str, resource: str, operation: str, pattern: str = "LITERAL", *, bootstrap: str
) -> str:
    """The ``kafka-acls`` command that grants one ACL (docs/acls.md has the full set), ready to paste
    for the cluster at ``bootstrap``, run with an administrator's client settings (admin.properties)."""
    flag = _RESOURCE_FLAGS[resource_type]
    # Quoted for the shell where needed: a certificate's subject may hold spaces ("O=Acme Corp").
    target = flag if resource_type == "Cluster" else f"{flag} {shlex.quote(resource)}"
    if pattern == "PREFIXED":
        target += " --resource-pattern-type prefixed"
    return (
        f"kafka-acls --bootstrap-server {shlex.quote(bootstrap)} --command-config admin.properties --add "
        f"--allow-principal {shlex.quote(principal)} --operation {operation} {target}"
    )


class KafkaAuthenticationError(Kafka2PCError):
    """The broker refused the client's credentials (never shows them)."""


class KafkaTlsError(KafkaAuthenticationError):
    """The TLS handshake failed for a reason no retry cures: the broker's certificate could not be
    verified (wrong or missing ``ssl.ca.location``), or the broker refused the client's certificate."""


class KafkaAuthorizationError(Kafka2PCError):
    """The principal lacks an ACL; the message names the resource, the operation and the fix."""

    def __init__(
        self,
        principal: str,
        resource_type: str,
        resource: str,
        operation: str,
        pattern: str = "LITERAL",
        detail: str = "",
        *,
        bootstrap: str,
    ) -> None:
        self.principal, self.resource_type, self.resource = principal, resource_type, resource
        self.operation, self.pattern, self.bootstrap = operation, pattern, bootstrap
        super().__init__(
            f"authorization failed: principal {principal} may not {operation} {resource_type} "
            f"{resource!r}{' (prefix)' if pattern == 'PREFIXED' else ''}{f' ({detail})' if detail else ''}. "
            f"Grant it: {acl_command(principal, resource_type, resource, operation, pattern, bootstrap=bootstrap)}"
        )


class ClientConfigError(ValueError):
    """A configuration mistake in the client settings, found before Kafka is contacted: report it as
    one (the CLI's exit 2), never as "Kafka unreachable"."""


class UnmappableConfigError(ClientConfigError):
    """A librdkafka connection setting the commit side's client (kafka-python) cannot honour."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"connection setting {key!r}: {why}")
        self.key = key


class BrokerErrorResponse(Exception):
    """A broker answered a whole request with an error code; what the code means is for the caller
    (``outcome.RETRIABLE``), not for the wire adapter that met it."""

    def __init__(self, request: str, code: int, name: str) -> None:
        super().__init__(f"{request}: {name}")
        self.request, self.code, self.name = request, code, name


class RetriableCoordinatorError(CoordinatorError):
    def __init__(self, code: int, what: str, name: str) -> None:
        super().__init__(f"{what}: {name}")
        self.code = code


class LibraryUnavailableError(Exception):
    """librdkafka cannot be used through ctypes here; the reason says why."""


class DecisionLogError(Kafka2PCError):
    pass


class UnsafeDecisionTopicError(DecisionLogError):
    """The decision topic exists with settings that could lose or reorder decisions."""


class DecisionLogUnavailableError(DecisionLogError, BrokerUnavailableError):
    """The decision topic (its partition's leader, or every broker) stayed unavailable for a read's or
    an append's whole budget (``DecisionLog.budget_s``); the message names the topic, the partition,
    the last error, what the call did or did not write, and what to do."""


def error_name(code: int) -> str:
    import kafka.errors as Errors

    return str(Errors.for_code(code).__name__) if code else "NONE"


def is_connection_error(exc: BaseException) -> bool:
    """Network-level failures (broker restarting, connection reset) that a retry may cure."""
    import kafka.errors as Errors

    return isinstance(
        exc,
        (
            Errors.KafkaConnectionError,
            Errors.Cancelled,  # a request whose connection closed before its answer
            Errors.NodeNotReadyError,
            Errors.KafkaTimeoutError,
            Errors.RequestTimedOutError,
            ConnectionError,
            OSError,
        ),
    )
