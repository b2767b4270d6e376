#!/usr/bin/env python3
"""An emulated cluster on this machine: hosts as Linux network namespaces (run as root).

``start`` makes a bridge (``k2pc-br``, the first free ``10.231.X.1/24``) and a host per namespace
(``k2pc-sparkm``, ``k2pc-spark1``, ...), each with its own address, hostname and private local
directory (tests/helpers/netns.py), then a Spark standalone master on ``sparkm`` and a worker on
each ``sparkN`` host, started from the pip-installed pyspark of this checkout's .venv; ``--kafka``
adds a broker (scripts/kafka-local) on the bridge's address, ``--kafka-hosts`` three brokers on hosts
``kafka1``..``kafka3`` of their own instead; the root namespace and every host reach them. ``--airflow``
(with a broker) adds Airflow with the Celery executor (tests/helpers/airflow_cluster.py): the
api-server, scheduler and dag-processor on host ``airflow``, the triggerer on ``trigger``, a Celery
worker on ``worker1`` (the prepares) and ``worker2`` (the commits), PostgreSQL and Redis on the
bridge, the example DAGs of ``dags/``. The driver runs in the root namespace with
``spark.driver.host`` set to the bridge's address::

    scripts/cluster-local start --kafka-hosts    # prints the master URL, hosts, bootstrap servers
    scripts/cluster-local run spark1 -- hostname
    scripts/cluster-local kill-host spark2       # SIGKILL every process of the host
    scripts/cluster-local cut-link spark1        # its veth down; restore-link brings it back
    scripts/cluster-local stop                   # every process, namespace, veth and the bridge
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers import netns  # noqa: E402  (the checkout's helpers; the scripts are no package)

PREFIX = "k2pc"
DEFAULT_DIR = REPO / "build" / "cluster-local"
SUMMARY = "cluster-local.json"


def _directory(prefix: str, given: Path | None) -> Path:
    """The cluster's directory: given, else where the running network says, else the default."""
    if given:
        return given.resolve()
    try:
        return netns.load(prefix).directory.parent
    except netns.NetnsError:
        return DEFAULT_DIR


def _kafka(directory: Path, command: str, gateway: str | None = None, *options: str) -> str:
    env = dict(os.environ, KAFKA2PC_KAFKA_HOST=gateway) if gateway else dict(os.environ)
    argv = [sys.executable, str(REPO / "scripts" / "kafka_local.py"), command, "--dir", str(directory / "kafka")]
    argv += options
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise netns.NetnsError(f"kafka-local {command} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout.strip()


BROKER_HOSTS = ("kafka1", "kafka2", "kafka3")
AIRFLOW_HOSTS = ("airflow", "trigger", "worker1", "worker2")


def _start_airflow(directory: Path, network: netns.Network, bootstrap: str) -> dict[str, object]:
    """Airflow on the hosts, left running when this process exits; what ``stop`` needs to end it."""
    import atexit

    from tests.helpers.airflow_cluster import ROUTES, WORKERS, CeleryAirflow

    env = {
        "AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps({"conn_type": "kafka2pc", "host": bootstrap}),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": bootstrap,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    af = CeleryAirflow(
        directory / "airflow", REPO / "dags", network, WORKERS, ROUTES, env, dag_ids=["kafka2pc_example"]
    )
    af.start()
    for stop_at_exit in (af.stop, af.postgres.stop):  # the cluster outlives this command
        atexit.unregister(stop_at_exit)
    assert af.postgres.directory is not None and af.redis.proc is not None
    return {
        "api": af.base_url,
        "user": "admin",
        "password_file": str(af.home / "simple_auth_manager_passwords.json"),
        "services": {"postgres_dir": str(af.postgres.directory), "redis_pid": af.redis.proc.pid},
    }


def _stop_services(services: dict[str, object]) -> None:
    """PostgreSQL (fast shutdown) and Redis, which run in the root namespace, then their files."""
    import shutil
    import signal
    import time

    pg = Path(str(services["postgres_dir"]))
    pids = [int(services["redis_pid"])]  # type: ignore[call-overload]
    with contextlib.suppress(OSError, ValueError):
        pids.append(int((pg / "data" / "postmaster.pid").read_text().split()[0]))
    for pid, sig, name in zip(pids, (signal.SIGTERM, signal.SIGINT), (b"redis-server", b"postgres"), strict=False):
        with contextlib.suppress(OSError):  # only ours: a pid from before a reboot may be another's
            if name in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, sig)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    shutil.rmtree(pg, ignore_errors=True)


def start(
    prefix: str,
    directory: Path,
    workers: int,
    kafka: bool,
    kafka_hosts: bool = False,
    airflow: bool = False,
    cores: int = 1,
) -> dict[str, object]:
    from tests.helpers.spark_cluster import start_on_hosts

    if airflow and not (kafka or kafka_hosts):
        raise netns.NetnsError("--airflow needs a broker: add --kafka or --kafka-hosts")
    hosts = tuple(f"spark{i + 1}" for i in range(workers))
    others = (*(BROKER_HOSTS if kafka_hosts else ()), *(AIRFLOW_HOSTS if airflow else ()))
    directory.mkdir(parents=True, exist_ok=True)
    network = netns.create(prefix, ("sparkm", *hosts, *others), directory / "hosts")
    try:
        cluster, _ = start_on_hosts(directory, network, "sparkm", hosts, cores)  # they run on after we exit
        summary: dict[str, object] = {
            "prefix": prefix,
            "directory": str(directory),
            "gateway": network.gateway,
            "master_url": cluster.master_url,
            "master_ui": cluster.master_ui,
            "hosts": {h.name: h.address for h in network.hosts},
            "local_dir": str(network.hosts[0].local_dir),
            "driver_conf": {"spark.driver.host": network.gateway, "spark.driver.bindAddress": network.gateway},
        }
        if kafka_hosts:
            on = [f"--host={network.host(h).address}@{network.host(h).netns}" for h in BROKER_HOSTS]
            summary["bootstrap_servers"] = _kafka(directory, "start", None, "--brokers=3", *on).splitlines()[-1]
        elif kafka:
            summary["bootstrap_servers"] = _kafka(directory, "start", network.gateway).splitlines()[-1]
        if airflow:
            summary["airflow"] = _start_airflow(directory, network, str(summary["bootstrap_servers"]))
    except BaseException:
        stop(prefix, directory)
        raise
    (directory / SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary


def stop(prefix: str, directory: Path) -> list[str]:
    """Idempotent; what is left (nothing, normally)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        _stop_services(json.loads((directory / SUMMARY).read_text())["airflow"]["services"])
    if (directory / "kafka" / "cluster.json").exists():
        _kafka(directory, "stop")
    netns.destroy(prefix)
    (directory / SUMMARY).unlink(missing_ok=True)
    return netns.leftovers(prefix, directory)


def status(prefix: str) -> dict[str, object]:
    network = netns.load(prefix)
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout.splitlines()
    state = {line.split()[0].split("@")[0]: line.split()[1] for line in links if line.strip()}
    hosts = {
        h.name: {"address": h.address, "processes": len(network.pids(h.name)), "link": state.get(h.veth, "absent")}
        for h in network.hosts
    }
    return {"prefix": prefix, "gateway": network.gateway, "hosts": hosts}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cluster-local", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default=PREFIX, help="names of the namespaces and links (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="hosts, a Spark master and workers (and a broker with --kafka)")
    s.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="logs and hosts' dirs (default: build/cluster-local)")
    s.add_argument("--workers", type=int, default=2, choices=(1, 2, 3))
    s.add_argument(
        "--cores",
        type=int,
        default=1,
        choices=(1, 2, 4),
        help="cores a worker offers (2: a session and a Spark Connect server each hold one on every worker)",
    )
    s.add_argument("--kafka", action="store_true", help="a broker on the bridge's address")
    s.add_argument("--kafka-hosts", action="store_true", help="three brokers, each on a host of its own")
    s.add_argument("--airflow", action="store_true", help="Airflow with Celery workers on hosts of their own")
    st = sub.add_parser("stop", help="remove every process, namespace, veth and the bridge (idempotent)")
    st.add_argument("--dir", type=Path, default=None)
    sub.add_parser("status", help="hosts, their processes and links")
    for name, text in (
        ("kill-host", "SIGKILL every process of a host"),
        ("cut-link", "set the host's link down"),
        ("restore-link", "set the host's link up again"),
    ):
        sub.add_parser(name, help=text).add_argument("host")
    run = sub.add_parser("run", help="run a command on a host: run spark1 -- CMD ...")
    run.add_argument("host")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("cluster-local: network namespaces need root; run it as root (nothing was created)", file=sys.stderr)
        return 2
    try:
        if args.command == "start":
            summary = start(
                args.prefix, args.dir.resolve(), args.workers, args.kafka, args.kafka_hosts, args.airflow, args.cores
            )
            print(json.dumps(summary, indent=2))
        elif args.command == "stop":
            left = stop(args.prefix, _directory(args.prefix, args.dir))
            if left:
                print(f"cluster-local: still there after stop: {', '.join(left)}", file=sys.stderr)
                return 1
            print(f"cluster-local: network {args.prefix} stopped, nothing left")
        elif args.command == "status":
            print(json.dumps(status(args.prefix), indent=2))
        elif args.command == "kill-host":
            print(f"cluster-local: killed {netns.load(args.prefix).kill_host(args.host)} processes on {args.host}")
        elif args.command == "cut-link":
            netns.load(args.prefix).cut_link(args.host)
        elif args.command == "restore-link":
            netns.load(args.prefix).restore_link(args.host)
        elif args.command == "run":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.call(netns.load(args.prefix).command(args.host, command))
    except netns.NetnsError as exc:
        print(f"cluster-local: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
