"""Avro's rules for names, checked locally before a schema is sent anywhere.

A registry refuses a schema whose names break them with words of its own (Apicurio: "Failed to
discover artifact type from content", HTTP 422), and spark-avro would fail inside a task. Two rules
bite exported DataFrames: a name is letters, digits and ``_`` not starting with a digit (a column
``order-id`` is not one), and a schema defines each full name once (a derived schema names a nested
struct's record after its path, so structs ``a.b`` and ``a_b`` both become ``<record>_a_b``).

The problems are data (which field, which name, which rule); ``registry/errors.py`` words them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAMED = ("record", "error", "enum", "fixed")


@dataclass(frozen=True)
class NameProblem:
    """One name Avro does not allow.

    ``what`` is the rule: ``field``, ``record`` (or ``enum``, ``fixed``), ``namespace`` or
    ``symbol`` for a name that is not valid; ``duplicate`` for a field twice in a record;
    ``redefined`` for a full name defined twice (``first`` is the path that defined it first).
    """

    path: str  # the field, as role.field.subfield ([] an array's items, {} a map's values)
    name: str
    what: str
    first: str | None = None


def valid(name: str) -> bool:
    return bool(_NAME.match(name))


def suggested(name: str) -> str:
    """A valid Avro name close to ``name``: other characters become ``_``, a leading digit gets one."""
    fixed = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name) or "_"
    return fixed if not fixed[0].isdigit() else f"_{fixed}"


def problems(schema: Any, path: str) -> list[NameProblem]:
    """The names in ``schema`` (parsed JSON) that Avro does not allow; ``path`` names its root (the
    role: ``key`` or ``value``)."""
    found: list[NameProblem] = []
    _walk(schema, path, None, {}, found)
    return found


def _walk(schema: Any, path: str, namespace: str | None, defined: dict[str, str], found: list[NameProblem]) -> None:
    if isinstance(schema, list):  # a union: its branches sit at the same path
        for branch in schema:
            _walk(branch, path, namespace, defined, found)
        return
    if not isinstance(schema, dict):  # a primitive, or a reference to a name defined before
        return
    kind = schema.get("type")
    if isinstance(kind, (dict, list)):
        _walk(kind, path, namespace, defined, found)
    elif kind in _NAMED:
        _named(schema, str(kind), path, namespace, defined, found)
    elif kind == "array":
        _walk(schema.get("items"), f"{path}[]", namespace, defined, found)
    elif kind == "map":
        _walk(schema.get("values"), f"{path}{{}}", namespace, defined, found)


def _named(
    schema: dict[str, Any],
    kind: str,
    path: str,
    namespace: str | None,
    defined: dict[str, str],
    found: list[NameProblem],
) -> None:
    name = str(schema.get("name") or "")
    given_ns = schema.get("namespace")
    space, _, short = name.rpartition(".")
    own = space if "." in name else (str(given_ns) if given_ns is not None else namespace) or None
    # A nested struct's record name comes from its field's name: one problem per field is enough.
    if not valid(short) and not any(p.path == path for p in found):
        found.append(NameProblem(path, short, kind))
    declared = "." in name or given_ns is not None  # an inherited namespace was checked where declared
    if declared and own and not all(valid(part) for part in own.split(".")):
        found.append(NameProblem(path, own, "namespace"))
    full = f"{own}.{short}" if own else short
    if full in defined:
        found.append(NameProblem(path, full, "redefined", defined[full]))
    else:
        defined[full] = path
    if kind == "enum":
        found.extend(NameProblem(path, str(s), "symbol") for s in schema.get("symbols") or () if not valid(str(s)))
    if kind not in ("record", "error"):
        return
    seen: set[str] = set()
    for field in schema.get("fields") or ():
        field_name = str(field.get("name") or "")
        sub = f"{path}.{field_name}"
        if not valid(field_name):
            found.append(NameProblem(sub, field_name, "field"))
        elif field_name in seen:
            found.append(NameProblem(sub, field_name, "duplicate"))
        seen.add(field_name)
        _walk(field.get("type"), sub, own, defined, found)


__all__ = ["NameProblem", "problems", "suggested", "valid"]
