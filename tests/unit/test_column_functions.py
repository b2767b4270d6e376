"""The column functions the export builds its columns with follow the frame's kind, not the process's."""

from __future__ import annotations

import os

import pytest

from airflow_provider_kafka2pc.spark.column_functions import functions_for, is_connect


class _ConnectLike:
    """Stands for a Spark Connect DataFrame: only the module of its class is read."""


_ConnectLike.__module__ = "pyspark.sql.connect.dataframe"


class _ClassicLike:
    pass


_ClassicLike.__module__ = "pyspark.sql.classic.dataframe"


def test_a_connect_frame_gets_connect_columns_even_where_the_process_is_not_in_connect_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.sql.connect.column import Column as ConnectColumn

    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    assert is_connect(_ConnectLike()) and not is_connect(_ClassicLike())
    F = functions_for(_ConnectLike())
    assert isinstance(F.xxhash64(F.col("key"), F.col("value")), ConnectColumn)
    assert isinstance(F.spark_partition_id(), ConnectColumn)
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def test_a_classic_frame_gets_pyspark_sql_functions() -> None:
    import pyspark.sql.functions

    assert functions_for(_ClassicLike()) is pyspark.sql.functions


class _ConnectFrame(_ConnectLike):
    """A Spark Connect DataFrame's column lookup, without a server."""

    def __getitem__(self, name: str) -> object:
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions.col(name)


_ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"


@pytest.mark.parametrize("schema_type", ["AVRO", "JSON"])
def test_a_registry_format_frames_a_connect_frame_with_connect_columns(
    schema_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.connect.column import Column as ConnectColumn

    from airflow_provider_kafka2pc.registry.resolve import ResolvedSchema
    from airflow_provider_kafka2pc.spark.record_formats import _framed

    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    text = '{"type": "record", "name": "v", "fields": [{"name": "id", "type": "long"}]}'
    schema = ResolvedSchema("value", "t-value", 7, 1, text, schema_type, "registered")
    assert isinstance(_framed(_ConnectFrame(), "value", schema), ConnectColumn)
