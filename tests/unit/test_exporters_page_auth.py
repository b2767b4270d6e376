"""Every endpoint of the exporters page asks Airflow's auth manager (unit: the page's FastAPI app with
Airflow's own user dependency and a fake auth manager; tests/e2e/test_ui_browser.py proves the same
on a standalone Airflow with the SimpleAuthManager).

- No token: 401 on every endpoint, reads and the acknowledgement alike; a browser opening the page
  itself is sent to Airflow's login page, and back to the page after it.
- A user who may not read DAG runs: 403, and nothing is read from Kafka.
- A viewer reads, but its acknowledgement is refused (403) and nothing is written.
- An editor of the connection must retype the run id (400 otherwise) and send the form from the
  page's own origin (403 otherwise); then the loss is acknowledged, with the user's name in the note.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from airflow_provider_kafka2pc.plugins import page

TOKENS = {"t-admin": "admin", "t-viewer": "viewer", "t-nobody": "nobody"}
ENDPOINTS = (("GET", "/exporters"), ("GET", "/api/exporters"), ("POST", "/exporters/acknowledge"))


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
    asked: list[tuple[str, str, str]] = field(default_factory=list)

    def get_url_login(self, **kwargs: Any) -> str:
        return f"/auth/login?{urlencode({'next': kwargs['next_url']})}"

    async def get_user_from_token(self, token: str) -> User:
        from jwt import InvalidTokenError

        if token not in TOKENS:
            raise InvalidTokenError("unknown token")
        return User(TOKENS[token])

    def is_authorized_dag(self, *, method: str, user: User, **_: Any) -> bool:
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

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, path, headers=headers, follow_redirects=False, **kwargs)


class DecisionLog:
    def close(self) -> None:
        pass


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

    def survey(conn_id: str, prefixes: list[str]) -> dict[str, Any]:
        surveyed.append((conn_id, list(prefixes)))
        return {"conn_id": conn_id, "decision_topic": "d", "decision_topic_exists": True,
                "known_prefixes": {}, "exporters": []}  # fmt: skip

    def acknowledge_loss(_log: object, prefix: str, run: str, note: str) -> None:
        acknowledged.append((prefix, run, note))

    monkeypatch.setattr(security, "get_auth_manager", lambda: auth)  # Airflow's own token check, our manager
    monkeypatch.setattr(page, "get_auth_manager", lambda: auth)
    monkeypatch.setattr(page, "survey", survey)
    monkeypatch.setattr(page, "_hook", lambda _conn_id: Hook())
    monkeypatch.setattr(recovery, "acknowledge_loss", acknowledge_loss)
    with TestClient(page.create_app(), base_url="http://airflow.test") as client:
        yield Page(client, auth, surveyed, acknowledged)


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
    assert exporters_page.surveyed == [] and exporters_page.acknowledged == []
    assert exporters_page.auth.asked == []


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_a_bad_token_or_a_user_without_read_access_is_refused(exporters_page: Page, method: str, path: str) -> None:
    data = FORM if method == "POST" else None
    assert exporters_page.call(method, path, "t-forged", data=data).status_code == 403
    r = exporters_page.call(method, path, "t-nobody", data=data)
    assert r.status_code == 403, r.text
    assert exporters_page.surveyed == [] and exporters_page.acknowledged == []
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
