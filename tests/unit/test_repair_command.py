"""``kafka2pc repair``'s command line: the source it loads and the options it takes (the repair
itself runs on the real broker and Spark: tests/integration/test_repair_spark.py)."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.cli.arguments import UsageError, parse_args
from airflow_provider_kafka2pc.cli.repair_command import load_source


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
