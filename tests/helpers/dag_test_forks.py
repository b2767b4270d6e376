"""A fork server for ``dag.test()`` runs: one process per Airflow home and DAG folder imports Airflow,
the provider, PySpark and confluent-kafka once, and every run is a fork of it.

The suite is bound by the CPU, and a ``dag.test()`` process spent about 4.5 of its ~9 fixed CPU
seconds importing before its first task (measured on a DAG of two Python tasks). A fork starts a
run with those imports done; what the run does after is the same as in a process of its own: it
loads the DAG file afresh, with the run's environment, in a new session (so a test still kills the
run with Spark's JVM as one process group), and writes everything to the run's log file. A run
whose environment changes Airflow's configuration (``AIRFLOW__*``: log levels, OpenLineage) is read
at import, so it is not a fork (``DagTester.start`` starts it as its own process).

The server is single-threaded (a fork copies no thread that holds a lock): it reads requests on
stdin, forks, and reports each child's pid and exit status as JSON lines on its protocol pipe, by
request. Python threads are counted before each fork; the native ones OpenBLAS and jemalloc start
at import have fork handlers of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from tests.helpers.kafka import REPO

# What a run of the tests' DAGs imports before its first task: done once, in the server (and, but
# the execution API's app, in the forking components of the tests' Airflows: airflow_standalone.py).
WARM_IMPORTS = (
    "airflow.sdk",
    "airflow.models",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.api_fastapi.execution_api.app",
    "airflow.providers.standard.operators.python",
    "airflow_provider_kafka2pc.operators.export",
    "airflow_provider_kafka2pc.operators.commit",
    "airflow_provider_kafka2pc.sensors.recovery",
    "pyspark.sql",
    "pyarrow",
    "confluent_kafka",
)


def _prebuild_execution_api() -> None:
    """Build the in-process execution API once, here, for every fork to share.

    ``dag.test()`` serves its tasks' execution API in process (``InProcessExecutionAPI``), and each
    run would build it again and let Cadwyn generate its versioned routers on the first request:
    about 10 CPU seconds per run, more than the rest of a run's Airflow overhead. The app is built by
    Airflow's own ``InProcessExecutionAPI.app`` (its overrides and lifespan included) and Cadwyn's
    routers generated now, without a thread (the server forks); then ``create_task_execution_api_app``
    hands that app to each run's ``InProcessExecutionAPI``, which gives it the run's own DAG bag.
    """
    from airflow.api_fastapi.execution_api import app as execution_api

    built = execution_api.InProcessExecutionAPI().app
    if not getattr(built, "_cadwyn_initialized", True):  # Cadwyn generates its routers lazily, on the first request
        built._cadwyn_initialize()
    execution_api.create_task_execution_api_app = lambda *args, **kwargs: built


def _load_runner() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kafka2pc_dag_test", REPO / "scripts" / "dag_test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child(request: dict[str, Any], protocol_fd: int, runner: Any) -> None:
    """The forked run: never returns."""
    code = 1
    try:
        os.setsid()  # its own process group, as a run started with start_new_session
        os.close(protocol_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        from airflow import settings

        if getattr(settings, "engine", None) is not None:
            settings.engine.dispose(close=False)  # the server's pooled connections are not this process's
        if request.get("code") is not None:  # a Python program on the metadata DB (DagTester.python)
            sys.argv = ["-c", *request["args"]]
            exec(compile(request["code"], "<dag_test_forks request>", "exec"), {"__name__": "__main__"})
        else:
            result = runner.run(request["dag_file"], request["dag_id"], request["conf"])
            print(json.dumps(result))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            # What the interpreter's exit would do: join the threads that are not daemons, then the
            # atexit functions (Spark's session stop).
            shutdown = getattr(threading, "_shutdown", None)
            if shutdown is not None:
                shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server's loop (``python -m tests.helpers.dag_test_forks``): stdin has the requests."""
    protocol_fd = os.dup(1)  # the replies; fd 1 and 2 become the server's own log
    log = os.open(os.environ["KAFKA2PC_FORKS_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import importlib

    for name in WARM_IMPORTS:
        importlib.import_module(name)
    _prebuild_execution_api()
    runner = _load_runner()

    def reply(message: dict[str, Any]) -> None:
        os.write(protocol_fd, (json.dumps(message) + "\n").encode())

    reply({"ready": True})
    pending = b""
    children: dict[int, str] = {}  # pid -> request id: exits are reported by request, never by a reused pid
    stdin_open = True
    while stdin_open or children:
        readable, _, _ = select.select([0] if stdin_open else [], [], [], 0.2)
        if readable:
            chunk = os.read(0, 65536)
            stdin_open = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                key = "?"
                try:
                    request = json.loads(line)
                    key = str(request["id"])
                    if threading.active_count() != 1:
                        reply({"id": key, "refused": f"{threading.active_count()} threads"})
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(request, protocol_fd, runner)
                    children[pid] = key
                    _await_own_group(pid)
                    reply({"id": key, "pid": pid})
                except Exception as e:  # one bad request (or a fork refused) does not end the server
                    reply({"id": key, "refused": repr(e)})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            reply({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})


def _await_own_group(pid: int, timeout_s: float = 5.0) -> None:
    """Until the child has called setsid: a killpg of its pid must reach it from the first reply."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(ProcessLookupError):
        while os.getpgid(pid) != pid and time.monotonic() < deadline:
            time.sleep(0.001)


class ForkedRun:
    """A forked run, as much of ``subprocess.Popen`` as the tests use: pid, poll, wait, returncode."""

    def __init__(self, server: DagTestForks) -> None:
        self.pid = 0
        self.returncode: int | None = None
        self.refused: str | None = None
        self._server = server

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"forked dag.test {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


class DagTestForks:
    """The client of one server: ``fork`` starts a run and returns its handle."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.changed = threading.Condition()
        self._runs: dict[str, ForkedRun] = {}  # by request id
        self._ready: bool | None = None  # None: not yet known; False: the server is gone
        self._next = 0
        self._log = log
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.dag_test_forks"],
            env={**env, "KAFKA2PC_FORKS_LOG": str(log), "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            message = json.loads(line)
            with self.changed:
                run = self._runs.get(str(message.get("id")))
                if "ready" in message:
                    self._ready = bool(message["ready"])
                elif run is not None and "pid" in message:
                    run.pid = int(message["pid"])
                elif run is not None and "exit" in message:
                    run.returncode = int(message["exit"])
                elif run is not None:
                    run.refused = str(message.get("refused"))
                self.changed.notify_all()
        with self.changed:
            # The server is gone; its runs, each in a session of its own, are not: end them, as the
            # end of a run's own process would have.
            self._ready = False
            for run in self._runs.values():
                if run.returncode is None:
                    if run.pid:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(run.pid, signal.SIGKILL)
                    run.returncode = -signal.SIGKILL
            self.changed.notify_all()

    def fork(self, dag_file: Path, dag_id: str, conf: Any, env: dict[str, str], log: Path) -> ForkedRun | None:
        """A forked run, or None when the server cannot fork one (the caller starts a process)."""
        return self._fork({"dag_file": str(dag_file), "dag_id": dag_id, "conf": conf, "env": env}, log)

    def fork_python(self, code: str, args: list[str], env: dict[str, str], log: Path) -> ForkedRun | None:
        """``python -c code *args`` as a fork (Airflow imported), its output in ``log``; None as ``fork``."""
        return self._fork({"code": code, "args": args, "env": env}, log)

    def _fork(self, fields: dict[str, Any], log: Path) -> ForkedRun | None:
        with self.changed:
            if not self.changed.wait_for(lambda: self._ready is not None, 180) or not self._ready:
                return None
            self._next += 1
            key = str(self._next)
            run = self._runs[key] = ForkedRun(self)
            request = {"id": key, **fields}
            try:
                self._stdin.write((json.dumps({**request, "log": str(log)}) + "\n").encode())
                self._stdin.flush()
            except OSError:
                del self._runs[key]
                return None
            # Once asked, the server forks or refuses; giving up here could start the run twice.
            if not self.changed.wait_for(lambda: run.pid or run.refused or run.returncode is not None, 600):
                raise AssertionError(f"the dag.test fork server did not answer in 600 s; its log: {self._log}")
            if not run.pid:
                del self._runs[key]
                return None
            return run

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()  # the server ends once its last run has
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with self.changed:
                groups = [run.pid for run in self._runs.values() if run.pid and run.returncode is None]
            for pid in [*groups, self._proc.pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            self._proc.wait(timeout=30)


if __name__ == "__main__":
    serve()
