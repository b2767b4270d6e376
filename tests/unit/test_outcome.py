"""The outcome table (DESIGN §5): what the broker's view of a committable means."""

from __future__ import annotations

import itertools

import pytest

from airflow_provider_kafka2pc.txn.protocol import outcome
from airflow_provider_kafka2pc.txn.protocol.outcome import (
    OUTCOME_TABLE,
    RETRIABLE,
    Intent,
    Observation,
    TxnRef,
    Verdict,
    observe,
    reason,
    verdict,
)

REF = TxnRef("orders-0", producer_id=4711, producer_epoch=5)


def test_table_covers_every_observation_and_intent() -> None:
    assert set(OUTCOME_TABLE) == set(itertools.product(Observation, Intent))


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("Ongoing", Observation.OPEN),
        ("PrepareCommit", Observation.COMMITTING),
        ("CompleteCommit", Observation.COMMITTED),
        ("PrepareAbort", Observation.ABORTING),
        ("CompleteAbort", Observation.ABORTED),
        ("PrepareEpochFence", Observation.FENCING),
        ("Empty", Observation.EMPTY),
    ],
)
def test_same_producer_and_epoch(state: str, expected: Observation) -> None:
    assert observe(REF, state, 4711, 5) is expected


@pytest.mark.parametrize("state", ["Ongoing", "PrepareCommit", "CompleteCommit", "CompleteAbort", "Empty"])
@pytest.mark.parametrize(("pid", "epoch"), [(4711, 6), (4711, 4), (4712, 5), (9, 0)])
def test_another_epoch_or_producer_is_superseded(state: str, pid: int, epoch: int) -> None:
    assert observe(REF, state, pid, epoch) is Observation.SUPERSEDED


def test_epoch_fence_of_our_producer_is_fencing_even_with_the_bumped_epoch() -> None:
    assert observe(REF, "PrepareEpochFence", 4711, 6) is Observation.FENCING
    assert observe(REF, "PrepareEpochFence", 4712, 0) is Observation.SUPERSEDED


@pytest.mark.parametrize("state", [None, "Dead"])
def test_unknown_id(state: str | None) -> None:
    assert observe(REF, state, -1, -1) is Observation.UNKNOWN_ID


def test_unexpected_state_is_not_guessed() -> None:
    with pytest.raises(ValueError, match="Whatever"):
        observe(REF, "Whatever", 4711, 5)


@pytest.mark.parametrize("observation", [Observation.OPEN])
@pytest.mark.parametrize("intent", list(Intent))
def test_open_transaction_is_ended_as_intended(observation: Observation, intent: Intent) -> None:
    assert verdict(observation, intent) is Verdict.END_TXN


@pytest.mark.parametrize("observation", [Observation.COMMITTING, Observation.COMMITTED])
@pytest.mark.parametrize("intent", list(Intent))
def test_committed_transaction_is_never_aborted(observation: Observation, intent: Intent) -> None:
    assert verdict(observation, intent) is Verdict.COMMITTED


@pytest.mark.parametrize("observation", [Observation.ABORTING, Observation.ABORTED, Observation.EMPTY])
def test_aborted_transaction_is_lost_for_a_commit(observation: Observation) -> None:
    assert verdict(observation, Intent.COMMIT) is Verdict.LOST
    assert verdict(observation, Intent.ABORT) is Verdict.ABORTED


@pytest.mark.parametrize("observation", [Observation.SUPERSEDED, Observation.UNKNOWN_ID])
@pytest.mark.parametrize("intent", list(Intent))
def test_gone_from_the_broker_consults_the_decision_log(observation: Observation, intent: Intent) -> None:
    assert verdict(observation, intent) is Verdict.CONSULT_LOG


@pytest.mark.parametrize("intent", list(Intent))
def test_fencing_waits(intent: Intent) -> None:
    assert verdict(Observation.FENCING, intent) is Verdict.WAIT


def test_no_observation_is_ended_except_an_open_one() -> None:
    ended = {obs for (obs, _), v in OUTCOME_TABLE.items() if v is Verdict.END_TXN}
    assert ended == {Observation.OPEN}


@pytest.mark.parametrize("observation", [o for o in Observation if verdict(o, Intent.COMMIT) is not Verdict.END_TXN])
def test_every_non_open_observation_has_a_reason(observation: Observation) -> None:
    assert reason(observation)


def test_superseded_reason_names_timeout_and_fencing() -> None:
    text = reason(Observation.SUPERSEDED)
    assert "transaction.timeout.ms" in text and "fenced" in text


def test_retriable_codes_are_exactly_the_coordinator_and_transient_ones() -> None:
    assert {
        outcome.NOT_COORDINATOR,
        outcome.COORDINATOR_NOT_AVAILABLE,
        outcome.COORDINATOR_LOAD_IN_PROGRESS,
        outcome.CONCURRENT_TRANSACTIONS,
    } == {16, 15, 14, 51}
    assert frozenset({16, 15, 14, 51, 7, 19}) == RETRIABLE


@pytest.mark.parametrize("code", [90, 47, 48, 49, 105, 0])
def test_fatal_codes_are_not_retried(code: int) -> None:
    """PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE … are classified by a fresh describe."""
    assert code not in RETRIABLE


def test_error_code_numbers_match_the_kafka_protocol() -> None:
    import kafka.errors as errors

    for name in (
        "REQUEST_TIMED_OUT",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "NOT_ENOUGH_REPLICAS",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "INVALID_PRODUCER_ID_MAPPING",
        "CONCURRENT_TRANSACTIONS",
        "PRODUCER_FENCED",
        "TRANSACTIONAL_ID_NOT_FOUND",
    ):
        code = getattr(outcome, name)
        assert errors.for_code(code).message == name, name
