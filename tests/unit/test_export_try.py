"""An export try's number on the broker, and the check a writer makes before it takes its id
(DESIGN §15): a try that a newer one superseded while it was paused stands down untouched."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.protocol.errors import SupersededExportError
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, belongs_to, try_id
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.export_try import ExportTry, begin_try, check_held
from tests.unit.fakes import FakeBroker, txn_state

POOL = Members("orders", NamingStrategy.POOLING)
RUN_1 = Members("orders", NamingStrategy.INCREMENTING, "run_1")


def test_the_try_id_is_the_exporters_or_the_runs_and_never_taken_for_a_slot() -> None:
    assert try_id(POOL) == "orders-try"
    assert try_id(RUN_1) == "orders-run_1-try"
    assert not POOL.owns("orders-try") and not RUN_1.owns("orders-run_1-try")
    assert not belongs_to("orders-try", "orders")  # recovery, list and describe never see it as a transaction


def test_a_newer_try_supersedes_the_older_one_and_only_it() -> None:
    broker = FakeBroker()
    first = begin_try(broker, POOL)
    check_held(broker, first)  # nothing newer yet
    second = begin_try(broker, POOL)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    with pytest.raises(SupersededExportError) as raised:
        check_held(broker, first)
    said = str(raised.value)
    assert "exporter 'orders'" in said and "'orders-try' is held by producer" in said
    assert f"epoch {second.producer_epoch}" in said and f"epoch {first.producer_epoch}" in said
    assert "wrote nothing" in said
    check_held(broker, second)
    # An INCREMENTING run's tries are its own: another run's try supersedes nothing of it.
    run_1 = begin_try(broker, RUN_1)
    begin_try(broker, Members("orders", NamingStrategy.INCREMENTING, "run_2"))
    check_held(broker, run_1)


def test_a_try_that_finds_its_ids_open_after_its_recovery_pass_stands_down() -> None:
    broker = FakeBroker()
    broker.add(txn_state("orders-3", "Ongoing", 7, 2), txn_state("orders-4", "CompleteCommit", 8, 1))
    with pytest.raises(SupersededExportError, match=r"1 of its transactions .* 'orders-3' by producer 7 epoch 2"):
        begin_try(broker, POOL)
    broker.add(txn_state("orders-run_2-0", "Ongoing", 9, 0))  # not this run's
    begin_try(broker, RUN_1)


def test_the_try_travels_to_the_writers_in_the_settings() -> None:
    taken = ExportTry("orders", "orders-try", 1000, 4)
    settings = ExportSettings("orders", {"bootstrap.servers": "b:9092"}, "t", export_try=taken.as_tuple())
    again = ExportSettings.from_json(settings.to_json())
    assert again == settings and again.export_try is not None
    assert ExportTry.from_tuple(again.export_try) == taken
