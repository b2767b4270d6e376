"""Actor processes of the crash tests: each in a process group of its own, its stderr in a file the
test watches for the line that says where it is, then SIGKILLed as a whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from airflow_provider_kafka2pc.txn.protocol.errors import (
    DecisionConflictError,
    NotLostError,
    RepairRefusedError,
    RunAbortedError,
    SourceError,
    TransactionLostError,
)
from tests.helpers.kafka import REPO

# An actor process's exit status: which of the protocol's errors ended it (named on its stderr).
EXIT_STATUS: dict[type[Exception], int] = {
    DecisionConflictError: 10,
    TransactionLostError: 11,
    RunAbortedError: 12,
    SourceError: 13,
    RepairRefusedError: 14,
    NotLostError: 15,
}
PROTOCOL_ERRORS = tuple(EXIT_STATUS)


def report_exit(error: Exception) -> int:
    """Say the error on stderr as ``Name: message`` (the protocol's class name) and return its status."""
    cls, status = next((c, s) for c, s in EXIT_STATUS.items() if isinstance(error, c))
    print(f"{cls.__name__}: {error}", file=sys.stderr, flush=True)
    return status


def spawn(argv: list[str], tmp: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    """An actor in its own process group, its stderr in a file the test can watch."""
    err = tmp / f"{name}-{uuid.uuid4().hex[:6]}.log"
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    return proc, err


def wait_for_line(proc: subprocess.Popen[str], err: Path, needle: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in err.read_text():
        assert proc.poll() is None, f"actor exited {proc.returncode} before {needle!r}: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {needle!r} after {timeout_s} s: {err.read_text()[-3000:]}"
        time.sleep(0.002)


def sigkill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def wait_until_stopped(proc: subprocess.Popen[str], err: Path, timeout_s: float = 120) -> None:
    """Until the kernel shows the actor stopped: a SIGSTOP the test sent, or the one it sends itself
    just after it says "paused"."""
    deadline = time.monotonic() + timeout_s
    while not stopped(proc.pid):
        assert proc.poll() is None, f"actor exited {proc.returncode} before it stopped: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"actor not stopped after {timeout_s} s: {err.read_text()[-3000:]}"
        time.sleep(0.001)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), by its state in /proc; False once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False
