"""OpenLineage, with the real openlineage provider (the test environment has it): the topics as
outputs, the source tables' stored data as inputs; nothing, and nothing broken, without it."""

from __future__ import annotations

import sys

import pytest
from airflow.providers.openlineage.extractors import OperatorLineage

from airflow_provider_kafka2pc.operators import lineage
from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.operators.lineage import source_table_names, topics_lineage
from airflow_provider_kafka2pc.spark.sources import SourceTable

ORDERS = SourceTable("spark_catalog.db.orders", "file:/data/warehouse/db.db/orders")


def operators() -> tuple[Kafka2PCExportOperator, Kafka2PCCommitOperator]:
    export = Kafka2PCExportOperator(task_id="prepare", transactional_id_prefix="orders", topic="t", table="db.orders")
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    export._written = ("b1:9092,b2:9092", ("orders", "audit"))
    export._read = (ORDERS,)
    commit._visible = ("b1:9092,b2:9092", ("audit", "orders"))
    return export, commit


def test_export_and_commit_name_their_topics_in_the_kafka_namespace() -> None:
    for op in operators():
        got = op.get_openlineage_facets_on_complete(None)
        assert isinstance(got, OperatorLineage)
        assert [(d.namespace, d.name) for d in got.outputs] == [
            ("kafka://b1:9092", "audit"),
            ("kafka://b1:9092", "orders"),
        ]


def test_the_export_names_its_source_table_as_input_with_a_symlink_to_the_table() -> None:
    export, commit = operators()
    (stored,) = export.get_openlineage_facets_on_complete(None).inputs
    assert (stored.namespace, stored.name) == ("file", "/data/warehouse/db.db/orders")
    (table,) = stored.facets["symlinks"].identifiers
    assert (table.namespace, table.name, table.type) == ("file", "db.orders", "TABLE")
    assert commit.get_openlineage_facets_on_complete(None).inputs == []  # the commit reads no table


@pytest.mark.parametrize(
    ("location", "dataset"),
    [
        ("file:/w/db.db/t", ("file", "/w/db.db/t")),
        ("/w/t", ("file", "/w/t")),
        ("hdfs://nn:8020/w/t", ("hdfs://nn:8020", "/w/t")),
        ("s3a://bucket/w/t", ("s3://bucket", "w/t")),
        ("gs://bucket/w/t", ("gs://bucket", "w/t")),
        ("abfss://c@acct.dfs.core.windows.net/w/t", ("abfss://c@acct.dfs.core.windows.net", "/w/t")),
        (None, None),  # a view: its data is wherever its own sources are
    ],
)
def test_stored_data_is_named_as_openlineage_names_it(location: str | None, dataset: tuple[str, str] | None) -> None:
    assert SourceTable("spark_catalog.db.t", location).dataset() == dataset


def test_source_tables_come_from_table_or_from_what_the_sql_names() -> None:
    assert source_table_names("db.orders", None) == ["db.orders"]
    sql = "WITH recent AS (SELECT * FROM db.orders WHERE day > 3) SELECT * FROM recent JOIN cat.s.users USING (id)"
    assert sorted(source_table_names(None, sql)) == ["cat.s.users", "db.orders"]  # not the CTE
    assert source_table_names(None, "not sql at all") == []
    assert source_table_names(None, None) == []  # a source callable: unknown


def test_a_commit_that_did_not_commit_names_no_output() -> None:
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    assert commit.get_openlineage_facets_on_complete(None).outputs == []
    assert topics_lineage("b:9092", []).outputs == []


def test_without_the_openlineage_provider_there_is_no_lineage_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage.extractors", None)  # import fails
    monkeypatch.setattr(lineage, "lineage_enabled", lambda: False)
    for op in operators():
        assert op.get_openlineage_facets_on_complete(None) is None
    assert operators()[0]._source_tables(spark=object()) == ()  # Spark is not even asked
