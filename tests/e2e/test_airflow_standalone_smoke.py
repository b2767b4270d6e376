"""Smoke test of the standalone-Airflow harness: real components, REST API v2 only.

Proves what the operator e2e tests will rely on: a DAG is parsed, a run is triggered, a deferrable task
goes through the triggerer, a failed task is cleared and re-run to success, XComs and logs are readable,
and all of it is kept in the PostgreSQL cluster the harness started (no SQLite file anywhere).
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.airflow_standalone import StandaloneAirflow

pytestmark = pytest.mark.airflow_standalone

DAG_ID = "harness_smoke"

# The marker path is baked into the generated DAG file so the task needs no configuration.
DAG_TEMPLATE = """
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.standard.sensors.time_delta import WaitSensor
from airflow.sdk import DAG, task

MARKER = Path({marker!r})

with DAG({dag_id!r}, schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    # Measured from the task's own start, so it defers however slow the machine is.
    wait = WaitSensor(task_id="wait_deferred", time_to_wait=timedelta(seconds=4), deferrable=True)

    @task(retries=0)
    def fail_once() -> dict:
        if not MARKER.exists():
            MARKER.write_text("first try")
            raise RuntimeError("fail_once: first try fails on purpose")
        return {{"ok": True, "marker": MARKER.read_text()}}

    wait >> fail_once()
"""


def assert_metadata_in_postgres(af: StandaloneAirflow, run_id: str) -> None:
    """What the REST API answered is what Airflow's tables in the harness's PostgreSQL hold."""
    assert af.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == af.postgres.url("psycopg2")
    assert af.metadata_query("SELECT version_num FROM alembic_version"), "airflow db migrate left no version"
    assert af.metadata_query("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", (DAG_ID, run_id)) == [
        ("success",)
    ]
    tries = af.metadata_query(
        "SELECT task_id, try_number, state FROM task_instance_history WHERE dag_id = %s AND run_id = %s",
        (DAG_ID, run_id),
    )
    assert ("fail_once", 1, "failed") in tries, tries
    # The components hold connections to this database while they run.
    clients = af.metadata_query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert clients[0][0] >= 4, clients
    assert not list(af.home.rglob("*.db")), list(af.home.rglob("*.db"))


def test_trigger_fail_clear_succeed(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    marker = tmp_path / "marker"
    (dags / "harness_smoke.py").write_text(textwrap.dedent(DAG_TEMPLATE.format(dag_id=DAG_ID, marker=str(marker))))

    t0 = time.monotonic()
    with StandaloneAirflow(tmp_path / "home", dags, dag_ids=[DAG_ID]) as af:
        ready = time.monotonic() - t0
        af.unpause(DAG_ID)

        seen: dict[str, set[str | None]] = {}

        def record(states: dict[str, str | None]) -> None:
            for task_id, state in states.items():
                seen.setdefault(task_id, set()).add(state)

        run_id = af.trigger(DAG_ID, conf={"from": "smoke"})
        assert af.wait_run(DAG_ID, run_id, timeout=180, on_poll=record, poll=0.5) == "failed"
        states = af.task_states(DAG_ID, run_id)
        assert states == {"wait_deferred": "success", "fail_once": "failed"}, states
        # The sensor sat in "deferred" and was finished by the triggerer (end_from_trigger), not a worker.
        assert "deferred" in seen["wait_deferred"], seen
        assert "Trigger fired event" in af.task_log(DAG_ID, run_id, "wait_deferred", 1)
        assert "fail_once: first try fails on purpose" in af.task_log(DAG_ID, run_id, "fail_once", 1)
        assert af.dag_run(DAG_ID, run_id)["conf"] == {"from": "smoke"}
        first_run = time.monotonic() - t0 - ready

        cleared = af.clear_tasks(DAG_ID, run_id, ["fail_once"], only_failed=True)
        assert cleared == ["fail_once"]
        assert af.wait_run(DAG_ID, run_id, timeout=180) == "success", af.task_states(DAG_ID, run_id)
        assert af.task_states(DAG_ID, run_id) == {"wait_deferred": "success", "fail_once": "success"}
        tries = af.task_tries(DAG_ID, run_id, "fail_once")
        assert [(t["try_number"], t["state"]) for t in tries] == [(1, "failed"), (2, "success")], tries
        assert af.xcom(DAG_ID, run_id, "fail_once") == {"ok": True, "marker": "first try"}
        assert_metadata_in_postgres(af, run_id)
        total = time.monotonic() - t0
    timings = {k: round(v, 1) for k, v in af.timings.items()}
    print(
        f"\nharness timings: {timings}; ready incl. DAG parse {ready:.1f}s; first run {first_run:.1f}s; "
        f"clear+rerun {total - ready - first_run:.1f}s; with stop {time.monotonic() - t0:.1f}s"
    )
    # Everything stopped; logs stay for inspection.
    assert (tmp_path / "home" / "logs" / "components" / "scheduler.log").exists()
