"""Driver glue for a Kafka source: the run's range read with Spark's batch Kafka source.

``read_range`` hands the user's transformation exactly ``[start, end)`` of every source partition
(``assign`` with ``startingOffsets``/``endingOffsets`` from the range, ``read_committed``): committed
records only, never past the last stable offset the snapshot read. Spark's source is a separate
artifact (``spark-sql-kafka-0-10``); ``kafka_source_package`` names the coordinate that matches the
running PySpark, which the operator adds to ``spark.jars.packages`` unless the session already has
the source. The connection's librdkafka settings become the Java client's ``kafka.*`` options here
(``java_client_options``): the same principal reads the source that writes the output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.errors import UnmappableConfigError
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange

# The Spark Kafka source's artifact, without its Scala suffix (spark/versions.py reads it).
_ARTIFACT = "spark-sql-kafka-0-10"
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka settings of a connection that the Java client needs no counterpart for.
_IRRELEVANT = ("client.id", "socket.", "reconnect.", "broker.address.family")


def kafka_source_package() -> str:
    """``spark.jars.packages`` for the Kafka source matching the Spark a session here starts
    (its version and Scala binary version: ``_2.12`` for pip's PySpark 3.5, ``_2.13`` for 4.x)."""
    from airflow_provider_kafka2pc.spark.versions import spark_build

    return spark_build().package(_ARTIFACT)


def needs_kafka_package(spark_conf: Mapping[str, Any]) -> bool:
    """Whether a session built with ``spark_conf`` lacks the Kafka source (neither in its jars nor
    its packages): the operator then adds ``kafka_source_package()``."""
    given = f"{spark_conf.get('spark.jars', '')},{spark_conf.get('spark.jars.packages', '')}"
    return _ARTIFACT not in given


def java_client_options(config: Mapping[str, Any]) -> dict[str, str]:
    """The connection's librdkafka settings as the Java client's, prefixed ``kafka.`` for Spark.

    Covers PLAINTEXT, SSL with a CA file, and SASL PLAIN/SCRAM; anything else is refused by name
    (give it through ``KafkaSource(options=...)`` in the Java client's own words)."""
    out: dict[str, str] = {}
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in _PROTOCOLS:
        raise UnmappableConfigError("security.protocol", f"{protocol!r} is not one of {list(_PROTOCOLS)}")
    out["kafka.security.protocol"] = protocol
    for key, value in config.items():
        if key == "bootstrap.servers":
            out["kafka.bootstrap.servers"] = str(value)
        elif key in ("security.protocol", "sasl.username", "sasl.password") or key.startswith(_IRRELEVANT):
            continue
        elif key == "enable.ssl.certificate.verification":
            if str(value).lower() not in ("true", "1"):
                raise UnmappableConfigError(key, "a Kafka source reads with certificate verification on")
        elif key == "sasl.mechanism":
            mechanism = str(value).upper()
            if mechanism not in _LOGIN_MODULES:
                raise UnmappableConfigError(
                    key, f"a Kafka source maps {sorted(_LOGIN_MODULES)} to Spark's Java client, not {mechanism}"
                )
            out["kafka.sasl.mechanism"] = mechanism
        elif key == "ssl.ca.location":
            out["kafka.ssl.truststore.type"] = "PEM"
            out["kafka.ssl.truststore.location"] = str(value)
        elif key == "ssl.endpoint.identification.algorithm":
            out["kafka.ssl.endpoint.identification.algorithm"] = "" if str(value).lower() == "none" else "https"
        elif key.startswith(("sasl.", "ssl.")):
            raise UnmappableConfigError(
                key,
                "a Kafka source cannot map it to Spark's Java client; give the Java setting in KafkaSource(options=)",
            )
    if protocol.startswith("SASL"):
        mechanism = out.setdefault("kafka.sasl.mechanism", str(config.get("sasl.mechanism", "PLAIN")).upper())
        user, password = config.get("sasl.username"), config.get("sasl.password")
        if user is None or password is None:
            raise UnmappableConfigError("sasl.username", f"{protocol} needs a login and a password for the source")
        # Spark redacts option values that say "password" (spark.redaction.regex) in its plans and UI.
        # JAAS reads a quoted string with backslash escapes only: keep non-ASCII characters as they are.
        quoted = [json.dumps(str(v), ensure_ascii=False) for v in (user, password)]
        login = f"username={quoted[0]} password={quoted[1]}"
        out["kafka.sasl.jaas.config"] = f"{_LOGIN_MODULES[mechanism]} required {login};"
    return out


def read_range(
    spark: Any, config: Mapping[str, Any], source: SourceRange, options: Mapping[str, str] | None = None
) -> Any:
    """The DataFrame of Spark's Kafka source over exactly ``source``'s offsets, committed records only
    (columns key, value, topic, partition, offset, timestamp, timestampType, and headers)."""
    assign = {t: sorted(p.partition for p in source.partitions if p.topic == t) for t in source.topics}
    reader = (
        spark.read.format("kafka")
        .options(**java_client_options(config))
        .option("assign", json.dumps(assign, sort_keys=True))
        .options(**source.spark_options())
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
    )
    for key, value in (options or {}).items():  # KafkaSource refuses those that would change the range
        reader = reader.option(key, value)
    return reader.load()
