"""Staging the computed source in Arrow files (spark/staging.py), without Spark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_kafka2pc.spark.export_way import validate_store
from airflow_provider_kafka2pc.spark.staging import (
    STAGING_UNUSABLE,
    machine_id,
    stage_partition,
    staged_batches,
    staging_directory,
    staging_unavailable,
)
from airflow_provider_kafka2pc.spark.window import WindowSettings


def batches(*sizes: int) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        keys = [f"k{i}" for i in range(start, start + n)]
        out.append(pa.RecordBatch.from_pydict({"key": keys, "value": [f"value-{k}" for k in keys]}))
        start += n
    return out


def staged(directory: Path, partition: int, attempt: int, given: list[pa.RecordBatch]) -> dict[str, Any]:
    (summary,) = list(stage_partition(str(directory), partition, attempt, iter(given)))
    row: dict[str, Any] = summary.to_pylist()[0]
    return row


def read(directory: Path, row: dict[str, Any], machine: str | None = None) -> list[pa.RecordBatch]:
    return list(
        staged_batches(str(directory), row["partition"], row["file"], row["records"], machine or row["machine"])
    )


def test_a_partition_is_staged_whole_and_read_back_batch_by_batch(tmp_path: Path) -> None:
    given = batches(3, 0, 5)
    row = staged(tmp_path, 2, 17, given)
    expected_bytes = sum(len(k) + len(f"value-{k}") for b in given for k in b.column(0).to_pylist())
    assert row == {
        "partition": 2,
        "records": 8,
        "bytes": expected_bytes,
        "machine": machine_id(),
        "file": "part-00002-17.arrows",  # named by the task attempt: no other attempt writes it
    }
    assert sorted(os.listdir(tmp_path)) == ["part-00002-17.arrows"]
    back = read(tmp_path, row)
    assert [b.num_rows for b in back] == [3, 5]  # the empty batch is not staged
    assert pa.Table.from_batches(back).equals(pa.Table.from_batches([given[0], given[2]]))


def test_an_empty_partition_leaves_no_file_and_reads_as_nothing(tmp_path: Path) -> None:
    row = staged(tmp_path, 0, 3, [])
    assert (row["records"], row["file"]) == (0, "")
    assert os.listdir(tmp_path) == []
    assert read(tmp_path, row) == []


def test_a_failed_attempt_leaves_no_file_and_a_later_one_writes_its_own(tmp_path: Path) -> None:
    def failing() -> Any:
        yield from batches(4)
        raise RuntimeError("the task was killed")

    with pytest.raises(RuntimeError):
        list(stage_partition(str(tmp_path), 1, 5, failing()))
    assert os.listdir(tmp_path) == []  # a torn attempt leaves nothing behind to be read
    first, second = staged(tmp_path, 1, 6, batches(2, 2)), staged(tmp_path, 1, 9, batches(1))
    # Two attempts that both finished (a resubmitted stage's zombie): each wrote its own file, and the
    # write task reads only the one the accepted summary names.
    assert sum(b.num_rows for b in read(tmp_path, first)) == 4
    assert sum(b.num_rows for b in read(tmp_path, second)) == 1


def test_a_partition_is_never_written_short(tmp_path: Path) -> None:
    """A missing file, a short one, or a task on another machine fails the write task instead of
    writing a partition partly or not at all."""
    row = staged(tmp_path, 4, 1, batches(3))
    with pytest.raises(RuntimeError, match="staged on another machine"):
        read(tmp_path, row, machine="another-host")
    with pytest.raises(RuntimeError, match="holds 3 records, not 5"):
        read(tmp_path, {**row, "records": 5})
    os.unlink(tmp_path / row["file"])
    with pytest.raises(FileNotFoundError):
        read(tmp_path, row)


def test_a_staging_directory_the_tasks_cannot_write_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=f"{STAGING_UNUSABLE} \\({tmp_path}/gone\\): No such file or directory"):
        staged(tmp_path / "gone", 0, 1, batches(2))


def test_the_store_is_checked_when_the_dag_is_parsed() -> None:
    assert validate_store("auto") == "auto"
    with pytest.raises(ValueError, match=r"store='disk': choose one of \['auto', 'arrow', 'barrier', 'checkpoint'\]"):
        WindowSettings(store="disk")


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class Executor:
    def __init__(self, host: str) -> None:
        self._host = host

    def host(self) -> str:
        return self._host


class Context:
    def __init__(self, master: str, conf: dict[str, str] | None = None, hosts: tuple[str, ...] = ()) -> None:
        self.master = master
        self._conf = Conf(conf or {})
        tracker = type("Tracker", (), {"getExecutorInfos": lambda _self: [Executor(h) for h in hosts]})()
        sc = type("SC", (), {"statusTracker": lambda _self: tracker})()
        self._jsc = type("JSC", (), {"sc": lambda _self: sc})()

    def getConf(self) -> Conf:
        return self._conf


class Session:
    def __init__(self, sc: Context | None, conf: dict[str, str] | None = None) -> None:
        self._sc = sc
        self.conf = Conf(conf or {})

    @property
    def sparkContext(self) -> Context:
        if self._sc is None:
            raise RuntimeError("[NOT_SUPPORTED_WITH_SPARK_CONNECT]")
        return self._sc


def test_staging_where_the_driver_and_every_executor_share_a_host_else_why_not() -> None:
    assert staging_unavailable(Session(Context("local[2]")), "auto", None) is None
    assert (
        staging_unavailable(Session(Context("spark://h:7077", hosts=("127.0.0.1", "localhost"))), "auto", None) is None
    )
    assert staging_unavailable(Session(Context("local[2]")), "checkpoint", None) == "store='checkpoint'"
    assert "checkpoint_dir" in str(staging_unavailable(Session(Context("local[2]")), "auto", "/shared/tmp"))
    assert "Spark Connect" in str(staging_unavailable(Session(None), "auto", None))
    dynamic = Context("yarn", {"spark.dynamicAllocation.enabled": "true"})
    assert "dynamic allocation" in str(staging_unavailable(Session(dynamic), "auto", None))
    remote = Context("spark://h:7077", hosts=("127.0.0.1", "worker-7.invalid"))
    assert staging_unavailable(Session(remote), "auto", None) == (
        "executors run on other hosts than the driver (worker-7.invalid)"
    )


def test_the_staging_directory_is_new_under_the_local_dirs_and_what_dead_exports_left_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    left = tmp_path / "a" / "kafka2pc-stage-999999999-abc"  # no such process
    left.mkdir(parents=True)
    mine = tmp_path / "a" / f"kafka2pc-stage-{os.getpid()}-def"
    mine.mkdir()
    first = staging_directory(Session(Context("local[2]"), {"spark.local.dir": f"{tmp_path}/a,{tmp_path}/b"}))
    second = staging_directory(Session(Context("local[2]"), {"spark.local.dir": f"{tmp_path}/a"}))
    assert first != second
    assert Path(first).parent == Path(second).parent == tmp_path / "a"
    assert Path(first).name.startswith(f"kafka2pc-stage-{os.getpid()}-")
    assert not left.exists() and mine.exists()  # a live process's directory stays
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/executors")
    assert Path(staging_directory(Session(Context("local[2]")))).parent == tmp_path / "executors"
