"""What a repair announces (``txn/protocol/repair_announcement.py``) and how ``kafka2pc repair`` says
it to Airflow (``cli/repair_announcement.py``). Airflow's side here is a local HTTP server that
parses each posted event with Airflow's own request model (``CreateAssetEventsBody``) and keeps the
events; the real Airflow's answer to the command is in ``tests/e2e/test_airflow_rest.py``, the real
OpenLineage client's in ``tests/integration/test_repair_spark.py``."""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.cli.arguments import UsageError
from airflow_provider_kafka2pc.cli.repair_announcement import AirflowApi, announce, check_announcement_args
from airflow_provider_kafka2pc.txn.protocol.records import Covered, LostTxn, Repair, RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.repair_announcement import (
    TopicShare,
    lineage_repair,
    restored_by_topic,
    topic_event_extra,
    topic_uri,
)

BOOTSTRAP = "b1:9092,b2:9092"
TOKEN = "header.payload.signature"


def repaired(status: RunStatus = RunStatus.REPAIRED) -> RunRecord:
    lost = (
        LostTxn(Covered("orders-1", 7, 0, 10, ("events",), 1_000, "xxh64:10:00"), "timeout"),
        LostTxn(Covered("orders-3", 7, 0, 12, ("audit", "events"), 1_000, "xxh64:12:00"), "timeout"),
    )
    return RunRecord("orders", "dag/run-1", status, 4, 40, 9_000, "d-1", lost,
                     repair=Repair("0f" * 16, "cli", 9_500, 2, 22, 22))  # fmt: skip


def test_each_topic_gets_what_the_repair_restored_there() -> None:
    rec = repaired()
    assert restored_by_topic(rec) == {"audit": TopicShare(12, 1), "events": TopicShare(22, 2)}
    assert topic_event_extra(rec, TopicShare(22, 2)) == {
        "run": "dag/run-1", "records": 22, "transactions": 2,
        "repaired": {"decision": "0f" * 16, "actor": "cli", "restored": 22, "atomic": False},
    }  # fmt: skip
    assert lineage_repair(rec) == {"prefix": "orders", "run": "dag/run-1", "decision": "0f" * 16, "actor": "cli",
                                   "restoredRecords": 22, "restoredTransactions": 2}  # fmt: skip
    assert topic_uri(BOOTSTRAP, "events") == "kafka://b1:9092/events"


class FakeAirflow(ThreadingHTTPServer):
    """The endpoints the command calls, paged as Airflow 3's REST API v2 pages them."""

    def __init__(self, assets: dict[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.assets = assets  # uri -> asset id
        self.events: list[dict[str, Any]] = []
        self.auth: set[str] = set()
        self.redirect_posts = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeAirflow

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _page(self, key: str, items: list[Any], query: dict[str, str]) -> None:
        offset, limit = int(query.get("offset", 0)), int(query.get("limit", 50))
        self._answer(200, {key: items[offset : offset + limit], "total_entries": len(items)})

    def do_GET(self) -> None:
        self.server.auth.add(self.headers["Authorization"])
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/api/v2/assets":  # uri_pattern: a substring (Airflow's ILIKE '%...%')
            found = [{"id": i, "uri": u} for u, i in sorted(self.server.assets.items(), key=lambda kv: kv[1])
                     if query.get("uri_pattern", "") in u]  # fmt: skip
            return self._page("assets", found, query)
        if url.path == "/api/v2/assets/events":
            mine = [e for e in self.server.events if e["asset_id"] == int(query["asset_id"])]
            return self._page("asset_events", mine[::-1] if query.get("order_by") == "-timestamp" else mine, query)
        self._answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        from airflow.api_fastapi.core_api.datamodels.assets import CreateAssetEventsBody

        self.server.auth.add(self.headers["Authorization"])
        if self.server.redirect_posts:
            return self._answer(302, {}, {"Location": "https://elsewhere.invalid/api/v2/assets/events"})
        if self.headers["Authorization"] != f"Bearer {TOKEN}":
            return self._answer(401, {"detail": "Invalid JWT token"})
        raw = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = CreateAssetEventsBody.model_validate(raw)  # Airflow's own request model: the contract
        event = {"id": len(self.server.events) + 1, "asset_id": body.asset_id, "extra": body.extra}
        self.server.events.append(event)
        self._answer(200, event)


@pytest.fixture
def fake_airflow() -> Iterator[FakeAirflow]:
    # Assets whose URI holds the topic's come first (as the pattern finds them), more than a page.
    decoys = {f"kafka://b1:9092/events_{i}": i for i in range(1, 151)}
    server = FakeAirflow(decoys | {"kafka://b1:9092/events": 211, "kafka://b1:9092/audit": 212})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_airflow_gets_one_event_per_restored_topic_once(fake_airflow: FakeAirflow) -> None:
    api, rec = AirflowApi(fake_airflow.url, TOKEN), repaired()
    lines, failed = announce(rec, BOOTSTRAP, api, openlineage=False)
    assert failed == [] and lines == [
        "announced to Airflow: asset event 1 of kafka://b1:9092/audit, 12 records restored",
        "announced to Airflow: asset event 2 of kafka://b1:9092/events, 22 records restored",
    ]
    assert [(e["asset_id"], e["extra"]["records"]) for e in fake_airflow.events] == [(212, 12), (211, 22)]
    assert fake_airflow.events[1]["extra"]["repaired"]["decision"] == "0f" * 16
    assert fake_airflow.auth == {f"Bearer {TOKEN}"}
    # Run again (a failed announcement is retried so), with more than a page of newer events on the
    # topic: nothing is posted twice.
    fake_airflow.events += [{"id": 100 + i, "asset_id": 211, "extra": {"run": f"r{i}"}} for i in range(120)]
    again, failed = announce(rec, BOOTSTRAP, api, openlineage=False)
    assert failed == [] and again == [
        f"announced before: the asset event of kafka://b1:9092/{t} for repair {'0f' * 16}" for t in ("audit", "events")
    ]
    assert len(fake_airflow.events) == 2 + 120


def test_what_failed_is_said_beside_what_was_announced(fake_airflow: FakeAirflow) -> None:
    del fake_airflow.assets["kafka://b1:9092/audit"]
    lines, failed = announce(repaired(), BOOTSTRAP, AirflowApi(fake_airflow.url, TOKEN), openlineage=False)
    assert lines == ["announced to Airflow: asset event 1 of kafka://b1:9092/events, 22 records restored"]
    [why] = failed
    assert why.startswith("Airflow has no asset kafka://b1:9092/audit (no DAG names it"), why
    fake_airflow.assets["kafka://b1:9092/audit"] = 212
    _, [refused] = announce(repaired(), BOOTSTRAP, AirflowApi(fake_airflow.url, "stale"), openlineage=False)
    assert "HTTP 401 (the token in --airflow-api-token-file is refused" in refused, refused
    assert "stale" not in refused
    fake_airflow.redirect_posts = True
    _, [moved] = announce(repaired(), BOOTSTRAP, AirflowApi(fake_airflow.url, TOKEN), openlineage=False)
    assert "with a redirect (HTTP 302) to https://elsewhere.invalid/" in moved, moved
    assert [e["asset_id"] for e in fake_airflow.events] == [211]  # nothing more was posted


def test_only_a_repaired_run_is_announced(fake_airflow: FakeAirflow) -> None:
    for status in (RunStatus.LOST, RunStatus.COMMITTED):
        assert announce(repaired(status), BOOTSTRAP, AirflowApi(fake_airflow.url, TOKEN), openlineage=True) == ([], [])
    assert fake_airflow.events == []


def test_the_token_never_shows_in_a_repr() -> None:
    assert TOKEN not in repr(AirflowApi("https://af:8080", TOKEN))


def args(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"airflow_api_url": None, "airflow_api_token_file": None, "openlineage": False} | given)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"airflow_api_url": "http://user:pw@airflow:8080"}, "must not hold credentials"),
        ({"airflow_api_url": "airflow:8080"}, "give http(s)://HOST[:PORT]"),
        ({"airflow_api_url": "http://airflow:8080"}, "needs --airflow-api-token-file"),
        ({"airflow_api_token_file": "t"}, "without --airflow-api-url"),
        ({"airflow_api_url": "http://airflow:8080", "airflow_api_token_file": "missing"}, "cannot be read"),
        ({"airflow_api_url": "http://airflow:8080", "airflow_api_token_file": "empty"}, "is empty"),
        ({"openlineage": True}, "has no transport to send to (it would use 'console')"),
    ],
)
def test_announcement_settings_are_refused_before_any_repair(
    tmp_path: Path, given: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no openlineage.yml found here
    (tmp_path / "empty").write_text("\n")
    if given.get("airflow_api_token_file") in ("missing", "empty"):
        given = given | {"airflow_api_token_file": str(tmp_path / given["airflow_api_token_file"])}
    with pytest.raises(UsageError, match=re.escape(says)):
        check_announcement_args(args(**given))


def test_the_token_is_tried_before_the_repair(tmp_path: Path, fake_airflow: FakeAirflow) -> None:
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    token = str(tmp_path / "token")
    api = check_announcement_args(args(airflow_api_url=f"{fake_airflow.url}/", airflow_api_token_file=token))
    assert api == AirflowApi(fake_airflow.url, TOKEN) and fake_airflow.auth == {f"Bearer {TOKEN}"}
    assert check_announcement_args(args()) is None
    unreachable = args(airflow_api_url="http://127.0.0.1:9", airflow_api_token_file=token)
    with pytest.raises(UsageError, match=r"cannot be reached.*nothing was repaired"):
        check_announcement_args(unreachable)
