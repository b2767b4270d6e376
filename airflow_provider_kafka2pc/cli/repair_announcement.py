"""What ``kafka2pc repair`` announces of the run it repaired, where the user asks for it (DESIGN §6).

A repair from Airflow (a clear of the run, the exporters page) is announced by the run's commit: an
asset event per topic and the ``kafka2pc_repair`` OpenLineage run facet. A repair from a shell says
the same (``txn/protocol/repair_announcement.py`` builds both):

- ``--airflow-api-url``: an asset event per restored topic, posted through Airflow's public REST API
  (``POST /api/v2/assets/events``), so that DAGs scheduled on the topic run as after a commit. The
  token is read from ``--airflow-api-token-file``, never from the command line. Once: a topic whose
  events already carry this repair's decision gets none, so the command may be run again after a
  failed announcement, and it announces what is missing.
- ``--openlineage``: one COMPLETE event of job ``kafka2pc.repair.{prefix}`` with the restored
  topics as outputs and the facet, through the OpenLineage client configured as its documentation
  says (``OPENLINEAGE_URL``, ``openlineage.yml``, ``OPENLINEAGE__TRANSPORT__*``). Its run id is
  the repair's decision, so a repeat is the same run to a lineage backend.

Both are checked before the repair starts (the client's transport; Airflow reached with the token).
What fails after the repair is said, with exit 3, and the same command again announces what is
missing (an OpenLineage event again as the same run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_kafka2pc.cli.arguments import UsageError
from airflow_provider_kafka2pc.txn.protocol.records import RunRecord, RunStatus
from airflow_provider_kafka2pc.txn.protocol.repair_announcement import (
    announced_decisions,
    kafka_namespace,
    lineage_repair,
    restored_by_topic,
    topic_event_extra,
    topic_uri,
)

PRODUCER = "https://example.invalid/airflow-provider-kafka2pc"  # OpenLineage's producer: who wrote the event
_TIMEOUT_S = 30
_PAGE = 100
_MAX_PAGES = 50  # 5,000 newest events of a topic, or assets whose URI holds the topic's


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error here: urllib would send a POST on as a GET, and the token with it."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True)
class AirflowApi:
    """Airflow's REST API as the command reaches it: its base URL and a JWT (never in a repr)."""

    url: str
    token: str = field(repr=False)

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        target = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(target, data=data, method=method)
        request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(request, timeout=_TIMEOUT_S) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                raise AnnouncementError(
                    f"Airflow answered {method} {path} with a redirect (HTTP {e.code}) to {e.headers.get('Location')}: "
                    "give that address as --airflow-api-url"
                ) from None
            hint = " (the token in --airflow-api-token-file is refused: get a new one)" if e.code in (401, 403) else ""
            raise AnnouncementError(f"Airflow answered {method} {path} with HTTP {e.code}{hint}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise AnnouncementError(f"Airflow's API at {self.url} cannot be reached: {e}") from None
        except ValueError:
            raise AnnouncementError(f"Airflow's API at {self.url} answered {method} {path} with no JSON") from None

    def pages(self, path: str, key: str, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every item of a paged listing, page by page (at most ``_MAX_PAGES``)."""
        for page in range(_MAX_PAGES):
            got = self.call("GET", path, query=query | {"limit": _PAGE, "offset": page * _PAGE})
            items = got.get(key, []) if isinstance(got, dict) else []
            yield from items
            if len(items) < _PAGE:
                return


class AnnouncementError(Exception):
    """The repair is done; its announcement is not (the message says what is missing)."""


def check_announcement_args(args: argparse.Namespace) -> AirflowApi | None:
    """Before the repair: OpenLineage's client and its transport, Airflow's API reached with the
    token (one read), so that a repair is not begun for an announcement that cannot be made."""
    if args.openlineage:
        _check_openlineage()
    if not args.airflow_api_url:
        if args.airflow_api_token_file:
            raise UsageError("--airflow-api-token-file was given without --airflow-api-url")
        return None
    parts = urllib.parse.urlsplit(args.airflow_api_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--airflow-api-url {args.airflow_api_url!r}: give http(s)://HOST[:PORT] of Airflow's API")
    if parts.username or parts.password:
        raise UsageError("--airflow-api-url must not hold credentials: put the token in --airflow-api-token-file")
    if not args.airflow_api_token_file:
        raise UsageError(
            "--airflow-api-url needs --airflow-api-token-file: a file holding a JWT of a user who may read the "
            "exporting DAG's asset events and create asset events (Airflow's POST /auth/token, or your auth "
            "manager's way of issuing one)"
        )
    try:
        token = Path(args.airflow_api_token_file).read_text().strip()
    except OSError as e:
        raise UsageError(f"--airflow-api-token-file cannot be read: {e.strerror}") from None
    if not token:
        raise UsageError(f"--airflow-api-token-file {args.airflow_api_token_file} is empty")
    api = AirflowApi(args.airflow_api_url.rstrip("/"), token)
    try:
        api.call("GET", "/api/v2/assets", query={"limit": 1})
    except AnnouncementError as e:
        raise UsageError(f"--airflow-api-url: {e}; nothing was repaired") from None
    return api


def _check_openlineage() -> None:
    try:
        from openlineage.client import OpenLineageClient
    except ImportError:
        raise UsageError("--openlineage needs the OpenLineage client: pip install openlineage-python") from None
    kind = OpenLineageClient().transport.kind
    if kind in ("console", "noop"):
        raise UsageError(
            f"--openlineage: the OpenLineage client has no transport to send to (it would use {kind!r}): set "
            "OPENLINEAGE_URL, or OPENLINEAGE_CONFIG / openlineage.yml, as OpenLineage's documentation says"
        )


def announce(rec: RunRecord, bootstrap: str, api: AirflowApi | None, openlineage: bool) -> tuple[list[str], list[str]]:
    """Announce REPAIRED run ``rec`` where asked: what was announced, and what failed (each failure
    says what is missing; the same command again announces it)."""
    if rec.status is not RunStatus.REPAIRED:
        return [], []
    lines: list[str] = []
    failed: list[str] = []
    if api is not None:
        try:
            _to_airflow(rec, bootstrap, api, lines)
        except AnnouncementError as e:
            failed.append(str(e))
    if openlineage:
        try:
            lines.append(_to_openlineage(rec, bootstrap))
        except Exception as e:  # the client's transport raises its own errors
            failed.append(f"OpenLineage did not take the event ({type(e).__name__}: {e})")
    return lines, failed


def _to_airflow(rec: RunRecord, bootstrap: str, api: AirflowApi, lines: list[str]) -> None:
    assert rec.repair is not None
    decision = rec.repair.decision_id
    missing = []
    for topic, share in restored_by_topic(rec).items():
        uri = topic_uri(bootstrap, topic)
        found = (a for a in api.pages("/api/v2/assets", "assets", {"uri_pattern": uri, "only_active": "false"})
                 if a.get("uri") == uri)  # fmt: skip
        asset = next(found, None)
        if asset is None:
            missing.append(uri)
            continue
        # Newest first: the repair's event, if any, is among the latest of the topic.
        events = api.pages("/api/v2/assets/events", "asset_events", {"asset_id": asset["id"], "order_by": "-timestamp"})
        if any(decision in announced_decisions([e.get("extra")]) for e in events):  # stops paging once found
            lines.append(f"announced before: the asset event of {uri} for repair {decision}")
            continue
        made = api.call(
            "POST", "/api/v2/assets/events", {"asset_id": asset["id"], "extra": topic_event_extra(rec, share)}
        )
        if not isinstance(made, dict) or not isinstance(made.get("id"), int):
            raise AnnouncementError(f"Airflow did not answer the asset event of {uri} with an event id")
        lines.append(f"announced to Airflow: asset event {made['id']} of {uri}, {share.records} records restored")
    if missing:
        raise AnnouncementError(
            f"Airflow has no asset {', '.join(missing)} (no DAG names it and no run emitted it): nothing was "
            "announced for it. Schedule a DAG on it, then run the same command again: it announces what is missing"
        )


def _to_openlineage(rec: RunRecord, bootstrap: str) -> str:
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import Job, OutputDataset, Run, RunEvent, RunState

    from airflow_provider_kafka2pc.operators.lineage_facets import FACET_NAME, Kafka2PCRepairRunFacet

    assert rec.repair is not None
    run_id = _run_id(rec.repair.decision_id)
    namespace = os.environ.get("OPENLINEAGE_NAMESPACE", "default")
    event = RunEvent(
        eventType=RunState.COMPLETE,
        eventTime=datetime.datetime.now(datetime.UTC).isoformat(),
        run=Run(runId=run_id, facets={FACET_NAME: Kafka2PCRepairRunFacet(repairs=[lineage_repair(rec)])}),
        job=Job(namespace=namespace, name=f"kafka2pc.repair.{rec.prefix}"),
        producer=PRODUCER,
        outputs=[OutputDataset(namespace=kafka_namespace(bootstrap), name=t) for t in restored_by_topic(rec)],
    )
    OpenLineageClient().emit(event)
    return f"announced to OpenLineage: run {run_id} of job {namespace}/kafka2pc.repair.{rec.prefix}"


def _run_id(decision: str) -> str:
    """An OpenLineage run id (a UUID) that is the repair's decision: the same run on every repeat."""
    try:
        return str(uuid.UUID(hex=decision))
    except ValueError:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kafka2pc:repair:{decision}"))


__all__ = ["AirflowApi", "AnnouncementError", "announce", "check_announcement_args"]
