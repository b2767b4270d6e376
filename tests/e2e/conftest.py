"""Fixtures of the end-to-end tests: a fresh Airflow home on SQLite, migrated once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import run_logs_dir
from tests.helpers.airflow_dagtest import DagTester, migrate
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import REPO

E2E_DAGS = REPO / "tests" / "e2e" / "dags"


@pytest.fixture(scope="session")
def dag_tester(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagTester]:
    home = tmp_path_factory.mktemp("airflow_home")
    migrate(home, E2E_DAGS)
    base = run_logs_dir()
    logs = base / "dag-test" if base else home / "runs"
    tester = DagTester(home=home, dags_folder=E2E_DAGS, logs=logs)
    yield tester
    tester.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test on a standalone Airflow carries its tasks' errors: the home is gone after the run."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for af in list(StandaloneAirflow.running):
            errors = af.task_errors(since=call.start)
            if errors:
                report.sections.append((f"airflow task errors ({af.home})", errors))
