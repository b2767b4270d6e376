"""The CPU each test cost, its brokers, Spark, Airflow and actors included: the suite is bound by
two cores, so CPU-s (not seconds) say where a run's time goes.

Each pytest-xdist worker moves itself into a cpuacct cgroup of its own (cgroup v1, as root) before
it starts anything; every process it starts inherits it. The cgroup's counter is read as a test's
setup begins and once its teardown ends, and the difference goes to the teardown report as the
property ``cpu_s`` (``build/test-logs/junit.xml`` keeps it). The controller prints the heaviest
files by CPU-s at the end. Where the cgroup cannot be made (not root, cgroup v2 only), nothing is
measured and nothing else changes. What a session broker burns while idle counts against the test
that runs meanwhile: the cost of keeping it, as the run pays it.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None
_started: dict[str, int] = {}
_per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # file -> [CPU-s, wall-s]


def join_own_group(worker: str) -> None:
    """Move this worker into ``kafka2pc-tests-<pid>-<worker>`` (removed when it ends)."""
    global _group
    for old in CPUACCT.glob("kafka2pc-tests-*"):  # an earlier run's, once its stragglers ended
        with contextlib.suppress(OSError):
            old.rmdir()
    group = CPUACCT / f"kafka2pc-tests-{os.getppid()}-{worker}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    _group = group


def leave_own_group() -> None:
    """Back to the root group; the group goes once its last process (a straggler) has ended."""
    if _group is None:
        return
    with contextlib.suppress(OSError):
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        _group.rmdir()


def _usage_ns() -> int | None:
    if _group is None:
        return None
    try:
        return int((_group / "cpuacct.usage").read_text())
    except (OSError, ValueError):
        return None


def begin(item: pytest.Item) -> None:
    used = _usage_ns()
    if used is not None:
        _started[item.nodeid] = used


def end(item: pytest.Item, report: pytest.TestReport) -> None:
    """Called for the teardown report: the test's CPU-s since its setup began."""
    start, used = _started.pop(item.nodeid, None), _usage_ns()
    if start is not None and used is not None:
        report.user_properties.append(("cpu_s", round((used - start) / 1e9, 1)))


def tally(report: pytest.TestReport) -> None:
    """On the controller: every test's CPU-s and seconds, per file."""
    if report.when != "teardown":
        return
    cpu = dict(report.user_properties).get("cpu_s")
    if cpu is None:
        return
    entry = _per_file[report.nodeid.split("::")[0]]
    entry[0] += float(cpu)


def add_wall(report: pytest.TestReport) -> None:
    _per_file[report.nodeid.split("::")[0]][1] += report.duration


def summary(terminalreporter: pytest.TerminalReporter, top: int = 20) -> None:
    measured = {f: v for f, v in _per_file.items() if v[0] > 0}
    if not measured:
        return
    total = sum(v[0] for v in measured.values())
    terminalreporter.write_sep("=", f"heaviest files by CPU-s (all: {total:,.0f} CPU-s)")
    for name, (cpu, wall) in sorted(measured.items(), key=lambda kv: -kv[1][0])[:top]:
        terminalreporter.write_line(f"{cpu:8.1f} CPU-s {wall:8.1f} s  {name}")
