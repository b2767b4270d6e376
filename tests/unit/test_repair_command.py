"""``kafka2pc repair``'s command line: the source it loads and the options it takes (the repair
itself runs on the real broker and Spark: tests/integration/test_repair_spark.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.cli.arguments import UsageError, parse_args
from airflow_provider_kafka2pc.cli.registry_settings import record_formats
from airflow_provider_kafka2pc.cli.repair_command import load_format, load_source


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("tests.helpers.repair_sources", "give module:name"),
        (":parquet_frame", "give module:name"),
        ("tests.helpers.no_such_module:frame", "cannot be loaded (ModuleNotFoundError"),
        ("tests.helpers.repair_sources:no_such_frame", "cannot be loaded (AttributeError"),
        ("tests.helpers.repair_sources:__name__", "neither a callable (spark) -> DataFrame nor a KafkaSource"),
    ],
)
def test_a_source_that_cannot_be_used_is_a_usage_error_naming_why(spec: str, said: str) -> None:
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_source(spec)


def test_a_callable_or_a_kafka_source_is_loaded() -> None:
    from tests.helpers import repair_sources

    assert load_source("tests.helpers.repair_sources:parquet_frame") is repair_sources.parquet_frame


def test_repair_takes_the_run_the_source_and_spark_settings() -> None:
    args = parse_args(
        ["repair", "--prefix", "orders", "--run", "dag/r1", "--source", "m:f", "--spark-conf", "a=1", "--topic", "t"]
    )
    assert (args.command, args.run, args.source, args.topic) == ("repair", "dag/r1", "m:f", "t")
    assert (args.spark_master, args.spark_conf, args.writer) == ("local[*]", ["a=1"], "auto")
    with pytest.raises(SystemExit):
        parse_args(["repair", "--prefix", "orders", "--run", "dag/r1"])  # no --source


def _formats_args(*more: str) -> Any:
    return parse_args(["repair", "--prefix", "orders", "--run", "dag/r1", "--source", "m:f", *more])


def test_the_export_s_formats_are_loaded_by_name_and_anything_else_is_refused() -> None:
    from tests.helpers import repair_sources

    assert load_format("tests.helpers.repair_sources:AVRO_VALUE", "--value-format") is repair_sources.AVRO_VALUE
    assert load_format(None, "--key-format") is None
    with pytest.raises(UsageError, match=r"--key-format 'tests.helpers.repair_sources:parquet_frame' is a function, "):
        load_format("tests.helpers.repair_sources:parquet_frame", "--key-format")


def test_the_registry_comes_from_a_url_and_a_file_of_confluent_s_names(tmp_path: Path) -> None:
    from tests.helpers.repair_sources import AVRO_VALUE

    secret = "p@ss:word=x"
    (tmp_path / "r.properties").write_text(
        "# the exporter's\nbasic.auth.credentials.source=USER_INFO\n"
        f"basic.auth.user.info=exporter:{secret}\ntimeout=4\n"
    )
    args = _formats_args("--schema-registry-url", "https://sr:8081", "--schema-registry-config-file",
                         str(tmp_path / "r.properties"))  # fmt: skip
    formats = record_formats(args, None, AVRO_VALUE)
    assert formats is not None and formats.value is AVRO_VALUE and formats.key is None
    r = formats.registry
    assert (r.url, r.username, r.password, r.timeout_s, r.bearer_token) == (
        "https://sr:8081",
        "exporter",
        secret,
        4.0,
        None,
    )
    assert secret not in repr(formats)
    assert record_formats(_formats_args(), None, None) is None  # a run without formats needs no registry


@pytest.mark.parametrize(
    ("options", "lines", "said"),
    [
        ((), None, "need the registry the export framed its records for: give --schema-registry-conn-id"),
        (("--schema-registry-url", "sr:8081"), None, "is not an http(s) URL"),
        (("--schema-registry-url", "http://u:hunter2@sr"), None, "holds credentials, which any user of this host"),
        (
            ("--schema-registry-url", "http://sr", "--schema-registry-conn-id", "c"),
            None,
            "give either --schema-registry-conn-id or --schema-registry-url, not both",
        ),
        (
            ("--schema-registry-conn-id", "c"),
            "timeout=3\n",
            "give either --schema-registry-conn-id or --schema-registry-config-file, not both",
        ),
        (("--schema-registry-url", "http://sr"), "basic.auth.credentials.source=URL\n", "must be USER_INFO"),
        (("--schema-registry-url", "http://sr"), "hunter2\n", "r.properties:1: expected KEY=VALUE with KEY one of"),
        (("--schema-registry-url", "http://sr"), "password=hunter2\n", "expected KEY=VALUE with KEY one of"),
        (("--schema-registry-url", "http://sr"), "timeout=soon\n", "timeout must be seconds"),
    ],
)
def test_a_registry_that_cannot_be_used_is_a_usage_error_that_never_echoes_a_secret(
    tmp_path: Path, options: tuple[str, ...], lines: str | None, said: str
) -> None:
    from tests.helpers.repair_sources import AVRO_VALUE

    given = list(options)
    if lines is not None:
        (tmp_path / "r.properties").write_text(lines)
        given += ["--schema-registry-config-file", str(tmp_path / "r.properties")]
    with pytest.raises(UsageError, match=re.escape(said)) as raised:
        record_formats(_formats_args(*given), None, AVRO_VALUE)
    assert "hunter2" not in str(raised.value)


def test_a_registry_without_formats_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="without --key-format or --value-format"):
        record_formats(_formats_args("--schema-registry-url", "http://sr"), None, None)
