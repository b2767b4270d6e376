#!/usr/bin/env python3
"""Run a real Apicurio Registry on loopback, for tests, CI and demos: a Confluent-compatible schema
registry (its ``/apis/ccompat/v7`` API) with in-memory storage.

The runnable application is Maven Central's ``io.apicurio:apicurio-registry-app`` tar.gz (classifier
``all``: a Quarkus ``quarkus-run.jar`` with its ``lib/``), fetched with ``mvn`` into the same cache as
the Kafka jars and unpacked there. It needs Java 21 or newer, found apart from the Java that runs
Kafka and Spark (see :func:`find_java`). Standard library only, like ``kafka_local.py``::

    schema-registry-local start --dir /tmp/registry            # prints the ccompat URL
    schema-registry-local start --dir /tmp/registry --user alice=secret   # HTTP basic auth required
    schema-registry-local stop --dir /tmp/registry

A test imports this file by path and calls :func:`start_registry` and :func:`stop_registry`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

SCRIPT_DIR = Path(__file__).resolve().parent
if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))

import kafka_local  # noqa: E402  (the sibling script: the cache, its lock, free ports, process checks)

REGISTRY_VERSION = os.environ.get("KAFKA2PC_REGISTRY_VERSION", "3.3.3")
ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
MIN_JAVA = 21  # Apicurio Registry 3.3's classes are Java 21 bytecode (class file version 65)
JAVA_HOME_ENV = "KAFKA2PC_REGISTRY_JAVA_HOME"
# Where Debian, Ubuntu and the Temurin packages install JDKs: searched when no variable names one.
JVM_ROOTS = (Path("/usr/lib/jvm"),)

HOST = kafka_local.HOST
CCOMPAT_PATH = "/apis/ccompat/v7"
STATE_FILE = "registry.json"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0

# One small service for tests: C1 only and a serial GC start it faster on 2 cores.
JVM_OPTS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Djava.awt.headless=true",
)


class RegistryLocalError(RuntimeError):
    """The registry could not be fetched, started, stopped or found."""


class RegistryState(TypedDict):
    version: str
    url: str  # the Confluent-compatible API's base URL
    port: int
    management_port: int
    pid: int | None
    pid_start_ticks: int | None
    dir: str
    log: str
    java: str
    users: list[str]  # the basic-auth users' names (passwords are not kept); empty: no authentication


def _log(message: str) -> None:
    print(f"schema-registry-local: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- fetch


def fetch(version: str = REGISTRY_VERSION) -> Path:
    """Make sure the unpacked application is in the cache; return its directory (``quarkus-run.jar``)."""
    root = kafka_local.cache_dir() / f"apicurio-registry-{version}"
    marker = root.with_name(root.name + ".complete")
    with kafka_local._locked(root.parent / ".fetch.lock"):
        if marker.exists() and (root / "quarkus-run.jar").is_file():
            return root
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RegistryLocalError("mvn not found on PATH; Maven is needed to fetch Apicurio Registry")
        marker.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        download = root.with_name(root.name + ".download")
        shutil.rmtree(download, ignore_errors=True)
        artifact = ARTIFACT.format(version=version)
        command = [mvn, "-q", "-B", "-Dstyle.color=never", "dependency:copy", f"-Dartifact={artifact}"]
        command += [f"-DoutputDirectory={download}"]
        _log(f"fetching {artifact} into {root}")
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        archives = sorted(download.glob("*.tar.gz"))
        if result.returncode != 0 or not archives:
            said = f"{result.stdout}{result.stderr}"
            raise RegistryLocalError(f"{' '.join(command)} failed ({result.returncode}):\n{said}")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(root, filter="data")
        shutil.rmtree(download, ignore_errors=True)
        if not (root / "quarkus-run.jar").is_file():
            raise RegistryLocalError(f"{archives[0].name} holds no quarkus-run.jar")
        marker.write_text(json.dumps({"artifact": artifact}) + "\n")
    return root


# --------------------------------------------------------------------------- Java


def _java_major(java_home: Path) -> int | None:
    """The feature version of the JDK or JRE at ``java_home`` (its ``release`` file), None if unknown."""
    with contextlib.suppress(OSError):
        match = re.search(r'^JAVA_VERSION="(\d+)', (java_home / "release").read_text(), re.MULTILINE)
        if match:
            return int(match.group(1))
    return None


def find_java(minimum: int = MIN_JAVA) -> str:
    """A ``java`` of version ``minimum`` or newer: ``$KAFKA2PC_REGISTRY_JAVA_HOME``, else ``$JAVA_HOME``
    or the ``java`` on PATH when new enough, else the newest JDK under /usr/lib/jvm that is.

    Kafka and Spark keep the machine's default Java; only the registry needs the newer one."""
    named = os.environ.get(JAVA_HOME_ENV)
    if named:
        java = Path(named) / "bin" / "java"
        if not java.is_file():
            raise RegistryLocalError(f"{JAVA_HOME_ENV}={named} has no bin/java")
        return str(java)
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    for root in JVM_ROOTS:
        if root.is_dir():
            found = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
            candidates += sorted(found, key=lambda p: _java_major(p) or 0, reverse=True)
    for home in candidates:
        major = _java_major(home)
        if major is not None and major >= minimum and (home / "bin" / "java").is_file():
            return str(home / "bin" / "java")
    raise RegistryLocalError(
        f"Apicurio Registry {REGISTRY_VERSION} needs Java {minimum} or newer and none was found "
        f"(looked at JAVA_HOME, java on PATH and {', '.join(map(str, JVM_ROOTS))}); "
        f"install one and set {JAVA_HOME_ENV} to its home"
    )


# --------------------------------------------------------------------------- process


def _properties(port: int, management_port: int, users: Mapping[str, str]) -> dict[str, str]:
    props = {
        "quarkus.http.host": HOST,
        "quarkus.http.port": str(port),
        "quarkus.management.host": HOST,
        "quarkus.management.port": str(management_port),
        # In-memory H2 (the application's default SQL store), said explicitly: a test registry keeps nothing.
        "apicurio.storage.kind": "sql",
        "apicurio.storage.sql.kind": "h2",
        "quarkus.banner.enabled": "false",
    }
    if users:
        # Quarkus' embedded user realm (the application ships it) answers HTTP basic auth; every API
        # path requires a user. Quarkus warns that quarkus.http.auth.basic is fixed at build time, yet
        # Apicurio's own authentication mechanism reads it: without it every login is refused.
        props |= {
            "quarkus.http.auth.basic": "true",
            "quarkus.security.users.embedded.enabled": "true",
            "quarkus.security.users.embedded.plain-text": "true",
            "quarkus.http.auth.permission.apis.paths": "/apis/*",
            "quarkus.http.auth.permission.apis.policy": "authenticated",
        }
        props |= {f"quarkus.security.users.embedded.users.{name}": pw for name, pw in users.items()}
    return props


def _alive(state: RegistryState) -> bool:
    node = {"pid": state["pid"], "pid_start_ticks": state["pid_start_ticks"], "config": state["dir"]}
    return kafka_local._alive(node)  # type: ignore[arg-type]  # the fields _alive reads


def _tail(state: RegistryState) -> str:
    return f"----- {state['log']} -----\n{kafka_local._tail(Path(state['log']))}"


def _ready(state: RegistryState) -> bool:
    """The ccompat API answers; a 401 (authentication on) counts as up."""
    try:
        with urllib.request.urlopen(state["url"] + "/subjects", timeout=2.0) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except OSError:
        return False


def load_state(directory: str | Path) -> RegistryState:
    path = Path(directory).resolve() / STATE_FILE
    try:
        state: RegistryState = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RegistryLocalError(f"no registry here: {path} does not exist") from exc
    return state


def start_registry(
    directory: str | Path,
    *,
    port: int | None = None,
    users: Mapping[str, str] | None = None,
    timeout: float = READY_TIMEOUT_S,
    version: str = REGISTRY_VERSION,
) -> RegistryState:
    """Fetch if needed, start the registry detached, wait until its ccompat API answers."""
    root = Path(directory).resolve()
    for name in users or {}:
        # Quarkus reads each password from an environment variable named after the user, in upper case.
        if not re.fullmatch(r"[a-z0-9]+", name):
            raise RegistryLocalError(f"user name {name!r}: use lower-case letters and digits only")
    root.mkdir(parents=True, exist_ok=True)
    with kafka_local._locked(root / ".registry-local.lock"):
        with contextlib.suppress(RegistryLocalError):
            if _alive(load_state(root)):
                raise RegistryLocalError(f"{root} still runs a registry; stop it first")
        app = fetch(version)
        java = find_java()
        chosen = port or kafka_local._free_ports(1)[0]
        management_port = kafka_local._free_ports(1)[0]
        log = root / "registry.log"
        state: RegistryState = {
            "version": version,
            "url": f"http://{HOST}:{chosen}{CCOMPAT_PATH}",
            "port": chosen,
            "management_port": management_port,
            "pid": None,
            "pid_start_ticks": None,
            "dir": str(root),
            "log": str(log),
            "java": java,
            "users": sorted(users or {}),
        }
        props = _properties(chosen, management_port, users or {})
        # Passwords go in the environment (Quarkus reads QUARKUS_... variables), not on a command line
        # that `ps` shows.
        env = dict(os.environ)
        command = [java, *JVM_OPTS]
        for key, value in props.items():
            if key.startswith("quarkus.security.users.embedded.users."):
                env[re.sub(r"[^A-Za-z0-9]", "_", key).upper()] = value
            else:
                command.append(f"-D{key}={value}")
        command += [f"-Dkafka2pc.registry.dir={root}", "-jar", str(app / "quarkus-run.jar")]
        started_at = time.monotonic()
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=root,
                env=env, start_new_session=True,
            )  # fmt: skip
        kafka_local._CHILDREN[process.pid] = process
        info = kafka_local._proc_info(process.pid)
        state["pid"], state["pid_start_ticks"] = process.pid, info[0] if info else None
        kafka_local._write_json(root / STATE_FILE, state)
        deadline = started_at + timeout
        while not _ready(state):
            if not _alive(state):
                raise RegistryLocalError(f"the registry exited while starting\n{_tail(state)}")
            if time.monotonic() > deadline:
                _stop(state, 5.0)
                raise RegistryLocalError(f"the registry did not answer within {timeout:.0f}s\n{_tail(state)}")
            time.sleep(0.25)
    _log(f"Apicurio Registry {version} ready in {time.monotonic() - started_at:.1f}s at {state['url']}")
    return state


def _stop(state: RegistryState, timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if not _alive(state):
            break
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"] or 0, sig)
        deadline = time.monotonic() + wait
        while _alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
    if _alive(state):
        raise RegistryLocalError(f"the registry (pid {state['pid']}) survived SIGKILL")
    state["pid"] = state["pid_start_ticks"] = None


def stop_registry(directory: str | Path, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the registry; ``directory`` and its log stay."""
    root = Path(directory).resolve()
    with kafka_local._locked(root / ".registry-local.lock"):
        state = load_state(root)
        _stop(state, timeout)
        kafka_local._write_json(root / STATE_FILE, state)


# --------------------------------------------------------------------------- CLI


def _user(text: str) -> tuple[str, str]:
    name, sep, password = text.partition("=")
    if not sep or not name or not password:
        raise argparse.ArgumentTypeError(f"expected NAME=PASSWORD, got {text!r}")
    return name, password


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="schema-registry-local",
        description=f"Run Apicurio Registry {REGISTRY_VERSION} (in-memory) on {HOST} from Maven Central.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download and unpack the application into the cache; print its directory")
    sub.add_parser("java", help=f"print the Java {MIN_JAVA}+ the registry would run on")
    start = sub.add_parser("start", help="start a registry; print its Confluent-compatible API URL")
    start.add_argument("--dir", required=True, type=Path)
    start.add_argument("--port", type=int, help="HTTP port (default: a free one)")
    start.add_argument("--user", type=_user, action="append", default=[], metavar="NAME=PASSWORD",
                       help="require HTTP basic auth; repeat for more users")  # fmt: skip
    start.add_argument("--timeout", type=float, default=READY_TIMEOUT_S)
    stop = sub.add_parser("stop", help="stop the registry (SIGTERM, then SIGKILL); keep DIR")
    stop.add_argument("--dir", required=True, type=Path)
    stat = sub.add_parser("status", help="print registry.json and whether it runs")
    stat.add_argument("--dir", required=True, type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
        elif args.command == "java":
            print(find_java())
        elif args.command == "start":
            state = start_registry(args.dir, port=args.port, users=dict(args.user), timeout=args.timeout)
            print(state["url"])
        elif args.command == "stop":
            stop_registry(args.dir)
        elif args.command == "status":
            state = load_state(args.dir)
            alive = _alive(state)
            print(json.dumps({**state, "alive": alive}, indent=2))
            return 0 if alive else 1
    except RegistryLocalError as exc:
        _log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
