"""The exporters page as an Airflow 3.1+ plugin: a FastAPI app under ``/kafka2pc`` and an entry in
the UI's Browse menu that shows it inside the Airflow UI (an external view).

Loaded by every Airflow component (the ``airflow.plugins`` entry point), so this module is light:
the FastAPI app, the Kafka clients and the reports load on the first request to the page
(``_LazyApp``), only in the API server. Every endpoint of the app asks Airflow's auth manager
(``plugins/page.py``); a plugin's FastAPI app is not protected by Airflow unless it does.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_kafka2pc.plugins.urls import PAGE, URL_PREFIX, URL_ROUTE, VIEW_NAME, has_page

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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
