"""A throwaway PostgreSQL cluster on loopback, for the standalone Airflow's metadata database.

``initdb`` into a fresh temp directory, a server that listens on 127.0.0.1 only (a free port, its
Unix socket inside that directory), one login role and one database owned by it; ``stop()`` is a
fast shutdown and removes every file. Password auth (scram-sha-256) over TCP, trust only on the
cluster's own Unix socket (used here to create the role). Durability is off (``fsync``,
``synchronous_commit``, ``full_page_writes``): the cluster lives for one test module.

The server binaries come from ``pg_config --bindir`` or ``/usr/lib/postgresql/<version>/bin``
(Debian; ``scripts/setup`` installs the ``postgresql`` package when neither has ``initdb``), else
from ``PATH``. PostgreSQL refuses to run as root, so under root the server runs as the
``postgres`` user, which then owns the temp directory. Anything that goes wrong raises
:class:`PostgresError` with the server log's tail: a test that needs the cluster fails, never skips.

Usage::

    with PostgresCluster() as pg:
        engine_url = pg.url()   # postgresql+psycopg2://airflow:...@127.0.0.1:PORT/airflow
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import ipaddress
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]  # no stubs in the pinned venv

from tests.helpers.service import Service, free_port

# The server's OS user when we are root (the Debian package creates it).
_SERVER_OS_USER = "postgres"
# The bootstrap superuser initdb creates; reached over the cluster's own Unix socket only.
_SUPERUSER = "postgres"


class PostgresError(RuntimeError):
    """The cluster could not be created, started, set up or stopped (message carries the log tail)."""


def _version_key(bindir: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(bindir).parent.name)) or (0,)


def find_bindir() -> Path:
    """The directory with ``initdb``, ``pg_ctl`` and ``postgres``; :class:`PostgresError` if none."""
    candidates: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(out.stdout.strip())
    # Debian's server packages live here; pg_config (from libpq-dev) may name another major version's
    # directory than the server that is installed, so these are checked too, newest first.
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    for d in candidates:
        if all(os.access(Path(d) / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    raise PostgresError(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found via pg_config --bindir, "
        "/usr/lib/postgresql/*/bin or PATH; scripts/setup installs Debian's postgresql package"
    )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])
    except OSError as e:
        return f"<cannot read {path}: {e}>"


class PostgresCluster(Service):
    """Create, start, and stop-and-remove one throwaway cluster; see the module docstring."""

    def __init__(
        self,
        *,
        user: str = "airflow",
        database: str = "airflow",
        port: int | None = None,
        host: str = "127.0.0.1",
        log_copy: Path | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        """Prepare (but do not start) a cluster.

        :param user: the login role to create (owner of ``database``); its password is random.
        :param database: the database to create.
        :param port: TCP port; a free one if omitted (known before ``start()``).
        :param host: the one address it listens on: loopback, or the bridge of an emulated cluster
            (tests/helpers/netns.py) whose hosts then log in over TCP from that /24.
        :param log_copy: where ``stop()`` copies the server log before the files are removed.
        :param startup_timeout: seconds for initdb plus the server to accept connections.
        """
        self.user = user
        self.database = database
        self.password = secrets.token_urlsafe(24)
        self.host = host
        self.port = port or free_port(host)
        self.log_copy = log_copy
        self.startup_timeout = startup_timeout
        self.directory: Path | None = None
        self.timings: dict[str, float] = {}
        self._bindir: Path | None = None
        self._run_as: str | None = _SERVER_OS_USER if os.geteuid() == 0 else None
        self._running = False

    # ------------------------------------------------------------------ addresses

    def url(self, driver: str = "psycopg2") -> str:
        """SQLAlchemy URL of the database for ``user`` over TCP (``driver`` e.g. psycopg2, asyncpg)."""
        return f"postgresql+{driver}://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        assert self.directory is not None, "not started"
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        assert self.directory is not None, "not started"
        return self.directory / "server.log"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """initdb, start the server, create the role and the database; raises PostgresError on failure."""
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        self._bindir = find_bindir()
        self.directory = Path(tempfile.mkdtemp(prefix="kafka2pc-pg-"))
        atexit.register(self.stop)  # a crashed test session must not leave a server running
        try:
            if self._run_as is not None:
                try:
                    entry = pwd.getpwnam(self._run_as)
                except KeyError as e:
                    raise PostgresError(
                        f"running as root and there is no {self._run_as!r} user to run PostgreSQL as "
                        "(Debian's postgresql package creates it)"
                    ) from e
                os.chown(self.directory, entry.pw_uid, entry.pw_gid)
            self._initdb(deadline)
            self._configure()
            self._tool(
                "pg_ctl", "start", "-D", str(self.data_dir), "-l", str(self.log_path), "-w",
                "-t", str(max(1, int(deadline - time.monotonic()))),
                deadline=deadline + 5,
            )  # fmt: skip
            self._running = True
            self.timings["start"] = time.monotonic() - t0
            self._create_role_and_database()
            self._wait_login(deadline)
        except BaseException:
            self.stop()
            raise
        self.timings["ready"] = time.monotonic() - t0

    def _initdb(self, deadline: float) -> None:
        self._tool(
            "initdb", "-D", str(self.data_dir), "-U", _SUPERUSER, "--encoding=UTF8", "--locale=C",
            "--auth-local=trust", "--auth-host=scram-sha-256", "--no-instructions",
            deadline=deadline,
        )  # fmt: skip

    def _configure(self) -> None:
        settings = {
            "listen_addresses": f"'{self.host}'",
            "port": str(self.port),
            # The socket stays inside the temp dir: /var/run/postgresql may not exist or be writable.
            "unix_socket_directories": f"'{self.directory}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "log_connections": "off",
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# kafka2pc test cluster\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        # Only this cluster's socket trusts; TCP needs the password, from loopback or the cluster's /24.
        network = "127.0.0.1/32" if self.host == "127.0.0.1" else str(ipaddress.ip_interface(f"{self.host}/24").network)
        (self.data_dir / "pg_hba.conf").write_text(f"local all all trust\nhost all all {network} scram-sha-256\n")

    def _create_role_and_database(self) -> None:
        try:
            conn = psycopg2.connect(
                host=str(self.directory), port=self.port, user=_SUPERUSER, dbname="postgres", connect_timeout=10
            )
        except psycopg2.Error as e:
            raise PostgresError(f"cannot connect as {_SUPERUSER} over the socket: {e}\n{self.log_tail()}") from e
        try:
            conn.autocommit = True  # CREATE DATABASE refuses to run in a transaction
            with conn.cursor() as cur:
                # Identifiers are the harness's own constants; the password is passed as a literal.
                cur.execute(f'CREATE ROLE "{self.user}" LOGIN PASSWORD %s', (self.password,))
                cur.execute(f'CREATE DATABASE "{self.database}" OWNER "{self.user}" ENCODING \'UTF8\'')
                # As Airflow's docs advise: its tables go to (and are found in) the public schema.
                cur.execute(f'ALTER ROLE "{self.user}" SET search_path = public')
        except psycopg2.Error as e:
            raise PostgresError(f"cannot create role/database: {e}\n{self.log_tail()}") from e
        finally:
            conn.close()

    def _wait_login(self, deadline: float) -> None:
        """The way a client comes in: TCP on 127.0.0.1, with the password."""
        while True:
            try:
                psycopg2.connect(
                    host=self.host,
                    port=self.port,
                    user=self.user,
                    password=self.password,
                    dbname=self.database,
                    connect_timeout=5,
                ).close()
                return
            except psycopg2.OperationalError as e:
                if time.monotonic() > deadline:
                    raise PostgresError(f"no login over TCP as {self.user}: {e}\n{self.log_tail()}") from e
                time.sleep(0.2)

    def stop(self) -> None:
        """Fast shutdown (disconnects clients, aborts their transactions), then remove all files. Idempotent."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self.directory is None:
            return
        t0 = time.monotonic()
        try:
            if self._running or (self.data_dir / "postmaster.pid").exists():
                try:
                    self._tool(
                        "pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", deadline=None
                    )
                except PostgresError:
                    self._kill_postmaster()
                self._running = False
            if self.log_copy is not None and self.log_path.exists():
                with contextlib.suppress(OSError):
                    self.log_copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(self.log_path, self.log_copy)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self.timings["stop"] = time.monotonic() - t0

    def _kill_postmaster(self) -> None:
        """Last resort after a failed ``pg_ctl stop``: SIGQUIT (immediate shutdown), then SIGKILL."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)

    # ------------------------------------------------------------------ helpers

    def log_tail(self, lines: int = 40) -> str:
        if self.directory is None:
            return "(no server log: the cluster's files are removed)"
        return f"----- postgres server log (last {lines} lines) -----\n{_tail(self.log_path, lines)}"

    def _tool(self, name: str, *args: str, deadline: float | None) -> None:
        assert self._bindir is not None and self.directory is not None
        timeout = 60.0 if deadline is None else max(1.0, deadline - time.monotonic())
        extra: dict[str, Any] = {}
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            extra = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        if self._run_as is not None:
            env["HOME"] = str(self.directory)
        try:
            out = subprocess.run(
                [str(self._bindir / name), *args],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                **extra,
            )
        except subprocess.TimeoutExpired as e:
            raise PostgresError(f"{name} {' '.join(args[:1])} timed out after {timeout:.0f}s\n{self.log_tail()}") from e
        if out.returncode != 0:
            raise PostgresError(
                f"{name} {' '.join(args)} exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}\n"
                + self.log_tail()
            )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement as ``user`` over TCP and return its rows (for tests that look inside)."""
        conn = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname=self.database
        )
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, tuple(params))
                return list(cur.fetchall()) if cur.description is not None else []
        finally:
            conn.close()
