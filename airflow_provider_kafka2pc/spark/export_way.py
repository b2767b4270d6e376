"""The way a frame goes through the export: one room per way, the same steps in each (DESIGN §3b).

``compute_first`` chooses the way once, before any transaction opens; the export then takes the same
steps whatever it chose, asking the way:

1. ``write_frame``: the frame the write job maps;
2. ``write_task``: the function its tasks run (and whether they run as one barrier stage);
3. ``answered``: what the tasks' rows prove once they answered (or why the run fails);
4. ``dealing``: how it dealt the frame over task slots, recorded before the window for a repair;
5. ``release``: what it stored, freed;

and, for the budget, ``sizes`` (records and bytes per partition, where it counted them) or why not
(``unsized``), and ``seconds`` (computing or storing before the window).

The ways, each in the module of its mechanism:

- ``window.Materialized``: a frame stored already, a plain scan of files, a checkpoint; written as
  stored.
- ``staging.StagedFrame``: Arrow files on the executors' host; each task writes one file.
- ``barrier_job.BarrierPlan``: one barrier stage that computes, agrees the budget, then writes.
- ``InWindow`` (here): computed by the write job itself: ``materialize=False``, or a repair's frame
  dealt again by a shuffle (whose map stage computes it before any write task opens).

Adding a way is adding a class with these steps, not a branch in the export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.txn.protocol.source_files import Dealing
    from airflow_provider_kafka2pc.txn.protocol.window import WindowBudget, WriteRate


# What ``store=`` may name: the way chosen for the frame (auto), or one forced.
STORES = ("auto", "arrow", "barrier", "checkpoint")


def validate_store(store: str) -> str:
    """``store`` when it names a way of ``STORES``; else a ValueError naming the choices."""
    if store not in STORES:
        raise ValueError(f"store={store!r}: choose one of {list(STORES)}")
    return store


class WindowTerms(Protocol):
    """What a way's tasks may need of the export's window settings (``window.WindowSettings``)."""

    @property
    def commit_headroom_ms(self) -> int | None: ...

    @property
    def handover_ms(self) -> int: ...

    def rate(self) -> WriteRate | None: ...


@dataclass(frozen=True)
class WriteJobEnd:
    """A write job that ended: its tasks' rows, its duration and start on the driver (wall-clock
    ms), the budget it ran under, and what aborts what its tasks opened."""

    rows: list[Any]
    seconds: float
    started_ms: int
    budget: WindowBudget | None
    abort_opened: Callable[[], bool] | None


@dataclass(frozen=True)
class WriteTask:
    """What each task of the write job runs: ``function`` over its Arrow batches, yielding rows of
    ``schema`` (a pyarrow schema); ``barrier`` runs all tasks at once, as one barrier stage."""

    function: Callable[[Iterator[Any]], Iterator[Any]]
    schema: Any
    barrier: bool = False


class ExportWay:
    """The steps every way answers; the defaults are those of a frame the write job maps as it is."""

    seconds: float  # what computing or storing the source took before the window
    where: str  # where the source is, said in the task log

    @property
    def staged_bytes(self) -> int:
        """What the way's own files take on disk (staged Arrow files), else 0."""
        return 0

    @property
    def shows_rate(self) -> bool:
        """Whether the write job's time shows this cluster's write rate (a source computed inside the
        write job does not: its time is the source's too)."""
        return True

    def write_frame(self, spark: Any) -> Any:
        """The frame the write job maps (``spark``: the session, for a frame the way makes)."""
        raise NotImplementedError

    def write_task(self, settings: ExportSettings, window: WindowTerms, written: Any) -> WriteTask:
        """Each task writes the rows it is given."""
        from airflow_provider_kafka2pc.txn.two_phase.partition_writer import result_schema

        return WriteTask(rows_task(settings.to_json(), written), result_schema())

    def answered(self, job: WriteJobEnd) -> tuple[list[Any], float, int]:
        """The write rows, the write's duration and its start (wall-clock ms on the driver), from what
        the tasks answered; raises (after aborting what they opened) where the rows prove a failure."""
        return job.rows, job.seconds, job.started_ms

    def dealing(self) -> Dealing | None:
        return None

    def write_slots(self) -> int | None:
        """The task slots the write ran over, where the way chose them (a barrier stage); None: the
        session's."""
        return None

    def unsized(self) -> str:
        """Why the budget has no sizes before the window, for a way that counted none."""
        return f"{self.where}, not sized before writing: only a rate you state pays a pass over the files"

    def release(self) -> None:
        pass


@dataclass
class InWindow(ExportWay):
    """The source computed by the write job itself: nothing stored before the window."""

    df: Any
    seconds: float = 0.0
    where: str = "computed by the write job, inside the window"

    @property
    def shows_rate(self) -> bool:
        return False

    def write_frame(self, spark: Any) -> Any:
        return self.df


def write_rows(payload: str, ctx: Any, batches: Iterator[Any], written: Any) -> Iterator[Any]:
    """One task's write of ``batches`` through the partition writer; ``written`` (an accumulator, or
    None) counts the records for the progress lines."""
    from airflow_provider_kafka2pc.txn.two_phase.partition_writer import write_partition

    for out in write_partition(ExportSettings.from_json(payload), ctx.partitionId(), ctx.attemptNumber(), batches):
        if written is not None:
            written.add(sum(out.column("records").to_pylist()))
        yield out


def rows_task(payload: str, written: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function a task runs to write the rows of its partition."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        yield from write_rows(payload, ctx, batches, written)

    return run


__all__ = [
    "STORES",
    "ExportWay",
    "InWindow",
    "WindowTerms",
    "WriteJobEnd",
    "WriteTask",
    "rows_task",
    "validate_store",
    "write_rows",
]
