"""Who the client is and which ACL it lacks, said without secrets (txn/kafka/access.py, no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kafka2pc.txn.kafka.access import (
    authorization_error_of,
    describe_identity,
    principal_of,
)
from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthorizationError, acl_command

SCRAM = {
    "bootstrap.servers": "b:9093",
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "exporter",
    "sasl.password": "hunter2",
}


@pytest.mark.parametrize(
    ("config", "principal", "identity"),
    [
        (SCRAM, "User:exporter", "SASL SCRAM-SHA-512 as User:exporter over SASL_SSL"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.client.id": "c1"},
            "User:c1",
            "SASL OAUTHBEARER as User:c1 over SASL_SSL",
        ),
        ({"security.protocol": "SSL"}, "User:ANONYMOUS", "SSL as User:ANONYMOUS"),  # one-way TLS
        (
            {"security.protocol": "SASL_PLAINTEXT"},
            "User:kafkaclient",
            "SASL GSSAPI as User:kafkaclient over SASL_PLAINTEXT",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI", "sasl.kerberos.principal": "etl/h1@EX.COM"},
            "User:etl",
            "SASL GSSAPI as User:etl over SASL_SSL",
        ),
        ({}, "User:ANONYMOUS", "PLAINTEXT as User:ANONYMOUS"),
    ],
)
def test_principal_and_identity_never_show_a_secret(config: dict[str, str], principal: str, identity: str) -> None:
    assert principal_of(config) == principal
    assert describe_identity(config) == identity
    assert "hunter2" not in describe_identity(config)


def _certificate(subject: str) -> tuple[bytes, bytes]:
    """A self-signed client certificate for ``subject`` (given most specific first), as PEM and as a
    PKCS#12 keystore with the password "ks-secret"."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name.from_rfc4514_string(subject)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    encryption = serialization.BestAvailableEncryption(b"ks-secret")
    return cert.public_bytes(serialization.Encoding.PEM), pkcs12.serialize_key_and_certificates(
        b"client", key, cert, None, encryption
    )


def test_an_ssl_principal_is_the_client_certificates_subject_as_kafka_names_it(tmp_path: Path) -> None:
    pem, keystore = _certificate("CN=exporter,OU=data,O=Acme,C=DE")
    (tmp_path / "client.pem").write_bytes(pem)
    (tmp_path / "client.p12").write_bytes(keystore)
    principal = "User:CN=exporter,OU=data,O=Acme,C=DE"
    for config in (
        {"security.protocol": "SSL", "ssl.certificate.location": str(tmp_path / "client.pem")},
        {"security.protocol": "SSL", "ssl.certificate.pem": pem.decode()},
        {
            "security.protocol": "SSL",
            "ssl.keystore.location": str(tmp_path / "client.p12"),
            "ssl.keystore.password": "ks-secret",
        },
    ):
        assert principal_of(config) == principal, config
        assert "ks-secret" not in describe_identity(config)
    missing = {"security.protocol": "SSL", "ssl.certificate.location": str(tmp_path / "gone.pem")}
    assert principal_of(missing) == f"User:<the subject of the client certificate in {tmp_path / 'gone.pem'}>"


def test_acl_commands_as_docs_acls_md_writes_them() -> None:
    assert acl_command("User:x", "Topic", "orders_out", "Write", bootstrap="b1:9093,b2:9093") == (
        "kafka-acls --bootstrap-server b1:9093,b2:9093 --command-config admin.properties --add "
        "--allow-principal User:x --operation Write --topic orders_out"
    )
    assert acl_command("User:x", "TransactionalId", "orders", "Write", "PREFIXED", bootstrap="b:1").endswith(
        "--operation Write --transactional-id orders --resource-pattern-type prefixed"
    )
    assert acl_command("User:x", "Cluster", "kafka-cluster", "DescribeConfigs", bootstrap="b:1").endswith(
        "--operation DescribeConfigs --cluster"
    )
    # A certificate's subject with a space is quoted for the shell; a plain one is left as it is.
    assert "--allow-principal 'User:CN=etl,O=Acme Corp' --operation" in acl_command(
        "User:CN=etl,O=Acme Corp", "Topic", "t", "Write", bootstrap="b:1"
    )
    assert "--allow-principal User:CN=etl,OU=data,O=Acme --operation" in acl_command(
        "User:CN=etl,OU=data,O=Acme", "Topic", "t", "Write", bootstrap="b:1"
    )


@pytest.mark.parametrize(
    ("code", "resource_type", "resource"),
    [
        ("TOPIC_AUTHORIZATION_FAILED", "Topic", "orders_out"),
        ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "TransactionalId", "orders_out"),
        ("CLUSTER_AUTHORIZATION_FAILED", "Cluster", "kafka-cluster"),
        ("GROUP_AUTHORIZATION_FAILED", "Group", "orders_out"),
    ],
)
def test_authorization_codes_name_resource_and_operation(code: str, resource_type: str, resource: str) -> None:
    error = authorization_error_of(code, SCRAM, "orders_out", "Write")
    assert isinstance(error, KafkaAuthorizationError)
    assert (error.resource_type, error.resource, error.operation) == (resource_type, resource, "Write")
    assert str(error).startswith(f"authorization failed: principal User:exporter may not Write {resource_type}")
    assert "hunter2" not in str(error)


def test_other_codes_are_not_authorization_errors() -> None:
    assert authorization_error_of("MSG_SIZE_TOO_LARGE", SCRAM, "t", "Write") is None


def test_the_admin_clients_of_the_access_checks_log_through_python_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a ``logger`` librdkafka writes its lines to stderr, which an Airflow task logs raw
    (a "BGQUEUE Purging 1 unserved events" line at a client's destroy failed the DAG test's
    every-line-a-log-record check once)."""
    import confluent_kafka.admin

    from airflow_provider_kafka2pc.txn.kafka.access import check_topic_access, topic_config_value
    from airflow_provider_kafka2pc.txn.kafka.client_logs import LIBRDKAFKA_LOG

    configs: list[dict[str, object]] = []

    class Admin:
        def __init__(self, conf: dict[str, object]) -> None:
            configs.append(conf)
            raise RuntimeError("no broker here")

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", Admin)
    assert topic_config_value(SCRAM, "t", "max.message.bytes") is None
    with pytest.raises(RuntimeError):
        check_topic_access(SCRAM, {"t": ["WRITE"]})
    assert len(configs) == 2 and all(c["logger"] is LIBRDKAFKA_LOG for c in configs)
