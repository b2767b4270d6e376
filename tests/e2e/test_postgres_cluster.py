"""The throwaway PostgreSQL of the standalone-Airflow harness: loopback only, passwords, gone after stop()."""

from __future__ import annotations

import socket
from pathlib import Path

import psycopg2  # type: ignore[import-untyped]  # no stubs in the pinned venv
import pytest

from tests.helpers.postgres import PostgresCluster


def test_cluster_starts_on_loopback_with_password_auth_and_is_removed_on_stop(tmp_path: Path) -> None:
    log_copy = tmp_path / "postgres.log"
    with PostgresCluster(user="af", database="afdb", log_copy=log_copy) as pg:
        directory = pg.directory
        assert directory is not None and (directory / "data" / "PG_VERSION").exists()
        assert pg.url().startswith(f"postgresql+psycopg2://af:{pg.password}@127.0.0.1:{pg.port}/afdb")
        assert pg.query("SELECT current_user, current_database(), current_setting('listen_addresses')") == [
            ("af", "afdb", "127.0.0.1")
        ]
        # The role owns its database and can create tables in it (what airflow db migrate needs).
        pg.query("CREATE TABLE probe (id int PRIMARY KEY)")
        pg.query("INSERT INTO probe VALUES (1)")
        assert pg.query("SELECT id FROM probe") == [(1,)]
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=pg.port, user="af", password="wrong", dbname="afdb")
    assert not directory.exists()
    assert "database system is shut down" in log_copy.read_text()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", pg.port))
    pg.stop()  # idempotent
