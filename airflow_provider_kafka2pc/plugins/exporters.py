"""The exporters page as an Airflow 3.1+ plugin: a FastAPI app under ``/kafka2pc`` and an entry in
the UI's Browse menu that shows it inside the Airflow UI (an external view).

Loaded by every Airflow component (the ``airflow.plugins`` entry point), so this module is light:
the FastAPI app, the Kafka clients and the reports load on the first request to the page
(``_LazyApp``), only in the API server. Every endpoint of the app asks Airflow's auth manager
(``plugins/page.py``); a plugin's FastAPI app is not protected by Airflow unless it does.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/kafka2pc"  # where the FastAPI app is mounted
PAGE = "exporters"  # the page, relative to URL_PREFIX
URL_ROUTE = "kafka2pc-exporters"  # the UI's route of the external view: /plugin/kafka2pc-exporters
VIEW_NAME = "Kafka exporters"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def airflow_version() -> tuple[int, int]:
    """Airflow core's (major, minor); (0, 0) where only the Task SDK is installed."""
    try:
        from airflow import __version__
    except ImportError:
        return (0, 0)
    found = re.match(r"(\d+)\.(\d+)", __version__)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def has_page() -> bool:
    """Airflow 3.1 brought external views and the cookie the page authenticates the browser with."""
    return airflow_version() >= (3, 1)


def page_query(conn_id: str, prefixes: Sequence[str]) -> str:
    return urlencode([("conn_id", conn_id), *(("prefix", p) for p in prefixes)])


def page_url(base_url: str, conn_id: str, prefixes: Sequence[str]) -> str:
    """The exporters page of ``prefixes`` on connection ``conn_id``, for the Airflow at ``base_url``
    (``[api] base_url``). From Airflow 3.3 on inside the UI's frame (``/plugin/<route>/<path>``
    deep links); before, the page itself."""
    base = base_url.rstrip("/")
    path = urlsplit(base).path  # a base_url behind a proxy path: /airflow
    inner = f"{path}{URL_PREFIX}/{PAGE}?{page_query(conn_id, prefixes)}"
    if airflow_version() >= (3, 3):
        return f"{base}/plugin/{URL_ROUTE}{inner}"
    return f"{base}{inner[len(path) :]}"


class _LazyApp:
    """An ASGI app that builds the page's FastAPI app on its first request."""

    def __init__(self) -> None:
        self._app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    from airflow_provider_kafka2pc.plugins.page import create_app

                    self._app = create_app()
        await self._app(scope, receive, send)


def _base_path() -> str:
    try:
        from airflow.configuration import conf

        return urlsplit(conf.get("api", "base_url", fallback="/") or "/").path.rstrip("/")
    except Exception:
        return ""


class Kafka2PCExportersPlugin(AirflowPlugin):
    """Per exporter prefix: open transactions and the decisions ruling them, recent runs, losses."""

    name = "kafka2pc"
    if has_page():
        fastapi_apps = [{"app": _LazyApp(), "url_prefix": URL_PREFIX, "name": "kafka2pc exporters"}]
        external_views = [
            {
                "name": VIEW_NAME,
                "href": f"{_base_path()}{URL_PREFIX}/{PAGE}",
                "destination": "nav",
                "category": "browse",
                "url_route": URL_ROUTE,
            }
        ]
