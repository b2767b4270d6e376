"""The README is also the PyPI page: its links must not be relative to the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Inline links and autolinks: [text](target) and <scheme://...>.
_LINK = re.compile(r"\]\(([^)\s]+)\)|<(\w+://[^>\s]+)>")


def links(markdown: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in _LINK.finditer(markdown)]


def relative_links(markdown: str) -> list[str]:
    return [t for t in links(markdown) if not re.match(r"https?://", t)]


def test_readme_links_work_on_pypi() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert links(readme), "the README links the user guide"
    assert relative_links(readme) == []


def test_relative_links_are_found() -> None:
    # The check above would pass vacuously if the pattern missed the links PyPI breaks.
    assert relative_links("see [design](docs/design.md#x) and [web](https://a.b/c)") == ["docs/design.md#x"]
