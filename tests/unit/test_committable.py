"""The committable: what crosses from the prepare task to the commit task (through XCom)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

EXPECTED_KEYS = {
    "transactional_id",
    "producer_id",
    "producer_epoch",
    "records",
    "bytes",
    "topic_partitions",
    "first_write_ms",
    "transaction_timeout_ms",
    "counts_by_topic",
    "digest",  # of the records' keys and values (a repair's proof), never of anything else
}


@pytest.fixture
def c() -> Committable:
    return Committable(
        transactional_id="orders-3",
        producer_id=4711,
        producer_epoch=5,
        records=1500,
        bytes=150_000,
        topic_partitions=(("orders", 0), ("orders", 3), ("audit", 1)),
        first_write_ms=1_700_000_000_000,
        transaction_timeout_ms=900_000,
        counts_by_topic={"orders": 1000, "audit": 500},
    )


def valid_dict(c: Committable) -> dict[str, Any]:
    return json.loads(c.to_json())  # type: ignore[no-any-return]


def test_json_round_trip_is_equal(c: Committable) -> None:
    again = Committable.from_json(c.to_json())
    assert again == c
    assert again.topic_partitions == (("orders", 0), ("orders", 3), ("audit", 1))
    assert Committable.from_json(c.to_json().encode()) == c


def test_json_is_stable(c: Committable) -> None:
    assert c.to_json() == Committable.from_json(c.to_json()).to_json()


def test_json_carries_exactly_the_transaction_fields_and_nothing_else(c: Committable) -> None:
    data = valid_dict(c)
    assert set(data) == EXPECTED_KEYS
    text = c.to_json().lower()
    for word in ("bootstrap", "sasl", "password", "ssl", "security", "secret", "config"):
        assert word not in text


def test_the_digest_travels_and_must_be_text(c: Committable) -> None:
    with_digest = dataclasses.replace(c, digest="b2sum64:3:00000000000000ff")
    assert Committable.from_json(with_digest.to_json()) == with_digest
    assert Committable.from_json(c.to_json()).digest is None
    with pytest.raises(MalformedCommittableError, match="'digest' must be a non-empty string"):
        Committable.from_dict(valid_dict(c) | {"digest": 7})


def test_counts_by_topic_is_optional(c: Committable) -> None:
    data = valid_dict(c)
    del data["counts_by_topic"]
    assert Committable.from_dict(data).counts_by_topic == {}


def test_what_the_commit_does_not_need_is_optional(c: Committable) -> None:
    """A committable from a version-2 XCom has no bytes, partitions, first write or timeout."""
    data = {k: v for k, v in valid_dict(c).items() if k in REQUIRED_KEYS | {"counts_by_topic"}}
    again = Committable.from_dict(data)
    assert (again.bytes, again.topic_partitions, again.first_write_ms, again.transaction_timeout_ms) == (
        None,
        (),
        None,
        None,
    )
    assert again.topics == ("audit", "orders")
    assert again.describe_partitions() == ()


def test_describe_partitions(c: Committable) -> None:
    assert c.describe_partitions() == ("orders-0", "orders-3", "audit-1")


@pytest.mark.parametrize("text", ["", "not json", "{", b"\xff\xfe"])
def test_not_json(text: str | bytes) -> None:
    with pytest.raises(MalformedCommittableError, match="not JSON"):
        Committable.from_json(text)


@pytest.mark.parametrize("text", ["[]", "[1, 2]", '"orders-0"', "42", "null"])
def test_json_that_is_not_an_object(text: str) -> None:
    with pytest.raises(MalformedCommittableError, match="not a JSON object"):
        Committable.from_json(text)


REQUIRED_KEYS = {"transactional_id", "producer_id", "producer_epoch", "records"}


@pytest.mark.parametrize("field", sorted(REQUIRED_KEYS))
def test_missing_field_is_named(c: Committable, field: str) -> None:
    data = valid_dict(c)
    del data[field]
    with pytest.raises(MalformedCommittableError, match=field):
        Committable.from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("producer_id", True),  # bool is an int in Python, never in a committable
        ("producer_epoch", False),
        ("records", True),
        ("producer_id", "4711"),
        ("producer_epoch", 5.0),
        ("records", None),
        ("first_write_ms", "yesterday"),
        ("transaction_timeout_ms", 1.5),
        ("transactional_id", 3),
        ("transactional_id", ""),
    ],
)
def test_wrong_type_is_named(c: Committable, field: str, value: object) -> None:
    data = valid_dict(c)
    data[field] = value
    with pytest.raises(MalformedCommittableError, match=field):
        Committable.from_json(json.dumps(data))


@pytest.mark.parametrize(
    "bad",
    [
        {"topic_partitions": [["orders", "0"]]},
        {"topic_partitions": [["orders"]]},
        {"topic_partitions": 5},
        {"counts_by_topic": {"orders": "1000"}},
        {"counts_by_topic": []},
    ],
)
def test_malformed_nested_values(c: Committable, bad: dict[str, object]) -> None:
    data = {**valid_dict(c), **bad}
    with pytest.raises(MalformedCommittableError):
        Committable.from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("producer_id", -1, "producer id"),
        ("producer_epoch", -1, "epoch"),
        ("producer_epoch", 32767, "epoch"),
        ("producer_epoch", 100_000, "epoch"),
        ("records", -1, "orders-3"),
        ("transaction_timeout_ms", 0, "timeout"),
        ("transaction_timeout_ms", -5, "timeout"),
    ],
)
def test_out_of_range_values(c: Committable, field: str, value: int, message: str) -> None:
    data = valid_dict(c)
    data[field] = value
    with pytest.raises(MalformedCommittableError, match=message):
        Committable.from_json(json.dumps(data))


def test_largest_valid_epoch_is_accepted(c: Committable) -> None:
    data = valid_dict(c)
    data["producer_epoch"] = 32766
    assert Committable.from_json(json.dumps(data)).producer_epoch == 32766


def test_malformed_is_a_value_error() -> None:
    """Callers that catch ValueError for bad input keep working."""
    with pytest.raises(ValueError):
        Committable.from_json("[]")
