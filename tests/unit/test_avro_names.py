"""Avro's rules checked locally, before a schema is sent anywhere: the names a schema may hold
(``registry/avro_names.py``) and the common reasons a new schema cannot follow the latest one
(``registry/avro_compat.py``), with the words ``registry/errors.py`` gives them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_kafka2pc.registry import errors
from airflow_provider_kafka2pc.registry.avro_compat import Difference, differences
from airflow_provider_kafka2pc.registry.avro_names import NameProblem, problems, suggested, valid


def _record(name: str, *fields: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields], **extra}


def test_names_are_letters_digits_and_underscores_not_starting_with_a_digit() -> None:
    assert all(valid(n) for n in ("id", "_x", "order_id", "A1"))
    assert not any(valid(n) for n in ("order-id", "1st", "", "naïve", "a.b", "with space"))
    assert [suggested(n) for n in ("order-id", "1st", "naïve", "a b")] == ["order_id", "_1st", "na_ve", "a_b"]


def test_a_valid_schema_has_no_problems() -> None:
    schema = _record(
        "Order",
        ("id", "long"),
        ("tags", {"type": "array", "items": "string"}),
        ("address", ["null", _record("Address", ("city", "string"))]),
        ("home", ["null", "Address"]),  # a reference to the name defined above, not a second definition
        namespace="shop",
    )
    assert problems(schema, "value") == []
    assert problems("string", "key") == []


def test_invalid_names_are_found_where_they_are() -> None:
    schema = _record(
        "Order",
        ("order-id", "long"),
        ("lines", {"type": "array", "items": _record("Line", ("unit price", "double"))}),
        ("state", {"type": "enum", "name": "State", "symbols": ["OPEN", "in-flight"]}),
        ("by", {"type": "map", "values": _record("Who", ("e-mail", "string"))}),
        namespace="shop-v1",
    )
    assert problems(schema, "value") == [
        NameProblem("value", "shop-v1", "namespace"),
        NameProblem("value.order-id", "order-id", "field"),
        NameProblem("value.lines[].unit price", "unit price", "field"),
        NameProblem("value.state", "in-flight", "symbol"),
        NameProblem("value.by{}.e-mail", "e-mail", "field"),
    ]


def test_a_struct_with_an_invalid_name_is_one_problem_not_two() -> None:
    # A derived schema names a nested struct's record after the column: the column is the cause.
    schema = _record("v", ("ship-to", _record("v_ship-to", ("city", "string"))))
    assert problems(schema, "value") == [NameProblem("value.ship-to", "ship-to", "field")]
    assert problems(_record("my-record", ("id", "long")), "key") == [NameProblem("key", "my-record", "record")]


def test_a_name_defined_twice_and_a_field_twice_are_found() -> None:
    schema = _record(
        "v",
        ("a", _record("v_a", ("b", ["null", _record("v_a_b", ("x", "long"))]))),
        ("a_b", _record("v_a_b", ("x", "long"))),
        ("id", "long"),
        ("id", "string"),
    )
    assert problems(schema, "value") == [
        NameProblem("value.a_b", "v_a_b", "redefined", "value.a.b"),
        NameProblem("value.id", "id", "duplicate"),
    ]
    # The same short name in two namespaces is two names.
    two = _record("v", ("a", _record("X", namespace="one")), ("b", _record("X", namespace="two")))
    assert problems(two, "value") == []


def test_the_words_name_the_column_the_rule_and_the_fix() -> None:
    derived = errors.bad_names(
        "value",
        "orders-value",
        [
            NameProblem("value.order-id", "order-id", "field"),
            NameProblem("value.a_b", "v_a_b", "redefined", "value.a.b"),
        ],
        given=False,
    )
    assert str(derived) == (
        "the value schema for subject 'orders-value' has names Avro does not allow, so no registry or spark-avro "
        f"would take it; {errors.NOTHING_WRITTEN}: field 'value.order-id': 'order-id' is not a valid Avro name "
        "(letters, digits and _, not starting with a digit): rename the column with an alias, e.g. "
        "F.col('`order-id`').alias('order_id'); fields 'value.a.b' and 'value.a_b' are both the Avro type "
        "'v_a_b', and a schema defines a name once (a derived schema names a struct's record after its path): "
        "rename one of the columns with an alias (e.g. F.col('a_b').alias('a_b_2')), or give the schema"
    )
    given = errors.bad_names("value", "s", [NameProblem("value.order-id", "order-id", "field")], given=True)
    assert "rename it in the schema (and the column) to a valid name, e.g. 'order_id'" in str(given)
    record = errors.bad_names("key", "s", [NameProblem("key", "my-record", "record")], given=False)
    assert "give the format a valid record_name=, e.g. 'my_record'" in str(record)


LATEST = _record("Order", ("id", "long"), ("name", "string"), ("amount", ["null", "double"]))


def _changed(**changes: Any) -> dict[str, Any]:
    new: dict[str, Any] = json.loads(json.dumps(LATEST))
    fields = {f["name"]: f for f in new["fields"]}
    for name, change in changes.items():
        if change is None:
            new["fields"].remove(fields[name])
        elif name in fields:
            fields[name].update(change)
        else:
            new["fields"].append({"name": name, **change})
    return new


@pytest.mark.parametrize(
    ("new", "level", "found"),
    [
        (_changed(code={"type": "string"}), "BACKWARD", [Difference("value.code", "added")]),
        (_changed(code={"type": "string"}), "FORWARD", []),  # old readers skip a field they lack
        (_changed(code={"type": "string", "default": ""}), "FULL", []),
        (_changed(name=None), "FORWARD", [Difference("value.name", "removed")]),
        (_changed(name=None), "BACKWARD_TRANSITIVE", []),
        (_changed(amount=None), "FULL", [Difference("value.amount", "removed")]),
        (_changed(id={"type": "string"}), "FULL", [Difference("value.id", "type", "long", "string")]),
        (_changed(id={"type": "double"}), "BACKWARD", []),  # Avro reads a long as a double
        (_changed(id={"type": "double"}), "FORWARD", [Difference("value.id", "type", "long", "double")]),
        (_changed(name={"type": "bytes"}), "FULL", []),
        (
            _changed(amount={"type": "double"}),
            "BACKWARD",
            [Difference("value.amount", "type", "null or double", "double")],
        ),
        (_changed(amount={"type": "double"}), "FORWARD", []),
        (_changed(id={"type": "string"}), "NONE", []),
        (_changed(name={"aliases": ["title"]}), "FULL", []),
    ],
)
def test_the_common_incompatibilities_are_found_by_field(
    new: dict[str, Any], level: str, found: list[Difference]
) -> None:
    assert differences(LATEST, new, level, "value") == found


def test_a_nested_record_is_compared_field_by_field() -> None:
    latest = _record(
        "v", ("ship", ["null", _record("v_ship", ("city", "string"))]), ("lines", {"type": "array", "items": "int"})
    )
    new = _record(
        "v",
        ("ship", ["null", _record("v_ship", ("city", "string"), ("zip", "string"))]),
        ("lines", {"type": "array", "items": "string"}),
    )
    assert differences(latest, new, "BACKWARD", "value") == [
        Difference("value.ship.zip", "added"),
        Difference("value.lines[]", "type", "int", "string"),
    ]


def test_the_comparison_in_words() -> None:
    said = errors.compared(4, [Difference("value.id", "type", "long", "string")], "")
    assert said == (
        "the registry gave no reason; compared with version 4: field 'value.id' changes type from long to string, "
        "which one side cannot read: keep long (Avro reads int as long, float or double, long as float or double, "
        "float as double, string and bytes as each other)"
    )
    assert errors.compared(None, [], "Incompatible").startswith(
        "the registry said 'Incompatible'; compared with the latest version here, none of the common causes"
    )
