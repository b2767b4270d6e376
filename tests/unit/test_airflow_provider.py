"""The Airflow shells without a broker: connection → config, XCom payloads, the trigger, wiring."""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pendulum
import pytest

from airflow_provider_kafka2pc.exceptions import Kafka2PCConfigError, PoolingNeedsOneActiveRunError
from airflow_provider_kafka2pc.hooks.kafka2pc import Kafka2PCHook, client_config
from airflow_provider_kafka2pc.operators.payload import ExportPayload
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

SASL = {
    "conn_type": "kafka2pc",
    "host": "b1:9092,b2:9092",
    "login": "svc-export",
    "password": "s3cret-passw0rd",
    "extra": {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "decision_topic": "team_a_decisions",
        "config": {"ssl.ca.location": "/etc/ssl/ca.pem", "socket.timeout.ms": 10000},
    },
}


def use_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict[str, Any]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


# --- hook ----------------------------------------------------------------------------------------


def test_kafka2pc_connection_becomes_librdkafka_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "kafka2pc_default", SASL)
    hook = Kafka2PCHook()
    assert hook.get_config() == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc-export",
        "sasl.password": "s3cret-passw0rd",
        "ssl.ca.location": "/etc/ssl/ca.pem",
        "socket.timeout.ms": "10000",
    }
    assert hook.decision_topic == "team_a_decisions"
    assert hook.producer_config({"linger.ms": 50})["linger.ms"] == 50
    assert hook.redacted_config()["sasl.password"] == "***"
    assert "s3cret" not in json.dumps(hook.redacted_config())


def test_official_kafka_connection_is_used_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"bootstrap.servers": "k1:9092", "security.protocol": "SSL", "group.id": "ignored-by-producers"}
    use_connection(monkeypatch, "kafka_default", {"conn_type": "kafka", "extra": extra})
    hook = Kafka2PCHook("kafka_default")
    assert hook.get_config() == extra
    assert hook.decision_topic == "kafka2pc_decisions"


def test_host_and_port_make_one_bootstrap_server() -> None:
    assert client_config("kafka2pc", "broker", 9093, None, None, {})["bootstrap.servers"] == "broker:9093"


@pytest.mark.parametrize(
    ("conn_type", "host", "extra", "match"),
    [
        ("kafka2pc", None, {}, "bootstrap servers"),
        ("kafka", None, {"group.id": "g"}, "bootstrap servers"),
        ("kafka2pc", "b:9092", {"linger.ms": 5}, "unknown extra field"),
        ("kafka2pc", "b:9092", {"config": "not-an-object"}, "must be an object"),
    ],
)
def test_unusable_connection_is_a_clear_error(
    conn_type: str, host: str | None, extra: dict[str, Any], match: str
) -> None:
    with pytest.raises(Kafka2PCConfigError, match=match):
        client_config(conn_type, host, None, None, None, extra)


def test_test_connection_reports_a_configuration_mistake_by_field_without_contacting_kafka(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Kafka contacted for a connection that cannot work")

    monkeypatch.setattr(Kafka2PCHook, "wire_client", no_network)
    extra = {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}
    use_connection(monkeypatch, "kafka2pc_default", {"conn_type": "kafka2pc", "host": "b1:9093", "extra": extra})
    ok, message = Kafka2PCHook().test_connection()
    assert not ok
    assert message.startswith("configuration mistake, Kafka was not contacted: connection field 'SASL mechanism'")
    assert "cannot reach" not in message


@pytest.mark.parametrize(
    ("host", "extra", "field"),
    [
        ("b:9092", {"security_protocol": "SASL_SSLL"}, "Security protocol"),
        ("b:9092", {"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "SASL mechanism"),
        (None, {}, "Bootstrap servers"),
        ("b:9092", {"linger.ms": 5}, "Extra"),
        ("b:9092", {"config": {"ssl.keystore.location": "/ks.p12"}}, "librdkafka settings"),
    ],
)
def test_a_configuration_mistake_names_the_form_field_to_fix(
    host: str | None, extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(Kafka2PCConfigError) as e:
        client_config("kafka2pc", host, None, "user1", "password1", extra)
    assert e.value.field == field and str(e.value).startswith(f"connection field {field!r}: ")


OIDC = {
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "exporter",
    "sasl.oauthbearer.client.secret": "client-secret",
    "sasl.oauthbearer.token.endpoint.url": "https://idp.example.invalid/token",
}


def test_every_choice_of_the_form_makes_a_working_config() -> None:
    from airflow_provider_kafka2pc.connection_form import CONN_FIELDS

    protocols = [c for c in CONN_FIELDS["security_protocol"]["schema"]["enum"] if c]
    mechanisms = [c for c in CONN_FIELDS["sasl_mechanism"]["schema"]["enum"] if c]
    assert protocols == ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    assert mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
    for protocol in protocols:
        for mechanism in mechanisms if protocol.startswith("SASL") else [None]:
            extra: dict[str, Any] = {"security_protocol": protocol, "sasl_mechanism": mechanism}
            if mechanism == "OAUTHBEARER":  # its settings go under config (docs/connection.md)
                extra["config"] = OIDC
            config = client_config("kafka2pc", "b:9092", None, "user1", "password1", extra)
            assert (config["security.protocol"], config.get("sasl.mechanism")) == (protocol, mechanism)


def test_test_connection_reports_a_broker_that_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    use_connection(monkeypatch, "kafka2pc_default", {"conn_type": "kafka2pc", "host": "127.0.0.1:1"})
    started = time.monotonic()
    ok, message = Kafka2PCHook().test_connection()
    assert (ok, message) == (
        False,
        "cannot reach Kafka at 127.0.0.1:1: connection refused (is a broker listening on that port?)",
    )
    assert time.monotonic() - started < 5  # refused: not the whole connect timeout (10 s)


# --- XCom payload --------------------------------------------------------------------------------


def committable(tid: str = "orders-0") -> Committable:
    return Committable(tid, 7, 0, 10, 1000, (("events", 0),), int(time.time() * 1000), 60_000, {"events": 10})


def test_export_payload_round_trips_through_json_without_settings() -> None:
    payload = ExportPayload(
        "kafka2pc_default", "orders", "POOLING", None, "EXACTLY_ONCE", (committable(),), {"records": 10}
    )
    wire = json.loads(json.dumps(payload.to_xcom()))
    # Version 2 carries what the commit needs; the partitions come from the broker.
    needed = Committable("orders-0", 7, 0, 10, counts_by_topic={"events": 10})
    assert ExportPayload.from_xcom(wire, "prepare") == replace(payload, committables=(needed,))
    assert set(wire) == {
        "version", "conn_id", "prefix", "naming_strategy", "run_key", "delivery_guarantee", "transactions", "summary"
    }  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [None, "text", {"version": 99}, {"version": 1, "prefix": "p"}, {"version": 1, "conn_id": "c", "prefix": "p",
     "naming_strategy": "POOLING", "delivery_guarantee": "EXACTLY_ONCE", "committables": [{"transactional_id": 1}]}],
)  # fmt: skip
def test_malformed_export_payload_is_refused(value: Any) -> None:
    with pytest.raises(MalformedCommittableError):
        ExportPayload.from_xcom(value, "prepare")


# --- trigger -------------------------------------------------------------------------------------


def test_trigger_survives_a_serialize_round_trip() -> None:
    from airflow_provider_kafka2pc.triggers.recovery import Kafka2PCRecoveryTrigger

    trigger = Kafka2PCRecoveryTrigger("orders", "dag/run-1", "kafka_prod", poke_interval=2.5)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert "password" not in json.dumps(kwargs)


class _Result:
    def __init__(self, done: bool) -> None:
        self.done = done

    def describe(self) -> str:
        return f"done={self.done}"


def _run_trigger(monkeypatch: pytest.MonkeyPatch, recover: Any) -> tuple[list[Any], int]:
    from airflow.sdk import Connection

    from airflow_provider_kafka2pc.triggers.recovery import Kafka2PCRecoveryTrigger

    async def aget_connection(conn_id: str) -> Connection:
        return Connection(conn_id=conn_id, conn_type="kafka2pc", host="b:9092")

    monkeypatch.setattr(Kafka2PCHook, "aget_connection", staticmethod(aget_connection))
    monkeypatch.setattr(Kafka2PCHook, "recover", recover)

    async def main() -> tuple[list[Any], int]:
        ticks = 0
        events: list[Any] = []

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        async for event in Kafka2PCRecoveryTrigger("orders", "dag/run", poke_interval=0.01).run():
            events.append(event.payload)
        tick.cancel()
        return events, ticks

    return asyncio.run(main())


def test_trigger_fires_when_nothing_is_open_and_never_blocks_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[str] = []

    def recover(
        self: Kafka2PCHook, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> _Result:
        passes.append(prefix)
        time.sleep(0.3)  # blocking Kafka I/O: must not stall the triggerer's loop
        return _Result(done=len(passes) == 3)

    events, ticks = _run_trigger(monkeypatch, recover)
    assert [e["status"] for e in events] == ["success"]
    assert events[0]["passes"] == 3
    assert ticks > 30, f"the event loop ran only {ticks} ticks during 0.9 s of blocking recovery"


def test_trigger_reports_a_failure_as_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    def recover(
        self: Kafka2PCHook, prefix: str, run: str, run_key: str | None = None, spare_own_loss: bool = False
    ) -> _Result:
        raise RuntimeError("broker down")

    events, _ = _run_trigger(monkeypatch, recover)
    assert events == [
        {
            "status": "error",
            "prefix": "orders",
            "passes": 1,
            "message": "RuntimeError: broker down",
            "error": "RuntimeError",
        }
    ]


def test_sensor_fails_with_the_trigger_error_and_defaults_to_the_deferrable_setting() -> None:
    from airflow.sdk import conf

    from airflow_provider_kafka2pc.exceptions import RecoveryError
    from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor

    sensor = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders")
    assert sensor.deferrable is conf.getboolean("operators", "default_deferrable", fallback=False)
    with pytest.raises(RecoveryError, match="broker down"):
        sensor.execute_complete({}, {"status": "error", "message": "broker down"})  # type: ignore[arg-type]


# --- task group and DAG checks -------------------------------------------------------------------


def _dag(max_active_runs: int) -> Any:
    from airflow.sdk import DAG

    return DAG("d", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), max_active_runs=max_active_runs)


def _group(**kwargs: Any) -> Any:
    from airflow_provider_kafka2pc.task_group import kafka2pc_export_group

    return kafka2pc_export_group(transactional_id_prefix="orders", topic="t", table="src", **kwargs)


def test_task_group_wires_recover_prepare_commit_abort() -> None:
    with _dag(1) as dag:
        _group()
    tasks = dag.task_dict
    assert set(tasks) == {"orders.recover", "orders.prepare", "orders.commit", "orders.abort"}
    assert tasks["orders.recover"].downstream_task_ids == {"orders.prepare"}
    assert tasks["orders.prepare"].downstream_task_ids == {"orders.commit", "orders.abort"}
    assert tasks["orders.abort"].trigger_rule == "all_done"  # waits for every export, skips unless one failed
    assert tasks["orders.commit"].export_task_ids == "orders.prepare"
    assert tasks["orders.recover"].repair_lost is True and tasks["orders.prepare"].repair_lost is True


def test_the_group_gives_the_exports_repair_lost_to_its_recovery_sensor() -> None:
    """A sensor that let the run's own loss through to an export that does not repair it would
    only move the failure one task later."""
    with _dag(1) as dag:
        _group(repair_lost=False)
    assert dag.task_dict["orders.recover"].repair_lost is False
    assert dag.task_dict["orders.prepare"].repair_lost is False
    with _dag(1) as dag:  # the sensor's own argument still wins
        _group(repair_lost=False, recover_kwargs={"repair_lost": True})
    assert dag.task_dict["orders.recover"].repair_lost is True


def test_pooling_without_one_active_run_is_refused_at_parse_time() -> None:
    with _dag(16), pytest.raises(PoolingNeedsOneActiveRunError, match="max_active_runs=1"):
        _group()
    with _dag(16) as dag:  # new ids every run: runs may overlap
        _group(naming_strategy="INCREMENTING")
    assert "orders.prepare" in dag.task_dict


def test_export_needs_exactly_one_source() -> None:
    from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator

    with pytest.raises(ValueError, match="exactly one of source"):
        Kafka2PCExportOperator(task_id="x", transactional_id_prefix="p", sql="select 1", table="t")


def test_an_unknown_writer_is_refused_at_parse_time_and_by_the_job() -> None:
    from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import choose_writer

    with pytest.raises(ValueError, match=r"writer='rust': choose one of \['auto', 'native', 'python'\]"):
        Kafka2PCExportOperator(task_id="x", transactional_id_prefix="p", sql="select 1", writer="rust")
    with pytest.raises(ValueError, match=r"writer='rust'"):
        choose_writer(ExportSettings("t", {}, "topic", writer="rust"), ["key", "value"])
    assert choose_writer(ExportSettings("t", {}, "topic", writer="python"), ["key", "value"]) == (
        False,
        "writer='python'",
    )


# --- provider info -------------------------------------------------------------------------------


def test_provider_info_matches_airflows_schema_and_points_at_real_classes() -> None:
    import airflow

    from airflow_provider_kafka2pc.get_provider_info import get_provider_info

    info = get_provider_info()
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-provider-kafka2pc"
    for section in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    conn, registry = info["connection-types"]
    module, _, name = conn["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert (conn["connection-type"], hook.default_conn_name) == ("kafka2pc", "kafka2pc_default")
    assert set(conn["conn-fields"]) == {
        "security_protocol",
        "sasl_mechanism",
        "decision_topic",
        "connect_timeout_s",
        "config",
    }
    assert set(hook.get_ui_field_behaviour()["relabeling"]) == set(conn["ui-field-behaviour"]["relabeling"])
    # Choices, not free text, and never a "null" choice or a null saved into the extra (Airflow 3's
    # form saves every field's value); Schema hidden in both forms, Port shown (its row Test button
    # refuses a connection stored without a port on Airflow 3.3.2).
    fields = conn["conn-fields"]
    assert "SASL_SSL" in fields["security_protocol"]["schema"]["enum"]
    assert "SCRAM-SHA-512" in fields["sasl_mechanism"]["schema"]["enum"]
    for field in fields.values():
        schema = field["schema"]
        assert None not in schema.get("enum", ()), field
        assert schema.get("default") is not None, field
    assert set(conn["ui-field-behaviour"]["hidden-fields"]) == {"schema"}
    assert hook.get_ui_field_behaviour()["hidden_fields"] == conn["ui-field-behaviour"]["hidden-fields"]
    # The schema registry's connection: the same rules, its own hook.
    module, _, name = registry["hook-class-name"].rpartition(".")
    registry_hook = getattr(importlib.import_module(module), name)
    assert (registry["connection-type"], registry_hook.conn_type) == ("kafka2pc_schema_registry",) * 2
    assert set(registry["conn-fields"]) == {"auth", "ca_file", "timeout_s"}
    for field in registry["conn-fields"].values():
        assert None not in field["schema"].get("enum", ()) and field["schema"].get("default") is not None, field
    assert registry_hook.get_ui_field_behaviour()["hidden_fields"] == registry["ui-field-behaviour"]["hidden-fields"]
    assert set(registry["ui-field-behaviour"]["hidden-fields"]) == {"schema"}
