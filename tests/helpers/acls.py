"""ACLs of one principal on the secured local broker, granted and read as its super user."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tests.helpers.kafka import KafkaEnv


@dataclass(frozen=True)
class Acl:
    """One documented ACL: (resource type, name, pattern, operation), as kafka-acls spells them."""

    resource_type: str
    name: str
    pattern: str
    operation: str


# kafka-acls' names -> confluent-kafka's ResourceType (the cluster is BROKER there, named kafka-cluster).
_RESOURCE_TYPES = {"Topic": "TOPIC", "Group": "GROUP", "TransactionalId": "TRANSACTIONAL_ID", "Cluster": "BROKER"}


def _admin(env: KafkaEnv) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(env.config)


def _binding(acl: Acl, principal: str) -> Any:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    operation = "".join("_" + c if c.isupper() else c for c in acl.operation).lstrip("_").upper()
    return AclBinding(
        ResourceType[_RESOURCE_TYPES[acl.resource_type]],
        acl.name,
        ResourcePatternType[acl.pattern],
        principal,
        "*",
        AclOperation[operation],
        AclPermissionType.ALLOW,
    )


def acls_of(env: KafkaEnv, principal: str) -> set[Acl]:
    """The ACLs granted to ``principal``, read as the super user."""
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType
    from confluent_kafka.admin import ResourceType as RT

    admin = _admin(env)  # held: a collected client fails its futures with _DESTROY
    found = admin.describe_acls(
        AclBindingFilter(
            RT.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ANY
        )
    ).result(30)
    names = {v: k for k, v in _RESOURCE_TYPES.items()}
    return {
        Acl(
            names[b.restype.name],
            b.name,
            b.resource_pattern_type.name,
            "".join(part.capitalize() for part in b.operation.name.split("_")),
        )
        for b in found
    }


def set_acls(env: KafkaEnv, principal: str, wanted: set[Acl]) -> None:
    """Make ``principal``'s ACLs exactly ``wanted`` and wait until the authorizer reports them."""
    from confluent_kafka.admin import AclBindingFilter, AclPermissionType

    admin = _admin(env)
    current = acls_of(env, principal)
    gone = current - wanted
    if gone:
        filters = [
            AclBindingFilter(
                b.restype, b.name, b.resource_pattern_type, principal, "*", b.operation, AclPermissionType.ALLOW
            )
            for b in (_binding(a, principal) for a in gone)
        ]
        for f in admin.delete_acls(filters).values():
            f.result(30)
    new = wanted - current
    if new:
        for f in admin.create_acls([_binding(a, principal) for a in new]).values():
            f.result(30)
    deadline = time.monotonic() + 30
    while acls_of(env, principal) != wanted:
        assert time.monotonic() < deadline, "the authorizer did not apply the ACLs"
        time.sleep(0.1)


def example_acls(topic: str, prefix: str, decisions: str = "kafka2pc_decisions") -> set[Acl]:
    """Exactly docs/acls.md's ACLs for an exporter of ``prefix`` writing ``topic``, with the default
    decision topic and no ``transaction_timeout_ms`` (so the Cluster DescribeConfigs row too)."""
    return {
        Acl("Topic", topic, "LITERAL", "Write"),
        Acl("TransactionalId", prefix, "PREFIXED", "Write"),
        *(Acl("Topic", decisions, "LITERAL", op) for op in ("Read", "Write", "DescribeConfigs", "Create")),
        Acl("Cluster", "kafka-cluster", "LITERAL", "DescribeConfigs"),
        Acl("Group", "kafka2pc-decision-reader", "LITERAL", "Describe"),  # recommended: no DENIED lines
    }
