"""Commit and abort logs summarise: one line per decision with its counts, per-transaction lines at
INFO only for a few, a lost transaction always a WARNING, and no Python reprs in any line."""

from __future__ import annotations

import logging
import re

import pytest

from airflow_provider_kafka2pc.txn.protocol.outcome import Observation, Verdict
from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
from airflow_provider_kafka2pc.txn.two_phase.resolver import Resolution
from airflow_provider_kafka2pc.txn.two_phase.ruling import FEW_TRANSACTIONS, log_resolutions
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, committable, ref

RUN = "dag/run-1"
OURS = "airflow_provider_kafka2pc"
# What a Python repr of a dict, list, tuple or set looks like inside a line.
REPR = re.compile(r"[{\[]'|'[}\]]|\(\)|\[\]|\{\}")


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(OURS) and r.levelno == level]


def test_a_200_partition_commit_logs_a_handful_of_info_lines(
    clock: FakeClock, broker: FakeBroker, decision_log: MemoryDecisionLog, caplog: pytest.LogCaptureFixture
) -> None:
    cs = [committable(f"orders-{i}", partitions=(i,)) for i in range(200)]
    for c in cs:
        broker.prepared(c)
    with caplog.at_level(logging.DEBUG, logger=OURS):
        report = commit_prepared(cs, broker, decision_log, run=RUN)
    # Each commit sent once; in any order, since the EndTxns go out from a pool of threads.
    assert report.committed and sorted(broker.commits_sent()) == sorted(c.transactional_id for c in cs)

    info = lines(caplog, logging.INFO)
    assert len(info) <= 5, info
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    did = decision_log.decisions_of("orders-0")[0].decision_id
    assert f"commit of run {RUN} under COMMIT decision {did}: 200 transaction(s): 200 committed and 0 aborted by " \
        "this call, 0 already ended, 0 lost" in info  # fmt: skip
    # Each transaction's end is still there, at DEBUG.
    debug = lines(caplog, logging.DEBUG)
    assert "orders-7 (producer id 1000, epoch 0): committed by this call" in debug
    assert sum(1 for m in debug if m.endswith(": committed by this call")) == 200
    assert not [m for m in info if REPR.search(m)], info


def resolution(tid: str, outcome: Verdict, detail: str, ended_here: bool = False) -> Resolution:
    return Resolution(ref(tid), outcome, Observation.OPEN, detail, ended_here=ended_here)


def test_a_few_transactions_are_listed_at_info_and_a_lost_one_is_a_warning_among_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    few = [
        resolution("orders-0", Verdict.COMMITTED, "committed by this call", ended_here=True),
        resolution("orders-1", Verdict.COMMITTED, "already committed"),
        resolution("orders-2", Verdict.ABORTED, "aborted by this call", ended_here=True),
    ]
    with caplog.at_level(logging.DEBUG, logger=OURS):
        log_resolutions(f"commit of run {RUN}", few)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "orders-0 (producer id 1000, epoch 0): committed by this call"),
        ("INFO", "orders-1 (producer id 1000, epoch 0): already committed"),
        ("INFO", "orders-2 (producer id 1000, epoch 0): aborted by this call"),
        ("INFO", f"commit of run {RUN}: 3 transaction(s): 1 committed and 1 aborted by this call, "
                 "1 already ended, 0 lost"),
    ]  # fmt: skip

    caplog.clear()
    many = [resolution(f"orders-{i}", Verdict.COMMITTED, "committed by this call", True) for i in range(199)]
    many.append(resolution("orders-199", Verdict.LOST, "the transaction was aborted"))
    assert len(many) > FEW_TRANSACTIONS
    with caplog.at_level(logging.INFO, logger=OURS):
        log_resolutions(f"commit of run {RUN}", many)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "orders-199 (producer id 1000, epoch 0): lost: the transaction was aborted"),
        ("WARNING", f"commit of run {RUN}: 200 transaction(s): 199 committed and 0 aborted by this call, "
                    "0 already ended, 1 lost"),
    ]  # fmt: skip
