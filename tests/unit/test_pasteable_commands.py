"""Every command a message tells the user to run can be pasted as it is: no PREFIX, RUN or BROKERS
placeholders, no <angle-bracket> blanks. Checked over every string literal of the package (not
docstrings), with the f-strings' expressions standing for the values they are filled with."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_kafka2pc"
PLACEHOLDER = re.compile(r"\b(PREFIX|RUN|RUN_ID|DAG_ID|BROKERS|CONN_ID|TOPIC|PRINCIPAL)\b|<[a-z][a-z _-]*>")
COMMAND = re.compile(r"(kafka2pc (?:list|describe|resolve|acknowledge)\b[^`\n]*|kafka-acls [^`\n]*)")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    docs, inside = _docstrings(tree), set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside.update(id(v) for v in node.values)
            out.append(
                (node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{value}" for v in node.values))
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | inside:
            out.append((node.lineno, node.value))
    return out


def test_no_command_in_a_message_has_a_placeholder() -> None:
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {m.group(1)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8")))
        for m in COMMAND.finditer(text)
        if PLACEHOLDER.search(m.group(1))
    ]
    assert bad == []


def test_the_scan_finds_a_placeholder_where_there_is_one() -> None:
    tree = ast.parse('raise X(f"run `kafka2pc acknowledge --prefix PREFIX --run {run}` now")')
    [(_, text)] = _strings(tree)
    [m] = COMMAND.finditer(text)
    assert PLACEHOLDER.search(m.group(1))
