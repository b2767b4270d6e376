"""Why a new Avro schema cannot follow the latest registered one: a local comparison for the common
cases, so that a refusal names the field even when the registry gives no reason (Apicurio's
compatibility answer carries none).

Avro's schema resolution (a reader schema reading data written with a writer schema), by level:
BACKWARD has the new schema read the latest's data, FORWARD the latest read the new's, FULL both;
the ``_TRANSITIVE`` levels are compared with the latest version only. Found: a field added without
a default (BACKWARD), a field removed that had no default (FORWARD), a type the reader cannot read
(int, long and float widen; string and bytes read each other; a union must hold what is written).
Anything subtler is left to the registry's own words. The differences are data; ``registry/errors.py``
words them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
# writer type -> the reader types that read it (Avro's promotions)
_READS: dict[str, set[str]] = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


@dataclass(frozen=True)
class Difference:
    """``what``: ``added`` (new, no default), ``removed`` (gone, no default in the latest) or ``type``
    (``old`` and ``new`` describe the two types)."""

    path: str
    what: str
    old: str = ""
    new: str = ""


def differences(latest: Any, new: Any, level: str, path: str) -> list[Difference]:
    """What keeps ``new`` (parsed JSON) from following ``latest`` under ``level``."""
    level = level.upper().removesuffix("_TRANSITIVE")
    old_names, new_names = _names(latest), _names(new)
    found: list[Difference] = []
    if level in ("BACKWARD", "FULL"):
        _read(new, latest, path, _Side(new_names, old_names, backward=True), found)
    if level in ("FORWARD", "FULL"):
        _read(latest, new, path, _Side(old_names, new_names, backward=False), found)
    unique: list[Difference] = []
    for d in found:  # a retyped field is found both ways under FULL
        if d not in unique:
            unique.append(d)
    return unique


@dataclass(frozen=True)
class _Side:
    reader_names: dict[str, Any]
    writer_names: dict[str, Any]
    backward: bool  # the reader is the new schema


def _read(reader: Any, writer: Any, path: str, side: _Side, found: list[Difference]) -> None:
    reader, writer = _plain(reader, side.reader_names), _plain(writer, side.writer_names)
    if isinstance(writer, list):  # every branch written must be readable
        unreadable = False
        for branch in writer:
            trial: list[Difference] = []
            _read(reader, branch, path, side, trial)
            # A record read by a record: its fields' differences say more than the two unions.
            if trial and _kind(_plain(branch, side.writer_names)) in _kinds(reader, side.reader_names):
                found.extend(trial)
            elif trial:
                unreadable = True
        if unreadable:
            found.append(_retyped(path, reader, writer, side))
        return
    if isinstance(reader, list):
        for branch in reader:
            trial = []
            _read(branch, writer, path, side, trial)
            if not trial:
                return
        # No branch reads it: report against the branch of the writer's kind, if there is one.
        same = [b for b in reader if _kind(_plain(b, side.reader_names)) == _kind(writer)]
        if same:
            _read(same[0], writer, path, side, found)
            return
    r_kind, w_kind = _kind(reader), _kind(writer)
    if r_kind == w_kind == "record":
        _records(reader, writer, path, side, found)
    elif r_kind == w_kind == "array":
        _read(reader.get("items"), writer.get("items"), f"{path}[]", side, found)
    elif r_kind == w_kind == "map":
        _read(reader.get("values"), writer.get("values"), f"{path}{{}}", side, found)
    elif r_kind == w_kind == "enum":
        if not set(writer.get("symbols") or ()) <= set(reader.get("symbols") or ()) and "default" not in reader:
            found.append(_retyped(path, reader, writer, side))
    elif r_kind == w_kind == "fixed":
        if reader.get("size") != writer.get("size"):
            found.append(_retyped(path, reader, writer, side))
    elif r_kind != w_kind and r_kind not in _READS.get(w_kind, set()):
        found.append(_retyped(path, reader, writer, side))


def _records(reader: dict[str, Any], writer: dict[str, Any], path: str, side: _Side, found: list[Difference]) -> None:
    written = {str(f.get("name")): f for f in writer.get("fields") or ()}
    for field in reader.get("fields") or ():
        name = str(field.get("name"))
        names = [name, *[str(a) for a in field.get("aliases") or ()]]
        match = next((written[n] for n in names if n in written), None)
        sub = f"{path}.{name}"
        if match is None:
            if "default" not in field:
                found.append(Difference(sub, "added" if side.backward else "removed"))
            continue
        _read(field.get("type"), match.get("type"), sub, side, found)


def _retyped(path: str, reader: Any, writer: Any, side: _Side) -> Difference:
    old, new = (writer, reader) if side.backward else (reader, writer)
    return Difference(path, "type", _describe(old), _describe(new))


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema.get("type"))
    return str(schema)


def _kinds(schema: Any, names: dict[str, Any]) -> set[str]:
    schema = _plain(schema, names)
    return {_kind(_plain(b, names)) for b in schema} if isinstance(schema, list) else {_kind(schema)}


def _plain(schema: Any, names: dict[str, Any]) -> Any:
    """A named reference resolved, and ``{"type": "long", "logicalType": ...}`` seen as ``long``
    (logical types do not change what reads what here)."""
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        return names.get(schema) or names.get(schema.rpartition(".")[2], schema)
    if isinstance(schema, dict):
        inner = schema.get("type")
        if isinstance(inner, (dict, list)):
            return _plain(inner, names)
        if isinstance(inner, str) and inner in _PRIMITIVES:
            return inner
    return schema


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return " or ".join(_describe(b) for b in schema)
    if isinstance(schema, dict):
        kind = str(schema.get("type"))
        return f"{kind} {schema['name']}" if kind in ("record", "enum", "fixed") and "name" in schema else kind
    return str(schema)


def _names(schema: Any, namespace: str | None = None, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each named type's definition by full name and by short name (a reference may use either)."""
    into = {} if into is None else into
    if isinstance(schema, list):
        for branch in schema:
            _names(branch, namespace, into)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            _names(kind, namespace, into)
        elif kind in ("record", "error", "enum", "fixed"):
            name = str(schema.get("name") or "")
            space = name.rpartition(".")[0] if "." in name else schema.get("namespace", namespace)
            short = name.rpartition(".")[2]
            into[f"{space}.{short}" if space else short] = schema
            into.setdefault(short, schema)
            for field in schema.get("fields") or ():
                _names(field.get("type"), space, into)
        elif kind == "array":
            _names(schema.get("items"), namespace, into)
        elif kind == "map":
            _names(schema.get("values"), namespace, into)
    return into


__all__ = ["Difference", "differences"]
