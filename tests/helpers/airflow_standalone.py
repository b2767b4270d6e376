"""A real, standalone Airflow 3 (api-server, scheduler, dag-processor, triggerer) for end-to-end tests.

Each component runs as its own process (own process group) against a fresh AIRFLOW_HOME and the
LocalExecutor. The metadata DB is PostgreSQL, as in a deployment: a throwaway cluster on loopback that
the harness starts before ``airflow db migrate`` and removes after the components stopped
(``tests/helpers/postgres.py``). Tests talk to it only through the public REST API v2, with a JWT
obtained from the SimpleAuthManager's ``POST /auth/token``, like any external client would;
``metadata_query()`` looks into the database itself.

Usage::

    with StandaloneAirflow(home, dags_folder, env={"AIRFLOW_CONN_KAFKA": "..."}) as af:
        af.wait_for_dags("my_dag")
        run_id = af.trigger("my_dag")
        assert af.wait_run("my_dag", run_id, timeout=120) == "success"

Component logs (and ``postgres.log``, the server's) stay in ``<home>/logs/components/`` after ``stop()``;
``stop()`` also copies ``<home>/logs`` (components and every task try, trigger lines merged in) to
``keep_logs_in``, by default the run's log folder (``KAFKA2PC_TEST_LOGS``, set by ``scripts/test``), since
the home is a temporary directory that CI does not keep.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import psutil  # type: ignore[import-untyped]  # no stubs in the pinned venv

from tests.helpers.airflow_rest import ADMIN_USER, AirflowHarnessError, AirflowRestApi
from tests.helpers.dag_test_forks import WARM_IMPORTS
from tests.helpers.postgres import PostgresCluster
from tests.helpers.service import Service, free_port

# The project root goes on PYTHONPATH so DAG files (and the tasks they run) can import the provider
# straight from the checkout without installing it.
_REPO_ROOT = Path(__file__).resolve().parents[2]

COMPONENTS: tuple[str, ...] = ("api-server", "scheduler", "dag-processor", "triggerer")

# ``<home>/config/airflow_local_settings.py``, which every Airflow process imports at its start: in
# the components that fork a process per task or per DAG file parse (the scheduler, whose
# LocalExecutor workers are forked from it at its start, the dag-processor, a Celery worker, whose
# pool processes are), the modules the tests' tasks and DAG files import are imported once; every
# task (Airflow's supervisor forks it) and every parse then starts with them, as a fork of the
# dag.test() server does (tests/helpers/dag_test_forks.py). Nothing is configured or run: a module
# imported here is the one the task would import. Only ``__all__`` becomes Airflow's (its settings
# module takes every other public name as one of its own).
_LOCAL_SETTINGS = """import sys as _sys

__all__: list[str] = []

if _sys.argv[1:2] in (["scheduler"], ["dag-processor"]) or _sys.argv[1:3] == ["celery", "worker"]:
    import importlib as _importlib
    import warnings as _warnings

    with _warnings.catch_warnings():
        # As the provider's session_builder does: PySpark warns on import about pandas 3.
        _warnings.filterwarnings(
            "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
        )
        for _name in {modules!r}:
            _importlib.import_module(_name)
"""
# Not the in-process execution API app: only dag.test() serves one (a component's tasks use the api-server's).
_COMPONENT_WARM_IMPORTS = tuple(m for m in WARM_IMPORTS if m != "airflow.api_fastapi.execution_api.app")


@dataclass
class _Component:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


def _default_logs_copy(home: Path) -> Path | None:
    """``<run logs>/airflow-<home's folder>`` when the run keeps logs (scripts/test), else None."""
    from tests.conftest import run_logs_dir  # lazily: conftest is the one place that names the folder

    base = run_logs_dir()
    name = home.parent.name if home.name == "home" else home.name  # tmp_path_factory names the parent
    return base / f"airflow-{name}" if base else None


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class StandaloneAirflow(AirflowRestApi, Service):
    """Start, drive (REST API v2 only) and stop a standalone Airflow; see the module docstring."""

    # The instances of this process that are up: a failed test's report carries their task errors.
    running: set[StandaloneAirflow] = set()  # noqa: RUF012  (a registry, shared on purpose)

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        env: Mapping[str, str] | None = None,
        *,
        parallelism: int = 4,
        startup_timeout: float = 180.0,
        config: Mapping[str, str] | None = None,
        dag_ids: Sequence[str] = (),
        keep_logs_in: Path | None = None,
        address: str = "127.0.0.1",
        metadata_host: str = "127.0.0.1",
    ) -> None:
        """Prepare (but do not start) an instance.

        :param home: AIRFLOW_HOME; created if missing. Logs and airflow.cfg live here (the DB does not).
        :param dags_folder: the DAG files to parse.
        :param env: extra environment for every component and task (``AIRFLOW_CONN_*``, ``PYSPARK_PYTHON``...).
        :param parallelism: LocalExecutor worker processes; they are forked up front, so keep it small.
        :param startup_timeout: seconds for PostgreSQL, ``airflow db migrate`` and all components to be healthy.
        :param config: extra ``AIRFLOW__SECTION__KEY`` overrides, applied after the harness defaults.
        :param dag_ids: DAGs that ``start()`` waits for (parsed and visible in the API) before returning.
        :param keep_logs_in: where ``stop()`` copies ``<home>/logs``; default: a folder named after the home
            in the run's log folder, when there is one (``tests/conftest.py:run_logs_dir``).
        :param address: where the api-server listens (an emulated cluster's host: its address).
        :param metadata_host: where PostgreSQL listens (an emulated cluster: its bridge's address).
        """
        self.dag_ids = tuple(dag_ids)
        self.home = Path(home).resolve()
        self.dags_folder = Path(dags_folder).resolve()
        self.startup_timeout = startup_timeout
        self.address = address
        self.port = free_port()
        self.base_url = f"http://{address}:{self.port}"
        self.log_dir = self.home / "logs" / "components"
        self.postgres = PostgresCluster(host=metadata_host, log_copy=self.log_dir / "postgres.log")
        self.keep_logs_in = keep_logs_in or _default_logs_copy(self.home)
        self._password = secrets.token_urlsafe(16)
        self._components: list[_Component] = []
        self._client: httpx.Client | None = None
        self._token: str | None = None
        self.env = self._build_env(parallelism, env or {}, config or {})
        # Appended to the home's airflow_local_settings.py (a cluster policy, say), names in __all__.
        self.local_settings = ""
        # Measured by start(); tests report them.
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ configuration

    def _build_env(self, parallelism: int, extra_env: Mapping[str, str], config: Mapping[str, str]) -> dict[str, str]:
        # Nothing Airflow-related leaks in from the developer's shell: the instance is defined here only.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        pythonpath = [str(_REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        # Tools a task may spawn (spark-submit, airflow) resolve to this venv, not to whatever is on PATH.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["AIRFLOW_HOME"] = str(self.home)
        # Log files stay complete up to a SIGKILL, and log tails during startup are current.
        env["PYTHONUNBUFFERED"] = "1"
        # >= 64 bytes: the JWTs are HS512-signed and PyJWT warns about shorter keys.
        secret = secrets.token_urlsafe(64)
        settings = {
            "CORE__DAGS_FOLDER": str(self.dags_folder),
            "CORE__LOAD_EXAMPLES": "False",
            "CORE__EXECUTOR": "LocalExecutor",
            # Fork-based LocalExecutor starts all workers at once; tasks talk to the api-server, not to
            # the DB, so the DB's clients stay the four components whatever this is.
            "CORE__PARALLELISM": str(parallelism),
            "CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            # A fresh api-server answers the first task start (PATCH /execution/task-instances/…/run)
            # after 13-16 s on a loaded machine, 64 s at load 20, and nothing else meanwhile; the
            # workers' default (5 s per try, 5 tries: ~35 s) then fails the first task (issue 37).
            "WORKERS__EXECUTION_API_TIMEOUT": "60",
            # The async engine (api-server) gets postgresql+asyncpg, derived by Airflow from this URL.
            "DATABASE__SQL_ALCHEMY_CONN": self.postgres.url("psycopg2"),
            "API__HOST": self.address,
            "API__PORT": str(self.port),
            "API__BASE_URL": self.base_url,
            "API__WORKERS": "1",
            # Every process must sign/verify the same JWTs (REST token, task execution tokens) and
            # session cookies; left to the default, each process could generate its own.
            "API__SECRET_KEY": secret,
            "API_AUTH__JWT_SECRET": secret,
            # A real login (users + a known password file) so the tests use the API like a client would.
            "CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:ADMIN",
            "CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "simple_auth_manager_passwords.json"),
            # An idle scheduler sleeps 1 s between loops (a busy one does not sleep): a task waits up to
            # a second more, the idle instance costs half the CPU of 0.5 s. The scheduler's and the
            # dag-processor's heartbeats only feed their health (threshold: 30 s), so 5 s is plenty;
            # the tasks' own heartbeats are [workers] min_heartbeat_interval, unchanged. The
            # triggerer's stays at 2 s: a cluster's triggerer takeover (airflow_cluster.py) measures
            # its staleness against a 15-s threshold.
            "SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "5",
            "SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "1.0",
            "SCHEDULER__JOB_HEARTBEAT_SEC": "5",
            "TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # A task stuck in "queued" fails in minutes, not after the default 10.
            "SCHEDULER__TASK_QUEUED_TIMEOUT": "180",
            "SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "15",
            # Every DAG file of a test's instance is in its folder before start() (none is added,
            # changed or removed while it runs), and the first listing of the folder happens at the
            # dag-processor's start: later listings find nothing new.
            "DAG_PROCESSOR__REFRESH_INTERVAL": "300",
            "DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "5",
            # Each pass parses every DAG file again, and the tests' DAG files never change while an
            # instance runs: the first pass is enough, the rest is CPU the other test workers need.
            "DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "86400",
            "DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            "DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "150",
            "LOGGING__COLORED_CONSOLE_LOG": "False",
            "LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
        }
        for key, value in settings.items():
            env[f"AIRFLOW__{key}"] = value
        for key, value in config.items():
            env[key if key.startswith("AIRFLOW__") else f"AIRFLOW__{key}"] = value
        env.update(extra_env)
        return env

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start PostgreSQL, migrate, start the four components, wait until the health endpoint says all are up."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.home / "simple_auth_manager_passwords.json").write_text(json.dumps({ADMIN_USER: self._password}))
        (self.home / "config").mkdir(exist_ok=True)
        settings = _LOCAL_SETTINGS.format(modules=_COMPONENT_WARM_IMPORTS)
        (self.home / "config" / "airflow_local_settings.py").write_text(settings + self.local_settings)
        deadline = time.monotonic() + self.startup_timeout
        t0 = time.monotonic()
        atexit.register(self.stop)  # a crashed test session must not leave Airflow (or PostgreSQL) running
        StandaloneAirflow.running.add(self)
        try:
            self.postgres.start()
            self.timings["postgres_ready"] = time.monotonic() - t0
            t1 = time.monotonic()
            self._migrate(deadline)
            self.timings["db_migrate"] = time.monotonic() - t1
            t1 = time.monotonic()
            self._start_components()
            self._wait_healthy(deadline)
            self.timings["components_healthy"] = time.monotonic() - t1
            if self.dag_ids:
                self.wait_for_dags(*self.dag_ids, timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.timings["startup_total"] = time.monotonic() - t0

    def _migrate(self, deadline: float) -> None:
        log_path = self.log_dir / "db-migrate.log"
        with log_path.open("wb") as log:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "airflow", "db", "migrate"],
                    env=self.env,
                    cwd=self.home,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=max(1.0, deadline - time.monotonic()),
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise AirflowHarnessError(f"airflow db migrate timed out:\n{_tail(log_path, 60)}") from e
        if proc.returncode != 0:
            raise AirflowHarnessError(
                f"airflow db migrate exited {proc.returncode}:\n{_tail(log_path, 60)}\n{self.postgres.log_tail()}"
            )

    def _start_components(self) -> None:
        self._spawn("api-server", ["api-server", "--host", self.address, "--port", str(self.port), "--workers", "1"])
        # No serve-logs sidecars: all components share this home, so the api-server reads task logs from
        # disk, and fixed default ports (8793/8794) would clash with concurrently running instances.
        self._spawn("scheduler", ["scheduler", "--skip-serve-logs"])
        self._spawn("dag-processor", ["dag-processor"])
        self._spawn("triggerer", ["triggerer", "--skip-serve-logs"])

    def _argv(self, name: str, args: Sequence[str]) -> list[str]:
        """The command line of component ``name`` (a cluster's harness runs it on a host)."""
        return [sys.executable, "-m", "airflow", *args]

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        proc = subprocess.Popen(
            self._argv(name, args),
            env=self.env,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # Own session = own process group, so stop() can signal the component with all its children.
            start_new_session=True,
        )
        self._components.append(_Component(name, proc, log_path, log_file))

    def _wait_healthy(self, deadline: float) -> None:
        last: object = "no answer yet"
        while True:
            self._check_alive()
            try:
                r = self.client.get("/api/v2/monitor/health", timeout=5)
                if r.status_code == 200:
                    last = health = r.json()
                    if all(
                        isinstance(health.get(part), dict) and health[part].get("status") == "healthy"
                        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                    ):
                        self._login()
                        return
                else:
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
            except httpx.TransportError as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise AirflowHarnessError(
                    f"Airflow not healthy after {self.startup_timeout:.0f}s; last health answer: {last}\n"
                    + self.logs_tail()
                )
            time.sleep(0.5)

    def _check_alive(self) -> None:
        dead = [c for c in self._components if c.proc.poll() is not None]
        if dead:
            names = ", ".join(f"{c.name} (exit {c.proc.returncode})" for c in dead)
            raise AirflowHarnessError(f"Airflow component(s) exited: {names}\n" + self.logs_tail())

    def stop(self, grace: float = 10.0) -> None:
        """Stop the components, then PostgreSQL (fast shutdown; its files are removed).

        Each component gets SIGTERM; its process group and stray descendants still alive after ``grace``
        get SIGKILL. Idempotent. Logs are kept under ``log_dir``.
        """
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        StandaloneAirflow.running.discard(self)
        if self._client is not None:
            self._client.close()
            self._client = None
        try:
            self._stop_components(grace)
        finally:
            if self.postgres.directory is not None:
                self.postgres.stop()
                self.timings["postgres_stop"] = self.postgres.timings["stop"]
            self._keep_logs()

    def _keep_logs(self) -> None:
        # The task logs are the only record of why a task died (a CI failure's home is gone afterwards).
        # Only logs/: the home also holds the admin's password file.
        source = self.home / "logs"
        if self.keep_logs_in is None or not source.is_dir():
            return
        with contextlib.suppress(OSError):
            shutil.copytree(source, self.keep_logs_in, dirs_exist_ok=True)

    def _stop_components(self, grace: float) -> None:
        if not self._components:
            return
        t0 = time.monotonic()
        # Collect descendants first: a task process that changed its session would escape killpg.
        by_pid: dict[int, psutil.Process] = {}
        for c in self._components:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(c.proc.pid)
                by_pid.update((q.pid, q) for q in [p, *p.children(recursive=True)])
        procs = list(by_pid.values())
        # SIGTERM only the component's main process: it shuts its own children down, and a second
        # SIGTERM (e.g. one sent to the whole group) makes the triggerer skip its graceful exit.
        for c in self._components:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace)
        if alive:
            # Seen here: the triggerer waits 10 s for its trigger subprocess, and the api-server can spend
            # seconds in interpreter teardown. The DB is throwaway, so waiting longer buys nothing.
            with (self.log_dir / "harness.log").open("a") as note:
                for p in alive:
                    with contextlib.suppress(psutil.Error):
                        note.write(f"SIGKILL after {grace:.0f}s grace: pid {p.pid} {' '.join(p.cmdline())[:200]}\n")
            # Only groups that still have a live member: a reaped leader's pid could have been reused.
            groups: set[int] = set()
            for p in alive:
                with contextlib.suppress(OSError):
                    groups.add(os.getpgid(p.pid))
            for c in self._components:
                if c.proc.pid in groups:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(c.proc.pid, signal.SIGKILL)
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(alive, timeout=5)
        for c in self._components:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=5)
            c.log_file.close()
        self._components = []
        self.timings["stop"] = time.monotonic() - t0

    def logs_tail(self, lines: int = 40) -> str:
        """The last ``lines`` of every component's log, for failure messages."""
        parts = [f"(component logs in {self.log_dir})"]
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"----- {path.name} (last {lines} lines) -----\n{_tail(path, lines)}")
        if self.postgres.directory is not None:  # running: its log is not copied to log_dir yet
            parts.append(self.postgres.log_tail(lines))
        return "\n".join(parts)

    def metadata_query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one SQL statement on the instance's metadata DB (PostgreSQL), as Airflow's own DB user."""
        return self.postgres.query(sql, params)
