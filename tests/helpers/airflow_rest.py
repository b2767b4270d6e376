"""Driving a running Airflow through its public REST API v2, as any external client would: a JWT
from the SimpleAuthManager's ``POST /auth/token`` (as admin), runs triggered, cleared and awaited,
task states, tries, XComs and logs read. :class:`AirflowRestApi` is the half of the tests' Airflow
harnesses that talks to it (tests/helpers/airflow_standalone.py starts one on loopback,
tests/helpers/airflow_cluster.py one on the emulated cluster's hosts)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

TERMINAL_RUN_STATES: frozenset[str] = frozenset({"success", "failed"})
# The task instance states Airflow counts as finished (a run ends once all of its tasks are).
FINISHED_TASK_STATES: frozenset[str | None] = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
_RUN_READ_EVERY = 10  # wait_run with on_poll: the run's state read at least every this many polls
ADMIN_USER = "admin"


class AirflowHarnessError(RuntimeError):
    """Airflow did not start, did not answer as expected, or a wait timed out (message carries log tails)."""


class AirflowRestApi:
    """The REST API v2 of a running Airflow, as admin. The harness that starts the Airflow provides
    its address, home and logs, and says whether its components are still alive."""

    base_url: str
    home: Path
    log_dir: Path
    keep_logs_in: Path | None
    _password: str
    _client: httpx.Client | None
    _token: str | None

    def _check_alive(self) -> None:
        raise NotImplementedError

    def logs_tail(self, lines: int = 40) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------------ HTTP plumbing

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=30)
        return self._client

    def _login(self) -> None:
        r = self.client.post("/auth/token", json={"username": ADMIN_USER, "password": self._password})
        if r.status_code not in (200, 201):
            raise AirflowHarnessError(f"POST /auth/token -> HTTP {r.status_code}: {r.text[:500]}")
        self._token = r.json()["access_token"]

    @property
    def token(self) -> str:
        """A JWT for the REST API (admin role)."""
        if self._token is None:
            self._login()
        assert self._token is not None
        return self._token

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        expect: Iterable[int] = (200,),
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Call the REST API (``path`` starts with ``/api/v2/``) as admin; raise on an unexpected status."""
        expected = set(expect)
        for attempt in range(2):
            r = self._send(method, path, json_body, params, headers)
            if r.status_code == 401 and attempt == 0:
                self._login()  # token expired (long session): log in again once
                continue
            break
        if r.status_code not in expected:
            raise AirflowHarnessError(
                f"{method} {path} -> HTTP {r.status_code} (expected {sorted(expected)}): {r.text}"
            )
        return r

    def _send(
        self,
        method: str,
        path: str,
        json_body: Any,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
    ) -> httpx.Response:
        # On a loaded 2-core machine the api-server may not answer a read within the client's timeout;
        # reads are retried (twice), writes never (a clear or trigger must not happen twice).
        for attempt in range(3):
            try:
                return self.client.request(
                    method,
                    path,
                    json=json_body,
                    params=params,
                    headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
                )
            except (httpx.TimeoutException, httpx.ReadError):
                if method != "GET" or attempt == 2:
                    raise
                self._check_alive()
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ DAGs and runs

    def wait_for_dags(self, *dag_ids: str, timeout: float = 120.0) -> None:
        """Wait until the dag-processor has parsed and serialized each DAG (``GET /api/v2/dags/{id}``)."""
        deadline = time.monotonic() + timeout
        pending = list(dag_ids)
        while pending:
            self._check_alive()
            r = self.request("GET", f"/api/v2/dags/{pending[0]}", expect=(200, 404))
            if r.status_code == 200:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise AirflowHarnessError(
                    f"DAG(s) {pending} not parsed within {timeout:.0f}s; import errors: {self.import_errors()}\n"
                    + self.logs_tail()
                )
            time.sleep(1)

    def import_errors(self) -> list[dict[str, Any]]:
        body = self.request("GET", "/api/v2/importErrors", params={"limit": 100}).json()
        return list(body.get("import_errors", []))

    def unpause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json_body={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json_body={"is_paused": True})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None) -> str:
        """Create a manual run (no logical date) and return its run_id."""
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id is not None:
            body["dag_run_id"] = run_id
        r = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json_body=body)
        return str(r.json()["dag_run_id"])

    def backfill(
        self,
        dag_id: str,
        from_date: str,
        to_date: str,
        *,
        conf: Mapping[str, Any] | None = None,
        max_active_runs: int = 10,
    ) -> dict[str, Any]:
        """Create a backfill (``POST /api/v2/backfills``) over [from_date, to_date]; returns the backfill."""
        body = {
            "dag_id": dag_id,
            "from_date": from_date,
            "to_date": to_date,
            "dag_run_conf": dict(conf or {}),
            "max_active_runs": max_active_runs,
        }
        return dict(self.request("POST", "/api/v2/backfills", json_body=body).json())

    def dag_runs(self, dag_id: str, **params: Any) -> list[dict[str, Any]]:
        """The DAG's runs (``GET /api/v2/dags/{dag_id}/dagRuns`` with filters such as ``run_type``)."""
        r = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100, **params})
        return list(r.json()["dag_runs"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json())

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.dag_run(dag_id, run_id)["state"])

    def wait_run(
        self,
        dag_id: str,
        run_id: str,
        timeout: float = 300.0,
        *,
        states: Iterable[str] = TERMINAL_RUN_STATES,
        on_poll: Callable[[dict[str, str | None]], None] | None = None,
        poll: float = 1.0,
    ) -> str:
        """Poll the run until its state is one of ``states``; return that state.

        ``on_poll`` gets the task states at every poll (e.g. to observe a transient "deferred").
        On timeout the error carries the task states and the component log tails.

        With ``on_poll``, a poll reads the task states, and the run's state (the one returned) only
        when every task is finished (a run ends only then), or every ``_RUN_READ_EVERY`` polls in
        case Airflow ended it otherwise: one read per poll instead of two.
        """
        wanted = set(states)
        # A run can be in a state not in TERMINAL_RUN_STATES while its tasks are not finished.
        tasks_tell = on_poll is not None and wanted <= TERMINAL_RUN_STATES
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            self._check_alive()
            if on_poll is not None:
                tasks = self.task_states(dag_id, run_id)
                on_poll(tasks)
            if not tasks_tell or polls % _RUN_READ_EVERY == 0 or all(s in FINISHED_TASK_STATES for s in tasks.values()):
                state = self.run_state(dag_id, run_id)
                if state in wanted:
                    return state
            polls += 1
            if time.monotonic() > deadline:
                raise AirflowHarnessError(
                    f"run {dag_id}/{run_id} still {state!r} after {timeout:.0f}s (waiting for {sorted(wanted)}); "
                    f"tasks: {self.task_states(dag_id, run_id)}\n" + self.logs_tail()
                )
            time.sleep(poll)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        r = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        return list(r.json()["task_instances"])

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        """One (unmapped) task instance: state, start_date, end_date, try_number..."""
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}").json())

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """task_id -> state (mapped tasks: ``task_id[map_index]``)."""
        out: dict[str, str | None] = {}
        for ti in self.task_instances(dag_id, run_id):
            key = ti["task_id"] if ti.get("map_index", -1) == -1 else f"{ti['task_id']}[{ti['map_index']}]"
            out[key] = ti["state"]
        return out

    def task_tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict[str, Any]]:
        """Every try of a task instance (``try_number``, ``state``, ``start_date``... per try), oldest first."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        path += "/tries" if map_index == -1 else f"/{map_index}/tries"
        tries = list(self.request("GET", path).json()["task_instances"])
        return sorted(tries, key=lambda t: int(t["try_number"]))

    def clear_tasks(
        self,
        dag_id: str,
        run_id: str,
        task_ids: Sequence[str],
        *,
        include_downstream: bool = False,
        include_upstream: bool = False,
        only_failed: bool = False,
        reset_dag_runs: bool = True,
    ) -> list[str]:
        """Clear (re-run) tasks of one run; returns the cleared task_ids. The run goes back to "queued"."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": list(task_ids),
            "include_downstream": include_downstream,
            "include_upstream": include_upstream,
            "only_failed": only_failed,
            "reset_dag_runs": reset_dag_runs,
        }
        r = self.request("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", json_body=body)
        return [ti["task_id"] for ti in r.json()["task_instances"]]

    def clear_run(self, dag_id: str, run_id: str, *, only_failed: bool = False) -> None:
        """Clear a whole run (all tasks, or only the failed ones)."""
        self.request(
            "POST",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/clear",
            json_body={"dry_run": False, "only_failed": only_failed},
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The stored (JSON) value of an XCom; raises AirflowHarnessError if there is none."""
        r = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"map_index": map_index},
        )
        return r.json()["value"]

    def asset_events(self, **where: Any) -> list[dict[str, Any]]:
        """Asset events (``GET /api/v2/assets/events``), oldest first: those a DAG run's tasks emitted
        (``source_dag_id``, ``source_run_id``), or every one of an asset (``asset_id``; events made
        through the API have no source run)."""
        params = {**where, "order_by": "timestamp", "limit": 1000}
        return list(self.request("GET", "/api/v2/assets/events", params=params).json()["asset_events"])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """A task try's log as plain text (one line per structured log event)."""
        r = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true", "map_index": map_index},
            headers={"Accept": "application/json"},
        )
        return "\n".join(_format_log_event(item) for item in r.json().get("content", []))

    def task_errors(self, since: float, per_file: int = 30) -> str:
        """The error and warning events of every task log written since ``since`` (epoch seconds),
        read from the files (the API may be what failed), and the components' last such lines (a
        task that died before it logged): why a task failed, in a test's report."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            if path.stat().st_mtime < since:
                continue
            lines = [
                line[:600]
                for line in path.read_text(errors="replace").splitlines()
                if any(word in line for word in ("[error", "[warning", "[critical", "ERROR", "Traceback"))
            ]
            if lines:
                parts.append(f"components/{path.name}:\n" + "\n".join(lines[-per_file:]))
        for path in sorted((self.home / "logs").glob("dag_id=*/run_id=*/task_id=*/attempt=*.log*")):
            if path.stat().st_mtime < since:
                continue
            events = []
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    item = json.loads(line)
                    if isinstance(item, dict) and item.get("level") in ("warning", "error", "critical"):
                        events.append(_format_log_event(item))
            if events:
                parts.append(f"{path.relative_to(self.home / 'logs')}:\n" + "\n".join(events[-per_file:]))
        if parts and self.keep_logs_in is not None:
            parts.append(f"(every component and task log is copied to {self.keep_logs_in} when this Airflow stops)")
        return "\n\n".join(parts)


# Context every structured task-log event repeats; dropped so a failure message stays readable.
_LOG_CONTEXT_KEYS = frozenset(
    {"timestamp", "level", "event", "logger", "run_id", "ti_id", "task_id", "dag_id", "map_index", "try_number"}
    | {"filename", "lineno"}
)


def _format_log_event(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    line = f"{item.get('timestamp', '')} {item.get('level', '')} {item.get('event', '')}"
    for exc in item.get("error_detail") or []:
        frame = (exc.get("frames") or [{}])[-1]
        line += (
            f"\n    {exc.get('exc_type')}: {exc.get('exc_value')} (at {frame.get('filename')}:{frame.get('lineno')})"
        )
    extra = {k: v for k, v in item.items() if k not in _LOG_CONTEXT_KEYS and k != "error_detail"}
    return line + (f" {json.dumps(extra, default=str)}" if extra else "")
