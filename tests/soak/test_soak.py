"""The fault soak's short mode: fixed plans that strike every fault kind and variant, on a real
3-broker Kafka with real Spark, judged by the independent checker. The long mode is
``python -m tests.soak.harness --runs 450`` (docs/design.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.soak import harness

pytestmark = pytest.mark.kafka


def test_short_soak_has_no_violations(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    runs = str(len(harness.SHORT_PLANS))
    code = harness.main(["--short", "--runs", runs, "--seed", "7", "--dir", str(tmp_path / "soak"), "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["violations"] == [], harness.render(result)
    assert code == 0
    assert set(result["faults"]) == set(harness.KINDS)  # every kind struck a live process
    assert set(result["variants"]) >= {"kill_prepare:abort", "kill_prepare:retry", "kill_commit:before-retry",
                                       "kill_commit:after-decision", "broker_restart:prepare", "broker_restart:commit",
                                       "concurrent_resolve:prepare", "concurrent_resolve:commit", "clear:commit",
                                       "clear:run", "timeout:before-commit", "timeout:after-decision"}  # fmt: skip
    assert result["outcomes"].get("committed", 0) >= 1 and result["outcomes"].get("aborted", 0) >= 1
