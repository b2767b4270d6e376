"""The prepare job's progress: how many partitions are done and how many records written, reported
every few seconds to the task log (classic sessions; Spark Connect reports nothing)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """Where the prepare job stands; records count the partitions that finished."""

    partitions_done: int
    partitions: int
    running: int
    failed_attempts: int
    records: int
    elapsed_s: float

    def describe(self) -> str:
        rate = self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"prepare: {self.partitions_done} of {self.partitions} partitions done ({self.running} running, "
            f"{self.failed_attempts} failed attempts), {self.records} records written, {rate:.0f} records/s, "
            f"{self.elapsed_s:.0f} s"
        )


class ProgressReporter:
    """Reports the job every ``interval_s`` and once at the end, from Spark's status tracker and an
    accumulator of the records of finished partitions (Spark merges it as each task succeeds).
    Classic sessions only: Spark Connect has neither."""

    def __init__(self, spark: Any, on_progress: Callable[[Progress], None], interval_s: float) -> None:
        try:
            sc = spark.sparkContext
            self.written: Any = sc.accumulator(0)
            self._tracker: Any = sc.statusTracker()
        except Exception:  # Spark Connect: no SparkContext on the client
            sc, self.written, self._tracker = None, None, None
        self._sc = sc
        # The job runs in a job group of its own, so that the last report finds its stages even when
        # the job ended before the first poll saw it active (the report then said "0 of 0").
        self._group = f"kafka2pc-prepare-{uuid.uuid4().hex[:12]}"
        self._previous_group: str | None = None
        self._on_progress = on_progress
        self._interval_s = interval_s
        self._started = time.monotonic()
        self._stages: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka2pc-progress", daemon=True)

    def __enter__(self) -> ProgressReporter:
        if self._tracker is not None:
            self._previous_group = self._sc.getLocalProperty("spark.jobGroup.id")
            self._sc.setLocalProperty("spark.jobGroup.id", self._group)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._tracker is not None:
            self._sc.setLocalProperty("spark.jobGroup.id", self._previous_group)
            self._thread.join()
            if exc[0] is None:
                self._report()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._report()

    def _report(self) -> None:
        try:
            for job_id in self._tracker.getJobIdsForGroup(self._group):
                job = self._tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    if (info := self._tracker.getStageInfo(stage_id)) is not None:
                        self._stages[stage_id] = info
            # Stages seen active, as last seen or as they ended (the status store keeps them).
            infos = [self._tracker.getStageInfo(i) or info for i, info in self._stages.items()]
            self._on_progress(
                Progress(
                    partitions_done=sum(i.numCompletedTasks for i in infos),
                    partitions=sum(i.numTasks for i in infos),
                    running=sum(i.numActiveTasks for i in infos),
                    failed_attempts=sum(i.numFailedTasks for i in infos),
                    records=int(self.written.value),
                    elapsed_s=time.monotonic() - self._started,
                )
            )
        except Exception as e:  # progress is a courtesy: never fail the export for it
            log.debug("progress report failed: %r", e)


__all__ = ["Progress", "ProgressReporter"]
