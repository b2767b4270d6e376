"""Transactional ids: building them, and recognising exactly one exporter's ids (DESIGN §7)."""

from __future__ import annotations

import re

import pytest

from airflow_provider_kafka2pc.txn.protocol.errors import InvalidPrefixError
from airflow_provider_kafka2pc.txn.protocol.naming import (
    OFFSETS_SLOT,
    NamingStrategy,
    ParsedId,
    belongs_to,
    broker_pattern,
    parse_transactional_id,
    sanitize_run_key,
    transactional_id,
    validate_prefix,
)

AIRFLOW_RUN_ID = "manual__2026-11-21T10:00:00+00:00"


def test_pooling_is_the_default_and_reuses_the_same_id_every_run() -> None:
    assert transactional_id("orders", 0) == "orders-0"
    assert transactional_id("orders", 17, NamingStrategy.POOLING) == "orders-17"
    assert transactional_id("orders", 3, NamingStrategy.POOLING, run_key="run_1") == "orders-3"


def test_incrementing_puts_the_run_key_between_prefix_and_slot() -> None:
    assert transactional_id("orders", 3, NamingStrategy.INCREMENTING, run_key="run_1") == "orders-run_1-3"


def test_incrementing_without_a_run_key_is_refused() -> None:
    with pytest.raises(ValueError, match="run key"):
        transactional_id("orders", 0, NamingStrategy.INCREMENTING)


def test_negative_slot_is_refused() -> None:
    with pytest.raises(ValueError, match="slot"):
        transactional_id("orders", -2)


def test_the_offsets_participant_is_named_offsets_and_parses_back_to_its_slot() -> None:
    pooled = transactional_id("orders", OFFSETS_SLOT)
    fresh = transactional_id("orders", OFFSETS_SLOT, NamingStrategy.INCREMENTING, run_key="run_1")
    assert (pooled, fresh) == ("orders-offsets", "orders-run_1-offsets")
    assert parse_transactional_id(pooled) == ParsedId("orders", None, OFFSETS_SLOT)
    assert parse_transactional_id(fresh) == ParsedId("orders", "run_1", OFFSETS_SLOT)
    assert belongs_to(pooled, "orders") and not belongs_to(pooled, "orders2")
    assert parse_transactional_id("orders-offset") is None and parse_transactional_id("orders-x-offsetss") is None


@pytest.mark.parametrize("prefix", ["orders", "Orders2", "0rders", "orders.v2", "orders_eu", "a", "a" * 150])
def test_prefix_of_letters_digits_dots_and_underscores_is_accepted(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize(
    "prefix",
    [
        "orders-eu",  # the delimiter
        "-orders",
        "",
        " ",
        "orders eu",
        " orders",
        "orders\t",
        "orders\n",  # whitespace at the end too
        "orders:eu",
        "orders/eu",
        "orders*",
        ".orders",  # must start with a letter or digit
        "_orders",
        "a" * 151,
    ],
)
def test_invalid_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidPrefixError):
        validate_prefix(prefix)
    with pytest.raises(InvalidPrefixError):
        transactional_id(prefix, 0)


def test_refusal_explains_the_delimiter() -> None:
    with pytest.raises(InvalidPrefixError, match="delimiter"):
        validate_prefix("orders-eu")


def test_ids_round_trip_through_parse() -> None:
    assert parse_transactional_id(transactional_id("orders", 7)) == ParsedId("orders", None, 7)
    tid = transactional_id("orders", 7, NamingStrategy.INCREMENTING, run_key="run_1")
    assert parse_transactional_id(tid) == ParsedId("orders", "run_1", 7)


@pytest.mark.parametrize("tid", ["orders-0", "orders-12", "orders-run_1-3", "orders-20261121T1000-0"])
def test_belongs_to_own_ids(tid: str) -> None:
    assert belongs_to(tid, "orders")


@pytest.mark.parametrize(
    "tid",
    [
        "orders2-0",  # another prefix that starts with ours
        "ordersx-0",
        "orders-x",  # no slot
        "orders-",
        "orders--0",  # empty run key
        "orders-a-b-0",  # too many parts: could be prefix 'orders-a' of someone else
        "orders",
        "orders-0-",
        "orders-0x",
        "xorders-0",
        "other-0",
        "orders-run 1-0",
        "orders-x\n-0",  # a run key we would never write
        "orders-\u0661",  # ARABIC-INDIC DIGIT ONE: not a slot we write
    ],
)
def test_belongs_to_is_delimiter_aware_and_exact(tid: str) -> None:
    assert not belongs_to(tid, "orders")


def test_other_prefixes_own_their_ids() -> None:
    assert belongs_to("orders2-0", "orders2")
    assert not belongs_to("orders2-0", "orders")
    assert not belongs_to("orders-0", "orders2")


@pytest.mark.parametrize("tid", ["orders-\u00b2", "orders-run-\u00b2", "x-\u2463"])
def test_parse_never_raises_on_a_foreign_id(tid: str) -> None:
    """ListTransactions returns every id on the broker; one odd id must not break the listing."""
    assert parse_transactional_id(tid) is None
    assert not belongs_to(tid, "orders")


def test_airflow_run_id_becomes_a_run_key_that_round_trips() -> None:
    key = sanitize_run_key(AIRFLOW_RUN_ID)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._]*", key), key
    tid = transactional_id("orders", 4, NamingStrategy.INCREMENTING, run_key=AIRFLOW_RUN_ID)
    assert tid == f"orders-{key}-4"
    assert parse_transactional_id(tid) == ParsedId("orders", key, 4)
    assert belongs_to(tid, "orders")


def test_distinct_run_ids_give_distinct_ids() -> None:
    other_run = "manual__2026-11-21T10:00:01+00:00"
    a = transactional_id("orders", 0, NamingStrategy.INCREMENTING, run_key=AIRFLOW_RUN_ID)
    b = transactional_id("orders", 0, NamingStrategy.INCREMENTING, run_key=other_run)
    assert a != b


@pytest.mark.parametrize("run_key", ["", "---", "::+", "__"])
def test_run_key_without_usable_characters_is_refused(run_key: str) -> None:
    with pytest.raises(InvalidPrefixError):
        sanitize_run_key(run_key)


def test_broker_pattern_matches_the_prefix_ids() -> None:
    pattern = re.compile(broker_pattern("orders.v2"))
    assert pattern.fullmatch("orders.v2-0")
    assert pattern.fullmatch("orders.v2-run_1-3")
    assert not pattern.fullmatch("ordersXv2-0")  # '.' is escaped
    assert not pattern.fullmatch("orders.v22-0")
    assert not pattern.fullmatch("x-orders.v2-0")


def test_broker_pattern_is_coarse_and_the_client_filter_is_exact() -> None:
    listed = ["orders-0", "orders-run_1-3", "orders-x", "orders--0", "orders-a-b-0", "orders2-0", "other-0"]
    pattern = re.compile(broker_pattern("orders"))
    server_side = [t for t in listed if pattern.fullmatch(t)]
    assert "orders2-0" not in server_side and "other-0" not in server_side
    assert [t for t in server_side if belongs_to(t, "orders")] == ["orders-0", "orders-run_1-3"]


def test_broker_pattern_refuses_an_invalid_prefix() -> None:
    with pytest.raises(InvalidPrefixError):
        broker_pattern("orders-eu")
