"""Who the client is and what it may do: the principal a connection authenticates as, and ACL
failures that name their cause.

A transactional producer turns a broker's rejection into ``_PURGE_QUEUE`` for every queued record;
``check_topic_access`` reads the operations the broker says this principal may perform (Metadata's
authorized operations), so a missing ACL is named before anything is written. Refused logins and
certificates, and brokers that cannot be reached, are ``reachability.check_connection``'s, the one
call to make before a command's first client. The ACLs an exporter needs are listed in
``docs/acls.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.client_logs import with_log
from airflow_provider_kafka2pc.txn.kafka.config import connection_only
from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

# Kafka error names -> the resource type whose ACL refused (KafkaError names in both clients).
_AUTHORIZATION_ERRORS = {
    "TOPIC_AUTHORIZATION_FAILED": "Topic",
    "GROUP_AUTHORIZATION_FAILED": "Group",
    "CLUSTER_AUTHORIZATION_FAILED": "Cluster",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "TransactionalId",
}


# What the decision topic needs from the exporter's principal (docs/acls.md), in the order named
# when the broker lets the principal see nothing of it.
DECISION_TOPIC_OPERATIONS = ("READ", "WRITE", "DESCRIBE_CONFIGS")


def principal_of(config: Mapping[str, Any]) -> str:
    """The Kafka principal the config authenticates as, as ACLs name it (best effort, no secrets).

    As the broker's default principal builder names it; a broker with ``ssl.principal.mapping.rules``
    or Kerberos ``principal.to.local`` rules of its own maps it further."""
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.startswith("SASL"):
        mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI").upper()
        if mechanism == "OAUTHBEARER":
            return f"User:{config.get('sasl.oauthbearer.client.id') or '<token subject>'}"
        if mechanism == "GSSAPI":
            # librdkafka's default client principal; the broker's default rule keeps its first component.
            kerberos = str(config.get("sasl.kerberos.principal") or "kafkaclient")
            return f"User:{re.split(r'[/@]', kerberos, maxsplit=1)[0]}"
        return f"User:{config.get('sasl.username') or '<none>'}"
    if protocol == "SSL":
        return f"User:{certificate_subject(config)}"
    return "User:ANONYMOUS"


def certificate_subject(config: Mapping[str, Any]) -> str:
    """The subject of the client certificate, as Kafka names an SSL principal (RFC 2253, most specific
    first: ``CN=exporter,OU=data,O=Acme``); ANONYMOUS without a client certificate (one-way TLS)."""
    pem, location = config.get("ssl.certificate.pem"), config.get("ssl.certificate.location")
    keystore = config.get("ssl.keystore.location")
    if not (pem or location or keystore):
        return "ANONYMOUS"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import pkcs12

        if pem or location:
            data = str(pem).encode() if pem else Path(str(location)).read_bytes()
            cert = x509.load_pem_x509_certificate(data)
        else:
            password = config.get("ssl.keystore.password")
            bundle = pkcs12.load_pkcs12(Path(str(keystore)).read_bytes(), str(password).encode() if password else None)
            if bundle.cert is None:
                raise ValueError("no certificate in the keystore")
            cert = bundle.cert.certificate
        return cert.subject.rfc4514_string()
    except (ImportError, OSError, ValueError, TypeError):
        return f"<the subject of the client certificate in {location or keystore or 'ssl.certificate.pem'}>"


def describe_identity(config: Mapping[str, Any]) -> str:
    """'SASL SCRAM-SHA-512 as User:x over SASL_SSL': which mechanism and principal, never the secret."""
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol.startswith("SASL"):
        mechanism = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "GSSAPI").upper()
        return f"SASL {mechanism} as {principal_of(config)} over {protocol}"
    return f"{protocol} as {principal_of(config)}"


def check_topic_access(config: Mapping[str, Any], needs: Mapping[str, Sequence[str]], timeout_s: float = 30.0) -> None:
    """Raise ``KafkaAuthorizationError`` unless the principal may perform ``needs[topic]`` on each topic.

    Operations are Kafka's names (``WRITE``, ``READ``, ``DESCRIBE_CONFIGS``, ...). A topic the
    principal may not even describe looks missing to it; that is reported as the missing ACL too
    (callers check existence with an admin-free listing first when they need to tell them apart).
    """
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    if not needs:
        return
    principal = principal_of(config)
    admin = AdminClient(with_log(connection_only(config)))
    futures = admin.describe_topics(
        TopicCollection(list(needs)), request_timeout=timeout_s, include_authorized_operations=True
    )
    for topic, future in futures.items():
        try:
            description = future.result()
        except KafkaException as e:
            name = e.args[0].name()
            if name in ("TOPIC_AUTHORIZATION_FAILED", "UNKNOWN_TOPIC_OR_PART"):
                raise KafkaAuthorizationError(
                    principal,
                    "Topic",
                    topic,
                    _operation_name(needs[topic][0]),
                    detail=f"the broker said {name}",
                    bootstrap=_bootstrap(config),
                ) from e
            raise
        if description.authorized_operations is None:
            continue  # the broker did not say (an old broker): the operations themselves will tell
        allowed = {op.name for op in description.authorized_operations}
        for op in needs[topic]:
            if op not in allowed:
                raise KafkaAuthorizationError(
                    principal, "Topic", topic, _operation_name(op), bootstrap=_bootstrap(config)
                )


def check_decision_topic_access(config: Mapping[str, Any], topic: str, timeout_s: float = 30.0) -> bool:
    """Raise ``KafkaAuthorizationError`` unless the principal may Read, Write and DescribeConfigs the
    decision topic (docs/acls.md); True when it exists, False when it does not (yet: the decision
    log creates it, and a missing Create is named then).

    One DescribeTopicPartitions request with the authorized operations. A topic the principal may
    not even describe looks the same whether it exists or not: that is reported as the first
    missing operation (Read), since the documented ACLs all imply Describe.
    """
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(with_log(connection_only(config)))
    [future] = admin.describe_topics(
        TopicCollection([topic]), request_timeout=timeout_s, include_authorized_operations=True
    ).values()
    try:
        description = future.result()
    except KafkaException as e:
        name = e.args[0].name()
        if name == "UNKNOWN_TOPIC_OR_PART":
            return False
        if name == "TOPIC_AUTHORIZATION_FAILED":
            raise KafkaAuthorizationError(
                principal_of(config),
                "Topic",
                topic,
                _operation_name(DECISION_TOPIC_OPERATIONS[0]),
                detail=f"the broker said {name} for the decision topic",
                bootstrap=_bootstrap(config),
            ) from e
        raise BrokerUnavailableError(
            f"cannot describe the decision topic {topic!r} at {config.get('bootstrap.servers')}: {e}"
        ) from e
    if description.authorized_operations is not None:
        allowed = {op.name for op in description.authorized_operations}
        for op in DECISION_TOPIC_OPERATIONS:
            if op not in allowed:
                raise KafkaAuthorizationError(
                    principal_of(config),
                    "Topic",
                    topic,
                    _operation_name(op),
                    detail="the decision topic",
                    bootstrap=_bootstrap(config),
                )
    return True


def _operation_name(op: str) -> str:
    """WRITE -> Write, DESCRIBE_CONFIGS -> DescribeConfigs: how kafka-acls spells it."""
    return "".join(part.capitalize() for part in op.split("_"))


def authorization_error_of(
    error_name: str, config: Mapping[str, Any], resource: str, operation: str, pattern: str = "LITERAL"
) -> KafkaAuthorizationError | None:
    """The named error for a Kafka ``*_AUTHORIZATION_FAILED`` code, or None for any other code."""
    resource_type = _AUTHORIZATION_ERRORS.get(error_name)
    if resource_type is None:
        return None
    if resource_type == "Cluster":
        resource = "kafka-cluster"
    return KafkaAuthorizationError(
        principal_of(config), resource_type, resource, operation, pattern, bootstrap=_bootstrap(config)
    )


def _bootstrap(config: Mapping[str, Any]) -> str:
    return str(config.get("bootstrap.servers", ""))


def topic_config_value(config: Mapping[str, Any], topic: str, key: str, timeout_s: float = 10.0) -> str | None:
    """One setting of a topic, or None when it cannot be read (no DescribeConfigs ACL, broker gone)."""
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    try:
        admin = AdminClient(with_log(connection_only(config)))
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout=timeout_s)
        entry = entries.get(key)
        return None if entry is None else str(entry.value)
    except Exception:  # only used to enrich an error message
        return None
