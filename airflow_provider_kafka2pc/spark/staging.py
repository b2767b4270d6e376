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

from airflow_provider_kafka2pc.txn.protocol.window import PartitionSize

log = logging.getLogger(__name__)

STORES = ("auto", "arrow", "checkpoint")


def validate_store(store: str) -> str:
    """``store`` when it names a way of ``STORES``; else a ValueError naming the choices."""
    if store not in STORES:
        raise ValueError(f"store={store!r}: choose one of {list(STORES)}")
    return store


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
        return "Spark Connect: the client cannot see where the executors run"
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
        return f"executors run on other hosts than the driver ({', '.join(elsewhere)})"
    return None


def staging_directory(spark: Any) -> str:
    """A new directory of this export's own, under the first of ``spark.local.dir`` if the session
    sets it (where the executors spill), else the system's temporary directory."""
    try:
        local_dirs = str(spark.conf.get("spark.local.dir", "") or "")
    except Exception:
        local_dirs = ""
    parent = local_dirs.split(",")[0].strip() or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="kafka2pc-stage-", dir=parent)


def _file(directory: str, partition: int) -> str:
    return os.path.join(directory, f"part-{partition:05d}.arrows")


def stage_partition(directory: str, partition: int, attempt: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The body of one staging task: its batches into ``part-NNNNN.arrows`` (renamed into place once
    complete, so a retried attempt never reads a torn file), one summary row out. An empty partition
    leaves no file. Also callable without Spark."""
    import pyarrow as pa
    import pyarrow.compute as pc

    records, nbytes = 0, 0
    partial = os.path.join(directory, f"part-{partition:05d}.attempt-{attempt}.partial")
    writer: Any = None
    with open(partial, "wb") as sink:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
            records += batch.num_rows
            for name in ("value", "key"):
                if name in batch.schema.names:
                    nbytes += int(pc.sum(pc.binary_length(batch.column(batch.schema.names.index(name)))).as_py() or 0)
        if writer is not None:
            writer.close()
    if records:
        os.replace(partial, _file(directory, partition))
    else:
        os.unlink(partial)
    row = {"partition": partition, "records": records, "bytes": nbytes, "machine": machine_id()}
    yield pa.RecordBatch.from_pylist([row], schema=_summary_schema())


def staged_batches(directory: str, partition: int) -> Iterator[Any]:
    """The staged batches of one partition, memory-mapped (nothing for an empty partition). The
    writers copy what they produce, so the map may close once the last batch was handed out."""
    import pyarrow as pa

    path = _file(directory, partition)
    if not os.path.exists(path):
        return
    with pa.memory_map(path) as source:
        yield from pa.ipc.open_stream(source)


def _summary_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("partition", pa.int64()), ("records", pa.int64()), ("bytes", pa.int64()), ("machine", pa.string())]
    )


@dataclass
class StagedFrame:
    """The source, computed and staged: where, how big per partition, how long it took."""

    directory: str
    partitions: int  # of the source frame: the write job runs one task for each
    sizes: list[PartitionSize]
    seconds: float
    machines: frozenset[str]

    @property
    def disk_bytes(self) -> int:
        """What the staged files take on the local disk (the host is the driver's)."""
        with os.scandir(self.directory) as entries:
            return sum(e.stat().st_size for e in entries if e.is_file())

    @property
    def where(self) -> str:
        return f"{self.disk_bytes} bytes of Arrow files in {self.directory} on the executors' host"

    def write_frame(self, spark: Any) -> Any:
        """The frame the write job maps: one row in each of ``partitions`` partitions, so that task
        ``p`` (a partition id of the source, hence its transactional id) writes the file of ``p``."""
        return spark.range(0, self.partitions, 1, self.partitions)

    def release(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def stage(df: Any) -> StagedFrame:
    """Run the staging job over ``df``; the caller releases the files (``release``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    started = time.monotonic()
    directory = staging_directory(df.sparkSession)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        yield from stage_partition(directory, ctx.partitionId(), ctx.attemptNumber(), batches)

    try:
        rows = df.mapInArrow(run, from_arrow_schema(_summary_schema())).collect()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    # Every task reports, empty or not: their number is the frame's partition count, read without
    # df.rdd (which, with adaptive execution, would run the source's shuffles once more).
    partitions = len(rows)
    sizes = sorted(
        (PartitionSize(int(r["partition"]), int(r["records"]), int(r["bytes"])) for r in rows),
        key=lambda s: s.partition,
    )
    return StagedFrame(
        directory, partitions, sizes, time.monotonic() - started, frozenset(str(r["machine"]) for r in rows)
    )


__all__ = [
    "STORES",
    "StagedFrame",
    "machine_id",
    "stage",
    "stage_partition",
    "staged_batches",
    "staging_directory",
    "staging_unavailable",
    "validate_store",
]
