"""The Spark and pyarrow versions kafka2pc supports, and what differs between them: the Scala suffix
of Spark's packages, Spark 3.5's Arrow batches without a byte bound, a pyarrow without view types,
a mixed pyspark/pyspark-client install. No JVM: the real Spark lines run in scripts/test-compat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_kafka2pc.spark import versions
from airflow_provider_kafka2pc.spark.errors import UnsupportedVersionError
from airflow_provider_kafka2pc.spark.kafka_source import kafka_source_package, needs_kafka_package
from airflow_provider_kafka2pc.spark.record_formats import avro_package
from airflow_provider_kafka2pc.spark.write_job import arrow_batch_bounds
from airflow_provider_kafka2pc.txn.kafka import message_arrays, native


def _spark_home(tmp_path: Path, *jars: str) -> Path:
    (tmp_path / "jars").mkdir()
    for jar in jars:
        (tmp_path / "jars" / jar).write_bytes(b"")
    return tmp_path


def test_the_packages_carry_the_scala_suffix_and_version_of_the_spark_that_will_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip's PySpark 3.5 ships Scala 2.12: a ``_2.13`` package would not load there."""
    home = _spark_home(tmp_path, "scala-library-2.12.18.jar", "spark-core_2.12-3.5.9.jar", "spark-sql_2.12-3.5.9.jar")
    monkeypatch.setenv("SPARK_HOME", str(home))
    assert versions.spark_build() == versions.SparkBuild("3.5.9", "2.12")
    assert kafka_source_package() == "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.9"
    assert avro_package() == "org.apache.spark:spark-avro_2.12:3.5.9"
    assert needs_kafka_package({"spark.jars.packages": avro_package()})
    assert not needs_kafka_package({"spark.jars.packages": kafka_source_package()})


def test_without_spark_home_the_jars_of_the_installed_pyspark_say_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    monkeypatch.delenv("SPARK_HOME", raising=False)
    build = versions.spark_build()
    assert build.version == pyspark.__version__
    assert any((Path(pyspark.__file__).parent / "jars").glob(f"scala-library-{build.scala}.*.jar"))


def test_without_a_jars_folder_the_scala_of_the_pyspark_line_is_assumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "3.5.2")
    assert versions.spark_build(tmp_path / "none") == versions.SparkBuild("3.5.2", "2.12")
    monkeypatch.setattr(pyspark, "__version__", "4.1.0")
    assert versions.spark_build(tmp_path / "none") == versions.SparkBuild("4.1.0", "2.13")


@pytest.mark.parametrize("version", ["3.5.0", "3.5.9", "4.0.5", "4.1.4", "4.2.0", "4.3.0", "4.3.1.dev0"])
def test_the_tested_lines_are_accepted_whatever_the_patch_release(version: str) -> None:
    assert versions.unsupported_pyspark(version) is None


@pytest.mark.parametrize("version", ["3.4.4", "3.3.0", "4.4.0", "5.0.0"])
def test_a_pyspark_outside_the_tested_lines_is_refused_by_name_before_anything_is_written(version: str) -> None:
    with pytest.raises(UnsupportedVersionError) as refused:
        versions.check_supported(version)
    message = str(refused.value)
    assert f"PySpark {version} is not one of the Spark lines" in message
    assert "3.5, 4.0, 4.1, 4.2, 4.3" in message and "nothing was written" in message


def _installed(monkeypatch: pytest.MonkeyPatch, found: dict[str, str]) -> None:
    import importlib.metadata as metadata

    def version(name: str) -> str:
        if name not in found:
            raise metadata.PackageNotFoundError(name)
        return found[name]

    monkeypatch.setattr(metadata, "version", version)


def test_pyspark_and_pyspark_client_in_two_versions_are_refused_as_a_mixed_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _installed(monkeypatch, {"pyspark": "3.5.9", "pyspark-client": "4.2.0"})
    with pytest.raises(UnsupportedVersionError) as refused:
        versions.check_supported("3.5.9")
    message = str(refused.value)
    assert "pyspark 3.5.9 and pyspark-client 4.2.0 are both installed" in message
    assert "nothing was written" in message and "'spark-connect'" in message
    _installed(monkeypatch, {"pyspark": "4.2.0", "pyspark-client": "4.2.0"})  # the lock's: one version
    assert versions.mixed_install() is None
    _installed(monkeypatch, {"pyspark-client": "4.2.0"})
    assert versions.mixed_install() is None


def test_a_pyarrow_older_than_the_tested_one_is_refused_and_the_native_writer_steps_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert message_arrays.pyarrow_unsupported() is None
    assert native.unavailable_reason() is None
    monkeypatch.setattr(pa, "__version__", "15.0.2")
    said = "pyarrow 15.0.2 is older than 16.1.0, the oldest kafka2pc is tested with"
    assert message_arrays.pyarrow_unsupported() == said
    assert native.unavailable_reason() == said  # an executor's tasks take the Python loop
    with pytest.raises(UnsupportedVersionError, match=f"{said}; nothing was written"):
        versions.check_supported("4.2.0")


def test_a_pyarrow_without_view_types_gives_the_native_writer_its_columns_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyarrow 15 has no ``is_string_view``: the writer crashed on it instead of writing."""
    monkeypatch.delattr(pa.types, "is_string_view")
    monkeypatch.delattr(pa.types, "is_binary_view")
    column = pa.array(["a", None, "ccc"])
    assert message_arrays.binary_column(column) is column
    decoded = message_arrays.binary_column(pa.array(["x", "y", "x"]).dictionary_encode())
    assert decoded.to_pylist() == ["x", "y", "x"]
    messages = message_arrays.message_array(message_arrays.binary_column(column))
    assert [int(n) for n in messages["len"]] == [1, 0, 3] and int(messages["payload"][1]) == 0


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str) -> str:
        if key not in self.values:  # as Spark 3.5 answers a setting it does not know (a Py4J error)
            raise RuntimeError(f"[SQL_CONF_NOT_FOUND] {key}")
        return self.values[key]


class _Spark:
    def __init__(self, version: str, values: dict[str, str]) -> None:
        self.version, self.conf = version, _Conf(values)


def test_spark_3_5_s_batches_are_said_to_be_bounded_by_records_only_and_its_byte_setting_is_never_asked() -> None:
    records = {"spark.sql.execution.arrow.maxRecordsPerBatch": "10000"}
    said = arrow_batch_bounds(_Spark("3.5.9", records))
    assert said.startswith(
        "10000 records, no byte bound (Spark 3.5.9 has no spark.sql.execution.arrow.maxBytesPerBatch)"
    )
    assert "lower spark.sql.execution.arrow.maxRecordsPerBatch" in said
    both: dict[str, Any] = {**records, "spark.sql.execution.arrow.maxBytesPerBatch": "67108864b"}
    assert arrow_batch_bounds(_Spark("4.0.5", both)).startswith("10000 records or 67108864b, the bytes checked")
    assert versions.has_arrow_byte_bound("4.0.0") and not versions.has_arrow_byte_bound("3.5.9")
