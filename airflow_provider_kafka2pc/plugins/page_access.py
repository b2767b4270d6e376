"""Who may do what on the exporters page: Airflow's auth manager asked with the request's user, and
forms accepted only from the page's own site.

- reading an exporter: what reading DAG runs allows (Viewer and up);
- acknowledging a loss: on top, editing the connection the page reads Kafka with ("can edit on
  Connections"; Op and Admin): it writes to the decision log with that connection's credentials;
- repairing a LOST run: on top of reading, clearing the run's task instances in its DAG (what the
  UI's Clear needs; User and up): the repair is the export task's, cleared through Airflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails, DagAccessEntity, DagDetails
from fastapi import HTTPException, Request, status

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser


def may_read(user: BaseUser) -> bool:
    return bool(get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, user=user))


def may_acknowledge(user: BaseUser, conn_id: str) -> bool:
    return may_read(user) and bool(
        get_auth_manager().is_authorized_connection(
            method="PUT", details=ConnectionDetails(conn_id=conn_id, team_name=_team_of_connection(conn_id)), user=user
        )
    )


def may_repair(user: BaseUser, dag_id: str) -> bool:
    return may_read(user) and bool(
        get_auth_manager().is_authorized_dag(
            method="PUT", access_entity=DagAccessEntity.TASK_INSTANCE, details=DagDetails(id=dag_id), user=user
        )
    )


def _team_of_connection(conn_id: str) -> str | None:
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.connection import Connection

    team: str | None = Connection.get_team_name(conn_id)
    return team


def require_read(user: BaseUser) -> None:
    if not may_read(user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: reading exporters needs read access to DAG runs")


def require_same_origin(request: Request) -> None:
    """A browser names where a form was sent from; refuse one sent from another site."""
    if not _same_origin(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: the form was sent from another site")


def _same_origin(request: Request) -> bool:
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin in (None, "null"):
        return True  # a sandboxed frame sends "null"; the cookie is SameSite=Lax anyway
    return urlsplit(origin).netloc == request.headers.get("host", "")


__all__ = ["may_acknowledge", "may_read", "may_repair", "require_read", "require_same_origin"]
