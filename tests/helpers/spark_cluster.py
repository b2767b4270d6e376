"""Real Spark processes for tests: a standalone master with workers, on loopback or on the hosts of
an emulated cluster (tests/helpers/netns.py), and a Connect server.

Everything is started from the scripts that ship with the pip-installed pyspark (``bin/spark-class``,
``bin/spark-submit``), each process in its own process group so that stopping it also stops the
executors and Python workers it forked. Logs stay in the given directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import netns
from tests.helpers.kafka import REPO

START_TIMEOUT_S = 120.0


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    assert (home / "bin" / "spark-class").exists() and (home / "jars").is_dir(), f"no Spark launcher in {home}"
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(directory: Path, daemon_memory: str) -> dict[str, str]:
    conf = directory / "conf"
    conf.mkdir(parents=True, exist_ok=True)  # empty: no spark-defaults or spark-env from the machine
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(directory / "local"),
        # The heap of a JVM that the launcher counts as a daemon: master, worker, Connect server.
        SPARK_DAEMON_MEMORY=daemon_memory,
        PYSPARK_PYTHON=sys.executable,
        # Executors and Python workers run in their own work directories, not in the checkout: put
        # the checkout on their path so the test runs with or without the editable install.
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    )
    env.pop("SPARK_REMOTE", None)
    return env


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class _Group:
    directory: Path
    processes: list[_Process] = field(default_factory=list)

    def spawn(
        self, name: str, cmd: list[str], daemon_memory: str = "256m", env: dict[str, str] | None = None
    ) -> _Process:
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                env={**_env(self.directory, daemon_memory), **(env or {})},
                start_new_session=True,  # own process group: executors and Python workers die with it
            )
        p = _Process(name, popen, log)
        self.processes.append(p)
        return p

    def wait_until(self, what: str, ready: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for p in self.processes:
                if p.popen.poll() is not None:
                    raise AssertionError(f"{p.name} exited ({p.popen.returncode}) waiting for {what}:\n{p.tail()}")
            try:
                if ready():
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.tail(1500)}" for p in self.processes)
                raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{logs}")
            time.sleep(0.25)

    def stop(self) -> None:
        # Workers first, master last, so that nothing tries to reconnect in between.
        for p in reversed(self.processes):
            _kill_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in reversed(self.processes):
            with suppress(subprocess.TimeoutExpired):
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            _kill_group(p.popen, signal.SIGKILL)  # the group may still hold executors or Python workers
            p.popen.wait()


def _kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)  # start_new_session: the group id is the process id


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


@dataclass(frozen=True)
class StandaloneCluster:
    master_url: str
    master_ui: str
    worker_dirs: tuple[Path, ...]
    directory: Path

    def state(self) -> Any:
        return _get_json(f"{self.master_ui}/json/")

    def is_answering(self) -> bool:
        """This master, alive, answers on its UI port (not some other Spark app holding the port)."""
        try:
            state = self.state()
        except ValueError:  # a master still starting can answer /json/ with its HTML page (seen in CI)
            return False
        return bool(state["url"] == self.master_url and state["status"] == "ALIVE")


@contextmanager
def standalone_cluster(
    directory: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers on 127.0.0.1; yields once every worker is ALIVE at the master."""
    home = spark_home()
    group = _Group(directory)
    try:
        cluster = _start_master(group, home, directory, workers)
        master_url = cluster.master_url
        for i, work_dir in enumerate(cluster.worker_dirs):
            work_dir.mkdir()
            # Port 0: the worker's RPC endpoint and web UI pick free ports themselves.
            cmd = [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
            cmd += ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
            cmd += ["--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), master_url]
            group.spawn(f"worker{i}", cmd)
        group.wait_until(
            f"{workers} alive workers",
            lambda: sum(w["state"] == "ALIVE" for w in cluster.state()["workers"]) == workers,
        )
        yield cluster
    finally:
        group.stop()


def _start_master(group: _Group, home: Path, directory: Path, workers: int, attempts: int = 3) -> StandaloneCluster:
    """A master on two free ports. Another process may take a port between our choice and the
    master's bind: the master then must not move to the next port (spark.port.maxRetries=0, or
    its UI's address would be another app's), it exits and we start it again on new ports."""
    master = [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
    for attempt in range(attempts):
        port, ui_port = free_port(), free_port()
        cluster = StandaloneCluster(
            f"spark://127.0.0.1:{port}",
            f"http://127.0.0.1:{ui_port}",
            tuple(directory / f"worker{i}" for i in range(workers)),
            directory,
        )
        args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)]
        p = group.spawn(
            f"master{attempt or ''}", [*master, *args], env={"SPARK_MASTER_OPTS": "-Dspark.port.maxRetries=0"}
        )
        try:
            group.wait_until("the master", cluster.is_answering)
            return cluster
        except AssertionError:
            if p.popen.poll() is None or attempt == attempts - 1:
                raise
            group.processes.remove(p)  # it exited (a port was taken): try new ports
    raise AssertionError("unreachable")


# Inside its own namespace a host has every port to itself: the master's can be fixed.
MASTER_PORT, MASTER_UI_PORT = 7077, 8080


def _on_host(network: netns.Network, name: str) -> dict[str, str]:
    """The environment of a Spark daemon on a host, and of the executors and Python workers it starts."""
    h = network.host(name)
    return {"SPARK_LOCAL_IP": h.address, "SPARK_LOCAL_HOSTNAME": h.address, "SPARK_LOCAL_DIRS": str(h.local_dir)}


def start_on_hosts(
    directory: Path, network: netns.Network, master: str, workers: tuple[str, ...], cores: int = 1, memory: str = "1g"
) -> tuple[StandaloneCluster, Callable[[], None]]:
    """A master on host ``master`` and a worker on each of ``workers``, logs in ``directory``; returns
    once every worker is ALIVE at the master, with the function that stops them (destroying the
    network stops them too: a process cannot leave its host's namespace)."""
    group = _Group(directory)
    try:
        return _start_on_hosts(group, network, master, workers, cores, memory), group.stop
    except BaseException:
        group.stop()
        raise


def _start_on_hosts(
    group: _Group, network: netns.Network, master: str, workers: tuple[str, ...], cores: int, memory: str
) -> StandaloneCluster:
    home = spark_home()
    address = network.host(master).address
    cluster = StandaloneCluster(
        f"spark://{address}:{MASTER_PORT}",
        f"http://{address}:{MASTER_UI_PORT}",
        tuple(group.directory / f"worker-{w}" for w in workers),  # outside the private dirs: logs stay readable
        group.directory,
    )
    cmd = [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
    cmd += ["--host", address, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)]
    group.spawn(f"master-{master}", network.command(master, cmd), env=_on_host(network, master))
    group.wait_until("the master", cluster.is_answering)
    for name, work_dir in zip(workers, cluster.worker_dirs, strict=True):
        work_dir.mkdir(exist_ok=True)
        cmd = [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
        cmd += ["--host", network.host(name).address, "--port", "0", "--webui-port", "0"]
        cmd += ["--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), cluster.master_url]
        group.spawn(f"worker-{name}", network.command(name, cmd), env=_on_host(network, name))
    group.wait_until(
        f"{len(workers)} alive workers",
        lambda: sum(w["state"] == "ALIVE" for w in cluster.state()["workers"]) == len(workers),
    )
    return cluster


@dataclass(frozen=True)
class NetnsSparkCluster:
    """A standalone cluster whose master and workers are hosts of ``network``; the driver runs in
    the root namespace and reaches them (and they it) at ``network.gateway``."""

    spark: StandaloneCluster
    network: netns.Network
    master: str
    workers: tuple[str, ...]

    @property
    def master_url(self) -> str:
        return self.spark.master_url

    @property
    def driver_host(self) -> str:
        return self.network.gateway

    def kill_host(self, name: str) -> int:
        return self.network.kill_host(name)

    def cut_link(self, name: str) -> None:
        self.network.cut_link(name)

    def restore_link(self, name: str) -> None:
        self.network.restore_link(name)


@contextmanager
def netns_spark_cluster(
    directory: Path,
    prefix: str,
    workers: tuple[str, ...] = ("spark1", "spark2"),
    master: str = "sparkm",
    cores: int = 1,
    memory: str = "1g",
    others: tuple[str, ...] = (),
) -> Iterator[NetnsSparkCluster]:
    """A network of hosts (``master``, ``workers`` and ``others``, which run no Spark: a broker's)
    owned by this process, with Spark on it; everything is destroyed on exit, and what would remain
    is an error."""
    with netns.owned_network(prefix, (master, *workers, *others), directory) as network:
        cluster, stop = start_on_hosts(directory, network, master, workers, cores, memory)
        try:
            yield NetnsSparkCluster(cluster, network, master, workers)
        finally:
            stop()


@dataclass(frozen=True)
class ConnectServer:
    url: str  # sc://host:port
    directory: Path
    log: Path


@contextmanager
def connect_server(
    directory: Path, master: str = "local[2, 4]", conf: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> Iterator[ConnectServer]:
    """A Spark Connect server (the class shipped in pyspark's spark-connect jar) on 127.0.0.1.

    ``local[2, 4]``: two cores and up to four attempts per task, as on a cluster. ``master`` may be a
    standalone master (the emulated cluster's), with ``conf`` naming the driver's address there and
    the executors' resources, and ``env`` the daemon's environment (``SPARK_LOCAL_IP``).
    """
    home = spark_home()
    group = _Group(directory)
    port = free_port()
    cmd = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    cmd += ["--name", "kafka2pc-connect-tests", "--master", master]
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        # Read by spark-submit only: the executors' Python workers run this interpreter.
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": str(REPO),
    }
    for key, value in {**settings, **(conf or {})}.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd.append("spark-internal")  # spark-submit's name for "the main class is on Spark's own classpath"
    try:
        # Runs the driver and the executor of local mode: Spark refuses a heap under ~450 MB.
        p = group.spawn("connect-server", cmd, daemon_memory="1g", env=env)

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return "Spark Connect server started" in p.tail(100_000)

        group.wait_until("the Spark Connect server", listening)
        yield ConnectServer(f"sc://127.0.0.1:{port}", directory, p.log)
    finally:
        group.stop()
