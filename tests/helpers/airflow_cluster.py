"""Airflow on the hosts of an emulated cluster (tests/helpers/netns.py), with the Celery executor.

The placement is a deployment's: the api-server, the scheduler and the dag-processor on one host,
the triggerer on a host of its own, each Celery worker on its own host serving the queues it is
given. PostgreSQL (the metadata) and Redis (Debian's redis-server, the Celery broker) listen on
the bridge's address: the root namespace is the cluster's services host. A task reaches the
api-server's execution API at its host's address, as a worker of a real cluster does; the tests
drive the REST API from the root namespace. Every host runs this checkout's venv and sees one
AIRFLOW_HOME (the hosts share the filesystem; their local directories are private), so the
api-server reads task logs from disk and a DAG file is the same on every host.

Queues are given by a cluster policy (``airflow_local_settings.task_policy`` in the home's
``config/``), as a platform team would route tasks: the DAG files stay the user's.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.helpers import netns
from tests.helpers.airflow_rest import AirflowHarnessError
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.service import Service, free_port

PLACEMENT = {"api-server": "airflow", "scheduler": "airflow", "dag-processor": "airflow", "triggerer": "trigger"}
READY_TIMEOUT_S = 120.0
# The prepares on worker1, the commits on worker2: the two phases of a run on two hosts.
WORKERS: dict[str, Sequence[str]] = {"worker1": ("prepare_host",), "worker2": ("commit_host",)}
ROUTES = {"prepare": "prepare_host", "commit": "commit_host"}


class RedisServer(Service):
    """A throwaway redis-server, no persistence, on one address of this machine."""

    def __init__(self, host: str, directory: Path) -> None:
        self.host = host
        self.directory = directory
        self.port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--bind", self.host, "--port", str(self.port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.directory), "--logfile", str(self.directory / "redis.log")]
        # Protected mode refuses every address but loopback when there is no password; only the
        # cluster's private bridge reaches this one.
        argv += ["--protected-mode", "no"]
        # Its own log file; no inherited stdout, which a caller's pipe would wait on after we exit.
        quiet = subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AirflowHarnessError(f"redis-server on {self.host}:{self.port} did not answer PING")
            time.sleep(0.1)

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# Routes a task to a queue by its id's last part (``orders.prepare`` -> ``prepare``) when ``QUEUES``
# names it; every other task keeps the default queue, which every worker serves.
_POLICY = """
__all__ += ["task_policy"]
QUEUES = {queues!r}


def task_policy(task):
    queue = QUEUES.get(task.task_id.rsplit(".", 1)[-1])
    if queue:
        task.queue = queue
"""


class CeleryAirflow(StandaloneAirflow):
    """A standalone Airflow spread over a network's hosts (see the module docstring).

    :param workers: worker host -> the queues its Celery worker serves (``default`` is added).
    :param routes: a task id's last part -> the queue the cluster policy puts it on.
    """

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        network: netns.Network,
        workers: Mapping[str, Sequence[str]],
        routes: Mapping[str, str],
        env: Mapping[str, str] | None = None,
        *,
        config: Mapping[str, str] | None = None,
        dag_ids: Sequence[str] = (),
    ) -> None:
        self.network = network
        self.workers = {host: ("default", *queues) for host, queues in workers.items()}
        self.redis = RedisServer(network.gateway, Path(home).resolve() / "redis")
        celery = {
            "CORE__EXECUTOR": "CeleryExecutor",
            "CELERY__BROKER_URL": self.redis.url,
            "CELERY__WORKER_CONCURRENCY": "2",
            # A task whose host died is failed (then retried) after this, not after the default 5 min;
            # heartbeats go through the api-server, which answers late at load 20: not shorter.
            "SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "CORE__DEFAULT_TASK_RETRY_DELAY": "2",
            # A trigger whose triggerer died moves to a live triggerer after this.
            "TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
        }
        super().__init__(
            home,
            dags_folder,
            env,
            config={**celery, **(config or {})},
            dag_ids=dag_ids,
            address=network.host(PLACEMENT["api-server"]).address,
            metadata_host=network.gateway,
        )
        # The result backend is the metadata database (Airflow's default derives it from sql_alchemy_conn).
        # The policy goes into the home's airflow_local_settings.py, which start() writes.
        self.local_settings = _POLICY.format(queues=dict(routes))
        self._host_of: dict[str, str] = dict(PLACEMENT)

    def start(self) -> None:
        self.redis.start()
        try:
            super().start()
            for host in self.workers:
                self.wait_worker(host)
        except BaseException:
            self.redis.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        try:
            super().stop(grace)
        finally:
            self.redis.stop()

    def _start_components(self) -> None:
        super()._start_components()
        for host, queues in self.workers.items():
            self._start_worker(host, queues)

    def _start_worker(self, host: str, queues: Sequence[str]) -> None:
        self._spawn_on(host, f"celery-{host}", ["celery", "worker", "-H", f"{host}@{host}", "-q", ",".join(queues)])

    def _spawn_on(self, host: str, name: str, args: Sequence[str]) -> None:
        self._host_of[name] = host
        self._spawn(name, [*args, "--skip-serve-logs"])

    def _argv(self, name: str, args: Sequence[str]) -> list[str]:
        return self.network.command(self._host_of[name], super()._argv(name, args))

    def serves(self, queue: str) -> bool:
        """Whether a worker that is up serves ``queue``."""
        return any(queue in queues for queues in self.workers.values())

    def start_worker(self, host: str, queues: Sequence[str]) -> None:
        """A Celery worker on ``host`` (a replacement for a lost host, say); returns once it is ready."""
        self.workers[host] = ("default", *queues)
        since = self._log_size(f"celery-{host}")
        self._start_worker(host, self.workers[host])
        self.wait_worker(host, since)

    def start_triggerer(self, host: str, timeout: float = READY_TIMEOUT_S) -> None:
        """A triggerer on ``host`` (the replacement of one whose host died); returns once its job is
        in the metadata with a heartbeat (the health endpoint tells the newest triggerer's, which
        may be the dead one's for a while)."""
        since = time.time()
        self._spawn_on(host, f"triggerer-{host}", ["triggerer"])
        sql = "SELECT 1 FROM job WHERE job_type = 'TriggererJob' AND hostname = %s"
        sql += " AND latest_heartbeat > to_timestamp(%s)"
        self._wait(f"a triggerer on {host}", lambda: bool(self.metadata_query(sql, (host, since))), timeout)

    def wait_worker(self, host: str, since: int = 0, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the worker of ``host`` has joined (Celery logs ``<host>@<host> ready.`` after byte ``since``)."""
        log = self.log_dir / f"celery-{host}.log"
        ready = f"{host}@{host} ready.".encode()
        self._wait(f"the Celery worker on {host}", lambda: ready in log.read_bytes()[since:], timeout)

    def _log_size(self, name: str) -> int:
        log = self.log_dir / f"{name}.log"
        return log.stat().st_size if log.exists() else 0

    def _wait(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self._check_alive()
            if time.monotonic() > deadline:
                raise AirflowHarnessError(f"{what}: not up after {timeout:.0f} s\n" + self.logs_tail())
            time.sleep(0.5)

    def kill_host(self, host: str) -> int:
        """SIGKILL every process of ``host`` (its components and their tasks); the harness forgets
        them, so a wait on the others goes on. How many processes were killed."""
        killed = self.network.kill_host(host)
        lost = {name for name, on in self._host_of.items() if on == host}
        for c in [c for c in self._components if c.name in lost]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(timeout=10)
            c.log_file.close()
            self._components.remove(c)
        self.workers.pop(host, None)
        return killed
