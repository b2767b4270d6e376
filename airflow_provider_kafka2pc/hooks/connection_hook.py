"""ConnectionHook: what kafka2pc's hooks share: one connection, fetched once, and its classic form.

Each connection type describes its form once, as plain data (``connection_form.py``,
``registry/connection_form.py``); the hook names that description in ``conn_fields``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

if TYPE_CHECKING:
    from airflow.sdk import Connection


def form_widgets(conn_fields: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The classic (Flask) form's widgets for a connection type's extra fields; Airflow 3's UI uses
    the provider info's conn-fields instead, so without Flask AppBuilder there are none."""
    try:
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget, Select2Widget
        from flask_babel import lazy_gettext
        from wtforms import SelectField, StringField
    except ImportError:
        return {}

    widgets: dict[str, Any] = {}
    for name, field in conn_fields.items():
        label = lazy_gettext(field["label"])
        schema = field["schema"]
        choices = [c for c in schema.get("enum", ()) if c]
        if choices:  # a choice, not free text: a typo cannot reach the clients
            empty = schema.get("values_display", {}).get("", "")
            widgets[name] = SelectField(
                label, choices=[("", empty), *((c, c) for c in choices)], default="", widget=Select2Widget()
            )
        else:
            widgets[name] = StringField(label, widget=BS3TextFieldWidget())
    return widgets


class ConnectionHook(BaseHook):
    """A hook of one connection: the id is the attribute ``conn_name_attr`` names (Airflow's
    convention), the connection is fetched on first use, or handed in (a trigger fetches it
    asynchronously)."""

    conn_name_attr: ClassVar[str]
    conn_fields: ClassVar[Mapping[str, Mapping[str, Any]]]  # the connection type's extra fields

    def __init__(self, connection: Connection | None = None) -> None:
        super().__init__()
        self._conn = connection

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        return form_widgets(cls.conn_fields)

    @property
    def connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.get_connection(getattr(self, self.conn_name_attr))
        return self._conn


__all__ = ["ConnectionHook", "form_widgets"]
