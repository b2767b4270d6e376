"""The soak's truth check (``checker.told``) without a broker: it must catch each way the CLI could
mislead a user (a partly visible run not reported, wrong counts, a loss reported for a whole run,
an acknowledged loss still reported, the wrong exit status, describe disagreeing), and accept the
honest answers. So must the judge of a Kafka source's offsets (``checker.offsets_judged``): a
group moved without its run's output, or output visible without its group moved."""

from __future__ import annotations

from typing import Any

from tests.soak.checker import Truth, offsets_judged, told

RUN = {"run": "soak/run-6", "tag": "r6", "expected": 40, "count": 4, "records": 10}


def loss(visible: int, lost: int, pending: int = 0, records: int = 40) -> dict[str, Any]:
    return {"prefix": "soak", "run": "soak/run-6", "decision_id": "d1", "final": False, "records": records,
            "visible_records": visible, "lost_records": lost, "pending_transactions": pending,
            "partly_visible": 0 < visible < records}  # fmt: skip


def report(losses: list[dict[str, Any]], open_ids: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"losses": losses, "transactions": [{"transactional_id": t} for t in open_ids]}


def check(t: Truth, run: dict[str, Any], code: int, losses: list[dict[str, Any]], d_code: int | None = None) -> str:
    open_ids = tuple(line.split()[0] for line in t.open)
    listed = (code, report(losses, open_ids), "")
    described = ((4 if code == 4 else 0) if d_code is None else d_code, report(losses), "")
    return "\n".join(v.what for v in told(t, [run], listed, described, "soak"))


PARTLY = Truth({"r6": 10}, ())


def test_a_partly_visible_run_reported_with_its_counts_is_the_truth() -> None:
    assert check(PARTLY, RUN, 4, [loss(10, 30)]) == ""


def test_a_partly_visible_run_not_reported_is_a_lie() -> None:
    assert "list reports it 0 time(s)" in check(PARTLY, RUN, 0, [])
    assert "list exit 0, expected 4" in check(PARTLY, RUN, 0, [])


def test_wrong_counts_are_a_lie() -> None:
    assert "list says" in check(PARTLY, RUN, 4, [loss(20, 20)])
    assert "list says" in check(PARTLY, RUN, 4, [loss(10, 30, records=30)])


def test_a_whole_run_reported_lost_is_a_lie() -> None:
    whole, none = Truth({"r6": 40}, ()), Truth({}, ())
    assert "yet list reports a loss" in check(whole, RUN, 4, [loss(40, 0)])
    assert "yet list reports a loss" in check(none, RUN, 4, [loss(0, 40)])
    assert check(whole, RUN, 0, []) == "" and check(none, RUN, 0, []) == ""


def test_a_loss_a_tool_reported_with_nothing_visible_must_stay_reported() -> None:
    none = Truth({}, ())
    assert check(none, RUN | {"loss_reported": True}, 4, [loss(0, 40)]) == ""
    assert "list says no loss" in check(none, RUN | {"loss_reported": True}, 0, [])


def test_a_commit_decided_with_nothing_visible_is_a_loss_before_any_tool_said_so() -> None:
    # Seed 8, run 1: the COMMIT was decided, then the broker aborted both transactions (epoch moved
    # on) before any EndTxn; before any recovery, list must report it lost, 0 of 20 visible.
    none, decided = Truth({}, ()), RUN | {"commit_decided": True}
    assert check(none, decided, 4, [loss(0, 40)]) == ""
    assert "a COMMIT decided, nothing visible of 40: list says no loss" in check(none, decided, 0, [])
    assert "list exit 0, expected 4" in check(none, decided, 0, [])
    assert "list says" in check(none, decided, 4, [loss(0, 30, records=30)])


def test_an_acknowledged_loss_is_no_longer_reported() -> None:
    acknowledged = RUN | {"acknowledged": True}
    assert check(PARTLY, acknowledged, 0, []) == ""
    assert "still reported lost" in check(PARTLY, acknowledged, 4, [loss(10, 30)])


def test_pending_transactions_are_not_a_loss() -> None:
    # A commit died after its decision and one EndTxn: three transactions still open, to roll forward.
    pending = Truth({"r6": 10}, ("soak-1 Ongoing", "soak-2 Ongoing", "soak-3 Ongoing"))
    assert check(pending, RUN, 1, []) == ""
    assert "list exit 0, expected 1" in check(pending, RUN, 0, [])
    # A read_committed consumer stops at an open transaction's first offset: with one transaction
    # open, committed records behind it are not readable yet, so the count is a lower bound.
    behind = Truth({"r6": 10}, ("soak-1 Ongoing",))
    assert check(behind, RUN, 1, []) == "" and check(behind, RUN, 4, [loss(30, 0, pending=1)]) == ""
    assert "at least 10 of 40 visible" in check(behind, RUN, 4, [loss(0, 30, pending=1)])
    assert "list reports no loss" in check(behind, RUN | {"loss_reported": True}, 1, [])


def test_open_transactions_must_match_and_describe_must_agree() -> None:
    t = Truth({"r6": 40}, ("soak-1 Ongoing",))
    found = told(t, [RUN], (1, report([], ()), ""), (0, report([]), ""), "soak")
    assert "list shows open [], Kafka ['soak-1 Ongoing']" in "\n".join(v.what for v in found)
    assert "describe exit 0" in check(PARTLY, RUN, 4, [loss(10, 30)], d_code=0)
    failed = told(PARTLY, [RUN], (3, None, "boom"), (4, {}, ""), "soak")
    assert [v.what for v in failed] == ["list failed: exit 3: boom"]


# Two sourced runs of 40 records each; the second read on from the first's end.
FIRST = {"run": "soak/run-1", "tag": "r1", "expected": 40, "status": "success", "source_end": {"src-0": 5, "src-1": 3}}
SECOND = {"run": "soak/run-2", "tag": "r2", "expected": 40, "status": "failed", "source_end": {"src-0": 9, "src-1": 3}}


def offsets(visible: dict[str, int], runs: list[dict[str, Any]], group: dict[str, int]) -> str:
    return "\n".join(f"{v.run}: {v.what}" for v in offsets_judged(visible, runs, group))


def test_the_group_stands_at_the_end_of_the_last_visible_run() -> None:
    assert offsets({}, [], {}) == ""
    assert offsets({"r1": 40}, [FIRST, SECOND], {"src-0": 5, "src-1": 3}) == ""
    assert offsets({"r1": 40, "r2": 40}, [FIRST, SECOND | {"status": "success"}], {"src-0": 9, "src-1": 3}) == ""
    # A run that read no source (a Spark prepare) or whose prepare took no range is not judged.
    unsourced = {"run": "soak/run-3", "tag": "r3", "expected": 10, "status": "success"}
    assert offsets({"r1": 40, "r3": 10}, [FIRST, unsourced], {"src-0": 5, "src-1": 3}) == ""


def test_offsets_moved_with_the_output_invisible_are_a_violation() -> None:
    found = offsets({"r1": 40}, [FIRST, SECOND], {"src-0": 9, "src-1": 3})
    assert "soak/run-2: the group's offsets moved to this run's end (src-0 9, src-1 3), but 0 of its 40" in found
    assert "soak/run-1: the group's offsets moved" in offsets({}, [FIRST], {"src-0": 5, "src-1": 3})
    # Moved part of the way (one partition): the end of no run, named against the last visible one.
    assert "soak/run-1: all 40 records visible, but the group's offsets are at src-0 9, src-1 2" in offsets(
        {"r1": 40}, [FIRST, SECOND], {"src-0": 9, "src-1": 2}
    )
    assert "no sourced run's output is visible, yet the group has offsets: src-0 1" in offsets(
        {}, [FIRST], {"src-0": 1}
    )


def test_output_visible_with_the_offsets_not_moved_is_a_violation() -> None:
    found = offsets({"r1": 40, "r2": 40}, [FIRST, SECOND | {"status": "success"}], {"src-0": 5, "src-1": 3})
    assert (
        "soak/run-2: all 40 records visible, but the group's offsets are at src-0 5, src-1 3 (the end of soak/run-1)"
        in found
    )
    assert "soak/run-1: all 40 records visible, but the group's offsets are at no offsets" in offsets(
        {"r1": 40}, [FIRST], {}
    )


def test_a_run_lost_after_its_commit_decision_may_have_moved_the_group_or_not() -> None:
    # The broker aborted part of a decided run: its offsets participant among the committed or the lost.
    lost = SECOND | {"status": "lost", "commit_decided": True}
    for group in ({"src-0": 5, "src-1": 3}, {"src-0": 9, "src-1": 3}):
        assert offsets({"r1": 40, "r2": 10}, [FIRST, lost], group) == ""
    assert (
        offsets({"r1": 40}, [FIRST, SECOND | {"status": "pending", "commit_decided": True}], {"src-0": 9, "src-1": 3})
        == ""
    )
    # A later visible run settles it: the group must then be at that run's end.
    third = {
        "run": "soak/run-3",
        "tag": "r3",
        "expected": 5,
        "status": "success",
        "source_end": {"src-0": 12, "src-1": 4},
    }
    assert "soak/run-3: all 5 records visible" in offsets(
        {"r1": 40, "r2": 10, "r3": 5}, [FIRST, lost, third], {"src-0": 9, "src-1": 3}
    )
