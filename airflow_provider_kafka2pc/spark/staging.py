"""Staging: the source computed into Arrow files on the executors' host before any transaction opens.

DESIGN §3b.6: keeping computation out of the window may not cost a second pass over the data. A
staging job runs the source's plan once (scans, joins, aggregations) and each task writes the Arrow
batches Spark hands it, the very batches the writer would get, into one Arrow IPC stream file per
partition, counting its records and bytes on the way. No transaction is open while it runs. The
write job then maps those files (zero copy) and moves their records into Kafka: no rows stored in
the JVM and read back, no size job.

The files are local, so the write task of a partition must run on the host that staged it: staging
is used where the driver and every executor share one host (``local[*]``, a single-host cluster).
Elsewhere, on Spark Connect, or with ``checkpoint_dir``, the export materializes with a checkpoint
instead (``spark/window.py``) and says why in the task log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.spark.export_way import ExportWay, WindowTerms, WriteJobEnd, WriteTask, write_rows
from airflow_provider_kafka2pc.txn.protocol.window import PartitionSize
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

log = logging.getLogger(__name__)


def machine_id() -> str:
    """What identifies this machine to the driver: systemd's machine id, else the host name."""
    with contextlib.suppress(OSError), open("/etc/machine-id", encoding="ascii") as f:
        if text := f.read().strip():
            return text
    return socket.gethostname()


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` names an address of this machine (one it can bind to)."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            return True
    return False


def staging_unavailable(spark: Any, store: str, checkpoint_dir: str | None) -> str | None:
    """Why this session cannot stage in local Arrow files (None: it can)."""
    if store == "checkpoint":
        return "store='checkpoint'"
    if checkpoint_dir:
        return "a checkpoint_dir was given (a reliable checkpoint survives a lost host)"
    try:
        sc = spark.sparkContext
    except Exception:
        return ON_CONNECT
    if str(sc.master).startswith("local"):
        return None
    conf = sc.getConf()
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return "dynamic allocation is on: executors may start on other hosts"
    try:
        hosts = {str(e.host()) for e in sc._jsc.sc().statusTracker().getExecutorInfos()}
    except Exception as e:  # read through the JVM: PySpark has no public call for it
        return f"the executors' hosts are unknown ({e!r})"
    elsewhere = sorted(h for h in hosts if not _is_this_machine(h))
    if elsewhere:
        return f"{OTHER_HOSTS} ({', '.join(elsewhere)})"
    return None


# Why staging cannot serve a cluster, where a barrier stage can (``spark/barrier_job.py``).
OTHER_HOSTS = "executors run on other hosts than the driver"
ON_CONNECT = "Spark Connect: the client cannot see where the executors run"
# Written in front of an executor's own file error, so that the driver tells a staging directory the
# executors cannot use (it falls back to a checkpoint) from any failure of the source itself.
STAGING_UNUSABLE = "kafka2pc staging directory unusable"
# The staging directory's name: the driver's pid, so a later export can sweep what a killed one left.
_PREFIX = "kafka2pc-stage-"


def staging_directory(spark: Any) -> str:
    """A new directory of this export's own, under the first of the executors' local directories
    (``SPARK_LOCAL_DIRS``, else the session's ``spark.local.dir``), else the system's temporary
    directory. Directories that exports of processes no longer alive left there are removed first."""
    try:
        local_dirs = os.environ.get("SPARK_LOCAL_DIRS") or str(spark.conf.get("spark.local.dir", "") or "")
    except Exception:
        local_dirs = ""
    parent = local_dirs.split(",")[0].strip() or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    _sweep(parent)
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent)


def _sweep(parent: str) -> None:
    """Remove staging directories whose driver process is gone (a killed task leaves its own)."""
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                log.info("kafka2pc removes %s, left by an export whose process is gone", entry.path)
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's process answers PermissionError: it does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def stage_partition(directory: str, partition: int, task_attempt_id: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one staging task: its batches into a file of its own attempt (named by Spark's
    task attempt id, unique in the application, so that no other attempt, of this stage or of a
    resubmitted one, ever writes or replaces it), one summary row out naming that file. An empty
    partition leaves no file. Also callable without Spark."""
    import pyarrow as pa
    import pyarrow.compute as pc

    records, nbytes = 0, 0
    path = os.path.join(directory, f"part-{partition:05d}-{task_attempt_id}.arrows")
    writer: Any = None
    try:
        sink = open(path, "wb")  # noqa: SIM115 (closed below, or on any failure)
    except OSError as e:
        raise OSError(e.errno, f"{STAGING_UNUSABLE} ({directory}): {e.strerror}") from e
    try:
        with sink:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    writer = pa.ipc.new_stream(sink, batch.schema)
                try:
                    writer.write_batch(batch)
                except OSError as e:  # a full disk: the directory, not the source
                    raise OSError(e.errno, f"{STAGING_UNUSABLE} ({directory}): {e.strerror}") from e
                records += batch.num_rows
                for name in ("value", "key"):
                    if name in batch.schema.names:
                        column = batch.column(batch.schema.names.index(name))
                        nbytes += int(pc.sum(pc.binary_length(column)).as_py() or 0)
            if writer is not None:
                writer.close()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    if not records:
        os.unlink(path)
    row = {
        "partition": partition,
        "records": records,
        "bytes": nbytes,
        "machine": machine_id(),
        "file": os.path.basename(path) if records else "",
    }
    yield pa.RecordBatch.from_pylist([row], schema=_summary_schema())


def staged_batches(directory: str, partition: int, file: str, records: int, machine: str) -> Iterator[Any]:
    """The staged batches of one partition, memory-mapped, checked: on the machine that staged them,
    from the file the successful staging attempt named, exactly ``records`` of them (a partition must
    never be written short). Nothing for an empty partition. The writers copy what they produce, so
    the map may close once the last batch was handed out."""
    import pyarrow as pa

    if records == 0:
        return
    if machine_id() != machine:
        raise RuntimeError(
            f"kafka2pc: partition {partition} was staged on another machine than this write task's; "
            "the task fails so that Spark retries it (staging needs one host for the driver and its executors)"
        )
    path = os.path.join(directory, file)
    seen = 0
    with pa.memory_map(path) as source:  # a missing file raises: never read as an empty partition
        for batch in pa.ipc.open_stream(source):
            seen += batch.num_rows
            yield batch
    if seen != records:
        raise RuntimeError(f"kafka2pc: the staged file of partition {partition} holds {seen} records, not {records}")


def _summary_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("partition", pa.int64()),
            ("records", pa.int64()),
            ("bytes", pa.int64()),
            ("machine", pa.string()),
            ("file", pa.string()),
        ]
    )


@dataclass(frozen=True)
class StagedPartition:
    file: str
    records: int


@dataclass
class StagedFrame(ExportWay):
    """The source, computed and staged: where, how big per partition, how long it took. Task ``p``
    of the write job writes the file staged for partition ``p``, checked against what staging
    counted."""

    directory: str
    partitions: int  # of the source frame: the write job runs one task for each
    sizes: list[PartitionSize]
    seconds: float
    machine: str  # where every partition was staged (``stage`` refuses several)
    files: dict[int, StagedPartition]
    where: str = ""  # said once the files are staged (below)
    _bytes: int = 0

    def __post_init__(self) -> None:
        # The files are final once staged: their size is read once, for the log and the result.
        self._bytes = sum(os.path.getsize(os.path.join(self.directory, f.file)) for f in self.files.values() if f.file)
        self.where = f"{self._bytes} bytes of Arrow files in {self.directory} on the executors' host"

    @property
    def staged_bytes(self) -> int:
        """What the staged files the write reads take on the local disk (the host is the driver's)."""
        return self._bytes

    def write_frame(self, spark: Any) -> Any:
        """The frame the write job maps: one row in each of ``partitions`` partitions, so that task
        ``p`` (a partition id of the source, hence its transactional id) writes the file of ``p``.
        A source with no partition still gets one task, which writes nothing."""
        return spark.range(0, self.partitions, 1, max(self.partitions, 1))

    def write_task(self, settings: ExportSettings, window: WindowTerms, written: Any) -> WriteTask:
        """Each task writes the file of its partition, not its input (the one placeholder row)."""
        from airflow_provider_kafka2pc.txn.two_phase.partition_writer import result_schema

        # Plain values into the tasks' closure: where the files are, which file of which partition
        # and how many records it must yield.
        payload, directory, machine = settings.to_json(), self.directory, self.machine
        files = {p: (f.file, f.records) for p, f in self.files.items()}

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            assert ctx is not None
            for _ in batches:  # the write frame's one placeholder row
                pass
            file, records = files.get(ctx.partitionId(), ("", 0))
            staged = staged_batches(directory, ctx.partitionId(), file, records, machine)
            yield from write_rows(payload, ctx, staged, written)

        return WriteTask(run, result_schema())

    def answered(self, job: WriteJobEnd) -> tuple[list[Any], float, int]:
        """Every staged record was written, partition by partition, or nothing of the run may stand:
        what the write job opened is aborted at once and the prepare fails."""
        from airflow_provider_kafka2pc.spark.errors import CollectError
        from airflow_provider_kafka2pc.spark.write_job import abort_now

        written = {int(r["slot"]): int(r["records"]) for r in job.rows}
        short = {p: (f.records, written.get(p, 0)) for p, f in self.files.items() if written.get(p, 0) != f.records}
        if short:
            said = ", ".join(f"partition {p}: {wrote} of {want}" for p, (want, wrote) in sorted(short.items()))
            raise CollectError(
                f"the write job did not write what was staged ({said} records), and "
                f"{abort_now(job.abort_opened, True)}: nothing of the run is visible. Clear the DAG run to export it "
                "again."
            )
        return job.rows, job.seconds, job.started_ms

    def release(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def stage(df: Any) -> StagedFrame | str:
    """Run the staging job over ``df``: the staged frame, or why it cannot serve (its tasks ran on
    several machines, or not on the driver's), its files then removed. The caller releases it."""
    from pyspark.sql.pandas.types import from_arrow_schema

    started = time.monotonic()
    directory = staging_directory(df.sparkSession)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        yield from stage_partition(directory, ctx.partitionId(), ctx.taskAttemptId(), batches)

    try:
        rows = df.mapInArrow(run, from_arrow_schema(_summary_schema())).collect()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    machines = {str(r["machine"]) for r in rows}
    if not machines <= {machine_id()}:
        shutil.rmtree(directory, ignore_errors=True)  # this host's files; another host's stay in its temp dir
        return f"{OTHER_HOSTS}: staging tasks ran on {len(machines)} machine(s), not only the driver's"
    # Every task reports, empty or not: their number is the frame's partition count, read without
    # df.rdd (which, with adaptive execution, would run the source's shuffles once more).
    sizes = sorted(
        (PartitionSize(int(r["partition"]), int(r["records"]), int(r["bytes"])) for r in rows),
        key=lambda s: s.partition,
    )
    files = {int(r["partition"]): StagedPartition(str(r["file"]), int(r["records"])) for r in rows}
    return StagedFrame(directory, len(rows), sizes, time.monotonic() - started, machine_id(), files)


__all__ = [
    "OTHER_HOSTS",
    "STAGING_UNUSABLE",
    "StagedFrame",
    "StagedPartition",
    "machine_id",
    "stage",
    "stage_partition",
    "staged_batches",
    "staging_directory",
    "staging_unavailable",
]
