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

Both are checked before the repair starts: a repair that could not be announced is not begun.
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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class AirflowApi:
    """Airflow's REST API as the command reaches it: its base URL and a JWT."""

    url: str
    token: str

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        target = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(target, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            hint = " (the token in --airflow-api-token-file is refused: get a new one)" if e.code in (401, 403) else ""
            raise AnnouncementError(f"Airflow answered {method} {path} with HTTP {e.code}{hint}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise AnnouncementError(f"Airflow's API at {self.url} cannot be reached: {e}") from None


class AnnouncementError(Exception):
    """The repair is done; its announcement is not (the message says what is missing)."""


def check_announcement_args(args: argparse.Namespace) -> AirflowApi | None:
    """Before the repair: the Airflow API's settings, and that OpenLineage's client is there."""
    if args.openlineage:
        try:
            import openlineage.client  # noqa: F401
        except ImportError:
            raise UsageError(
                "--openlineage needs the OpenLineage client: pip install 'airflow-provider-kafka2pc[openlineage]'"
            ) from None
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
            "--airflow-api-url needs --airflow-api-token-file: a file holding a JWT of a user who may create "
            "asset events (Airflow's POST /auth/token, or your auth manager's way of issuing one)"
        )
    try:
        token = Path(args.airflow_api_token_file).read_text().strip()
    except OSError as e:
        raise UsageError(f"--airflow-api-token-file cannot be read: {e.strerror}") from None
    if not token:
        raise UsageError(f"--airflow-api-token-file {args.airflow_api_token_file} is empty")
    return AirflowApi(args.airflow_api_url.rstrip("/"), token)


def announce(rec: RunRecord, bootstrap: str, api: AirflowApi | None, openlineage: bool) -> list[str]:
    """Announce REPAIRED run ``rec`` where asked; the lines say what was announced. Raises
    AnnouncementError after announcing what it could."""
    if rec.status is not RunStatus.REPAIRED or (api is None and not openlineage):
        return []
    lines: list[str] = []
    if openlineage:
        lines.append(_to_openlineage(rec, bootstrap))
    if api is not None:
        lines.extend(_to_airflow(rec, bootstrap, api))
    return lines


def _to_airflow(rec: RunRecord, bootstrap: str, api: AirflowApi) -> list[str]:
    assert rec.repair is not None
    decision = rec.repair.decision_id
    # Its events can only follow the repair; an hour allows for the clocks of this host and Airflow's.
    since = datetime.datetime.fromtimestamp(rec.repair.at_ms / 1000 - 3600, datetime.UTC).isoformat()
    lines, missing = [], []
    for topic, share in restored_by_topic(rec).items():
        uri = topic_uri(bootstrap, topic)
        assets = api.call("GET", "/api/v2/assets", query={"uri_pattern": uri, "limit": 100})
        ids = [a["id"] for a in assets.get("assets", []) if a.get("uri") == uri]
        if not ids:
            missing.append(uri)
            continue
        query = {"asset_id": ids[0], "limit": 100, "timestamp_gte": since}
        events = api.call("GET", "/api/v2/assets/events", query=query).get("asset_events", [])
        if decision in announced_decisions(e.get("extra") for e in events):
            lines.append(f"announced before: the asset event of {uri} for repair {decision}")
            continue
        made = api.call("POST", "/api/v2/assets/events", {"asset_id": ids[0], "extra": topic_event_extra(rec, share)})
        lines.append(f"announced to Airflow: asset event {made.get('id')} of {uri}, {share.records} records restored")
    if missing:
        raise AnnouncementError(
            f"Airflow has no asset {', '.join(missing)} (no DAG names it and no run emitted it): nothing was "
            "announced for it. Schedule a DAG on it, then run the same command again: it announces what is missing"
        )
    return lines


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
