"""Every endpoint of the exporters page asks Airflow's auth manager (unit: the page's FastAPI app with
Airflow's own user dependency and a fake auth manager; tests/e2e/test_ui_browser.py proves the same
on a standalone Airflow with the SimpleAuthManager).

- No token: 401 on every endpoint, reads and the acknowledgement alike; a browser opening the page
  itself is sent to Airflow's login page, and back to the page after it.
- A user who may not read DAG runs: 403, and nothing is read from Kafka.
- A viewer reads, but its acknowledgement is refused (403) and nothing is written.
- An editor of the connection must retype the run id (400 otherwise) and send the form from the
  page's own origin (403 otherwise); then the loss is acknowledged, with the user's name in the note.
- A repair clears the LOST run's export task (the exporter's claim names it) for a user who may clear
  task instances of its DAG, with the run id retyped, from the page's origin; a viewer is refused
  and nothing is cleared; a run that is not LOST, or was a Spark application's, is refused by name.
  (tests/e2e/test_ui_browser.py clears through the real Airflow's API and repairs the run.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from airflow_provider_kafka2pc.plugins import page, page_access, page_repair

TOKENS = {"t-admin": "admin", "t-viewer": "viewer", "t-nobody": "nobody"}
ENDPOINTS = (
    ("GET", "/exporters"),
    ("GET", "/api/exporters"),
    ("POST", "/exporters/acknowledge"),
    ("POST", "/exporters/repair"),
)


@dataclass(frozen=True)
class User:
    name: str

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


@dataclass
class AuthManager:
    """What the page asks of Airflow's auth manager: readers of DAG runs, editors of connections."""

    readers: frozenset[str] = frozenset({"admin", "viewer"})
    editors: frozenset[str] = frozenset({"admin"})
    clearers: frozenset[str] = frozenset({"admin"})  # may clear task instances (Airflow's User and up)
    asked: list[tuple[str, str, str]] = field(default_factory=list)

    def get_url_login(self, **kwargs: Any) -> str:
        return f"/auth/login?{urlencode({'next': kwargs['next_url']})}"

    async def get_user_from_token(self, token: str) -> User:
        from jwt import InvalidTokenError

        if token not in TOKENS:
            raise InvalidTokenError("unknown token")
        return User(TOKENS[token])

    def is_authorized_dag(self, *, method: str, user: User, access_entity: Any = None, details: Any = None) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

        if method == "PUT":
            assert access_entity is DagAccessEntity.TASK_INSTANCE, access_entity
            self.asked.append(("dag", f"PUT task instances of {details.id}", user.name))
            return user.name in self.clearers
        self.asked.append(("dag", method, user.name))
        return method == "GET" and user.name in self.readers

    def is_authorized_connection(self, *, method: str, details: Any, user: User) -> bool:
        self.asked.append(("connection", f"{method} {details.conn_id}", user.name))
        return method == "PUT" and user.name in self.editors


@dataclass
class Page:
    client: TestClient
    auth: AuthManager
    surveyed: list[tuple[str, list[str]]]
    acknowledged: list[tuple[str, str, str]]
    cleared: list[Any]

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, path, headers=headers, follow_redirects=False, **kwargs)


# The decision log the repair endpoint reads: dag/run_1 LOST (its ids the export task's),
# dag/run_2 COMMITTED, dag/run_3 LOST with an application attempt's ids; "dag.prepare" claimed "orders".
TAG = "a0123456789"


class DecisionLog:
    def close(self) -> None:
        pass

    def read_for(self, prefix: str, run: str | None = None) -> Any:
        from airflow_provider_kafka2pc.txn.protocol.decisions import LogState
        from airflow_provider_kafka2pc.txn.protocol.records import Covered, LostTxn, RunRecord, RunStatus

        def lost(tid: str) -> tuple[LostTxn, ...]:
            return (LostTxn(Covered(tid, 7, 0, 10, ("events-1",), 1_000, "xxh64t:10:00"), "timeout"),)

        undigested = (LostTxn(Covered("orders-1", 7, 0, 10, ("events-1",), 1_000, None), "timeout"),)
        runs = {
            ("orders", "dag/run_1"): RunRecord(
                "orders", "dag/run_1", RunStatus.LOST, 2, 20, 5, "d-1", lost("orders-1")
            ),
            ("orders", "dag/run_2"): RunRecord("orders", "dag/run_2", RunStatus.COMMITTED, 2, 20, 5, "d-2"),
            ("orders", "dag/run_3"): RunRecord(
                "orders", "dag/run_3", RunStatus.LOST, 2, 20, 5, "d-3", lost(f"orders-run_3-{TAG}-1")
            ),
            ("orders", "dag/run_4"): RunRecord("orders", "dag/run_4", RunStatus.LOST, 2, 20, 5, "d-4", undigested),
            ("orders", "other/run_5"): RunRecord(
                "orders", "other/run_5", RunStatus.LOST, 2, 20, 5, "d-5", lost("orders-1")
            ),
        }
        return LogState(runs=runs, claims={"orders": "dag.prepare"})


class Hook:
    def decision_log(self) -> DecisionLog:
        return DecisionLog()


@pytest.fixture
def exporters_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Page]:
    from airflow.api_fastapi.core_api import security

    from airflow_provider_kafka2pc.txn.two_phase import recovery

    auth = AuthManager()
    surveyed: list[tuple[str, list[str]]] = []
    acknowledged: list[tuple[str, str, str]] = []
    cleared: list[Any] = []

    def survey(conn_id: str, prefixes: list[str]) -> dict[str, Any]:
        surveyed.append((conn_id, list(prefixes)))
        return {"conn_id": conn_id, "decision_topic": "d", "decision_topic_exists": True,
                "known_prefixes": {}, "exporters": []}  # fmt: skip

    def acknowledge_loss(_log: object, prefix: str, run: str, note: str) -> None:
        acknowledged.append((prefix, run, note))

    monkeypatch.setattr(security, "get_auth_manager", lambda: auth)  # Airflow's own token check, our manager
    monkeypatch.setattr(page, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(page_access, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(
        page_repair, "clear_export_task", lambda _request, task: cleared.append(task) or ["commit", "prepare"]
    )
    monkeypatch.setattr(page, "survey", survey)
    monkeypatch.setattr(page, "_hook", lambda _conn_id: Hook())
    monkeypatch.setattr(recovery, "acknowledge_loss", acknowledge_loss)
    with TestClient(page.create_app(), base_url="http://airflow.test") as client:
        yield Page(client, auth, surveyed, acknowledged, cleared)


FORM = {"conn_id": "kafka2pc_default", "prefix": "orders", "run": "dag/run_1", "confirm_run": "dag/run_1"}


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_no_token_is_refused_on_every_endpoint(exporters_page: Page, method: str, path: str) -> None:
    r = exporters_page.call(method, path, data=FORM if method == "POST" else None)
    if (method, path) == ("GET", "/exporters"):  # the page: to the login page, and back after it
        assert r.status_code == 303, r.text
        assert r.headers["location"] == f"/auth/login?{urlencode({'next': 'http://airflow.test/exporters'})}"
    else:
        assert r.status_code == 401, r.text
        assert r.json() == {"detail": "Not authenticated"}
    assert exporters_page.surveyed == [] and exporters_page.acknowledged == [] and exporters_page.cleared == []
    assert exporters_page.auth.asked == []


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_a_bad_token_or_a_user_without_read_access_is_refused(exporters_page: Page, method: str, path: str) -> None:
    data = FORM if method == "POST" else None
    assert exporters_page.call(method, path, "t-forged", data=data).status_code == 403
    r = exporters_page.call(method, path, "t-nobody", data=data)
    assert r.status_code == 403, r.text
    assert exporters_page.surveyed == [] and exporters_page.acknowledged == [] and exporters_page.cleared == []
    assert ("dag", "GET", "nobody") in exporters_page.auth.asked


def test_a_viewer_reads_but_cannot_acknowledge(exporters_page: Page) -> None:
    r = exporters_page.call("GET", "/api/exporters", "t-viewer", params={"prefix": "orders"})
    assert r.status_code == 200, r.text
    assert r.json()["can_acknowledge"] is False
    assert exporters_page.call("GET", "/exporters", "t-viewer", params={"prefix": "orders"}).status_code == 200
    assert exporters_page.surveyed == [("kafka2pc_default", ["orders"])] * 2
    r = exporters_page.call("POST", "/exporters/acknowledge", "t-viewer", data=FORM)
    assert r.status_code == 403 and "permission to edit connection 'kafka2pc_default'" in r.text, r.text
    assert exporters_page.acknowledged == []
    assert ("connection", "PUT kafka2pc_default", "viewer") in exporters_page.auth.asked


def test_an_editor_acknowledges_only_with_the_run_retyped_from_the_pages_own_origin(exporters_page: Page) -> None:
    r = exporters_page.call("GET", "/api/exporters", "t-admin", params={"prefix": "orders"})
    assert r.json()["can_acknowledge"] is True
    wrong = {**FORM, "confirm_run": "dag/run_2"}
    r = exporters_page.call("POST", "/exporters/acknowledge", "t-admin", data=wrong)
    assert r.status_code == 400 and "type the run id 'dag/run_1' to confirm" in r.text, r.text
    elsewhere = {"Origin": "http://attacker.test", "Sec-Fetch-Site": "cross-site"}
    r = exporters_page.call("POST", "/exporters/acknowledge", "t-admin", data=FORM, headers=elsewhere)
    assert r.status_code == 403 and "another site" in r.text, r.text
    assert exporters_page.acknowledged == []

    same = {"Origin": "http://airflow.test", "Sec-Fetch-Site": "same-origin"}
    r = exporters_page.call("POST", "/exporters/acknowledge", "t-admin", data={**FORM, "note": "checked"}, headers=same)
    assert r.status_code == 303, r.text
    assert r.headers["location"].startswith("../exporters?") and "acknowledged=dag%2Frun_1" in r.headers["location"]
    assert exporters_page.acknowledged == [("orders", "dag/run_1", "checked (acknowledged in the Airflow UI by admin)")]


SAME_ORIGIN = {"Origin": "http://airflow.test", "Sec-Fetch-Site": "same-origin"}


def test_a_viewer_cannot_repair_and_nothing_is_cleared(exporters_page: Page) -> None:
    r = exporters_page.call("POST", "/exporters/repair", "t-viewer", data=FORM, headers=SAME_ORIGIN)
    assert r.status_code == 403, r.text
    assert "repairing run dag/run_1 needs permission to clear task instances of DAG 'dag'" in r.text, r.text
    assert exporters_page.cleared == []
    assert ("dag", "PUT task instances of dag", "viewer") in exporters_page.auth.asked


def test_a_user_who_may_clear_repairs_by_clearing_the_export_task_with_the_run_retyped(exporters_page: Page) -> None:
    from airflow_provider_kafka2pc.plugins.page_repair import RepairTask

    wrong = {**FORM, "confirm_run": "dag/run_2"}
    r = exporters_page.call("POST", "/exporters/repair", "t-admin", data=wrong, headers=SAME_ORIGIN)
    assert r.status_code == 400 and "type the run id 'dag/run_1' to confirm" in r.text, r.text
    elsewhere = {"Origin": "http://attacker.test", "Sec-Fetch-Site": "cross-site"}
    assert exporters_page.call("POST", "/exporters/repair", "t-admin", data=FORM, headers=elsewhere).status_code == 403
    assert exporters_page.cleared == []
    r = exporters_page.call("POST", "/exporters/repair", "t-admin", data=FORM, headers=SAME_ORIGIN)
    assert r.status_code == 303, r.text
    assert exporters_page.cleared == [RepairTask("dag", "run_1", "prepare")]
    where = r.headers["location"]
    assert (
        where.startswith("../exporters?") and "repairing=dag%2Frun_1" in where and "cleared=commit%2C+prepare" in where
    )
    page_text = exporters_page.call("GET", where.removeprefix(".."), "t-admin").text
    assert "Repair of run dag/run_1 started: Airflow cleared task(s) commit, prepare of the run" in page_text


@pytest.mark.parametrize(
    ("run", "said"),
    [
        ("dag/run_2", "run dag/run_2 of exporter orders is COMMITTED, not LOST"),
        ("dag/run_9", "run dag/run_9 of exporter orders has no run record, not LOST"),
        ("dag/run_3", "was exported by a Spark application (its ids carry a driver attempt's tag), whose submit "
                      "task a clear would only run again; repair it from a shell: kafka2pc repair --prefix orders "
                      "--run dag/run_3"),
        ("other/run_5", "was not exported by an export task of its DAG (the exporter is claimed by dag.prepare); "
                        "repair it from a shell: kafka2pc repair --prefix orders --run other/run_5"),
        ("dag/run_4", "lost transactions that carry no digest of their records (the export had repairable=False, "
                      "wrote a frame stored already, or ran a version before 0.2.0): no repair can prove a re-export "
                      "the same. Re-export the missing part in a run of its own and acknowledge the loss: "
                      "kafka2pc acknowledge --prefix orders --run dag/run_4"),
    ],
)  # fmt: skip
def test_a_run_an_export_task_cannot_repair_is_refused_by_name(exporters_page: Page, run: str, said: str) -> None:
    form = {**FORM, "run": run, "confirm_run": run}
    r = exporters_page.call("POST", "/exporters/repair", "t-admin", data=form, headers=SAME_ORIGIN)
    assert r.status_code == 409 and said in r.json()["detail"], r.text
    assert exporters_page.cleared == []
