"""The fault soak's short mode: every fault kind once, on a real 3-broker Kafka, judged by the
independent checker. The long mode is ``python -m tests.soak.harness --runs 300`` (docs/design.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak import harness

pytestmark = pytest.mark.kafka


def test_short_soak_has_no_violations(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    code = harness.main(["--short", "--runs", str(len(harness.KINDS)), "--seed", "7", "--dir", str(tmp_path / "soak"),
                         "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["violations"] == [], harness.render(result)
    assert code == 0
    assert set(result["faults"]) == set(harness.KINDS)  # every kind was injected
    assert result["outcomes"].get("committed", 0) >= 1 and result["outcomes"].get("aborted", 0) >= 1
