"""OpenLineage: the topics as outputs with the provider, nothing (and nothing broken) without it."""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator
from airflow_provider_kafka2pc.operators.export import Kafka2PCExportOperator
from airflow_provider_kafka2pc.operators.lineage import topics_lineage


def operators() -> tuple[Kafka2PCExportOperator, Kafka2PCCommitOperator]:
    export = Kafka2PCExportOperator(task_id="prepare", transactional_id_prefix="orders", topic="t", table="db.orders")
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    export._written = ("b1:9092,b2:9092", ("orders", "audit"))
    commit._visible = ("b1:9092,b2:9092", ("audit", "orders"))
    return export, commit


def test_without_the_openlineage_provider_there_is_no_lineage_and_no_error() -> None:
    installed = importlib.util.find_spec("airflow.providers.openlineage") is not None
    for op in operators():
        lineage = op.get_openlineage_facets_on_complete(None)
        assert (lineage is None) is not installed


@pytest.fixture
def openlineage_provider(monkeypatch: pytest.MonkeyPatch) -> type:
    """Stand-ins for the provider's ``OperatorLineage`` and the client's ``Dataset`` (the real ones
    were tried by hand, see docs/design.md)."""

    @dataclass
    class OperatorLineage:
        inputs: list[Any] = field(default_factory=list)
        outputs: list[Any] = field(default_factory=list)

    @dataclass
    class Dataset:
        namespace: str
        name: str

    # Without the openlineage client, common.compat's Dataset is a no-op placeholder.
    monkeypatch.setattr("airflow.providers.common.compat.openlineage.facet.Dataset", Dataset)
    package = types.ModuleType("airflow.providers.openlineage")
    extractors = types.ModuleType("airflow.providers.openlineage.extractors")
    extractors.OperatorLineage = OperatorLineage  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage", package)
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage.extractors", extractors)
    return OperatorLineage


def test_export_and_commit_name_their_topics_in_the_kafka_namespace(openlineage_provider: type) -> None:
    for op in operators():
        lineage = op.get_openlineage_facets_on_complete(None)
        assert isinstance(lineage, openlineage_provider)
        assert lineage.inputs == []
        assert [(d.namespace, d.name) for d in lineage.outputs] == [
            ("kafka://b1:9092", "audit"),
            ("kafka://b1:9092", "orders"),
        ]


def test_a_commit_that_did_not_commit_names_no_output(openlineage_provider: type) -> None:
    commit = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare")
    assert commit.get_openlineage_facets_on_complete(None).outputs == []
    assert topics_lineage("b:9092", []).outputs == []
