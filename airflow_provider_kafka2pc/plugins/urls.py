"""Where the exporters page lives: its mount point, its route in the Airflow UI, and its links.

Light on purpose: the plugin's registration (``plugins/exporters.py``), the page's app
(``plugins/page.py``) and the operators' extra links all import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlencode, urlsplit

URL_PREFIX = "/kafka2pc"  # where the FastAPI app is mounted
PAGE = "exporters"  # the page, relative to URL_PREFIX
URL_ROUTE = "kafka2pc-exporters"  # the UI's route of the external view: /plugin/kafka2pc-exporters
VIEW_NAME = "Kafka exporters"


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
