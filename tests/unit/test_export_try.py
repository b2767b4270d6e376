"""An export try's number on the broker, and the check a writer makes before it takes its id
(DESIGN §15): a try that a newer one superseded while it was paused stands down untouched."""

from __future__ import annotations

import pytest

from airflow_provider_kafka2pc.txn.kafka.errors import UnmappableConfigError
from airflow_provider_kafka2pc.txn.protocol.errors import SupersededExportError
from airflow_provider_kafka2pc.txn.protocol.naming import Members, NamingStrategy, belongs_to, try_id
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.export_try import ExportTry, begin_try, check_held, check_unmoved, see_try
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from tests.unit.fakes import FakeBroker, MemoryDecisionLog, txn_state

POOL = Members("orders", NamingStrategy.POOLING)
RUN_1 = Members("orders", NamingStrategy.INCREMENTING, "run_1")
CONFIG = {"bootstrap.servers": "b:9092"}


def test_the_try_id_is_the_exporters_or_the_runs_and_never_taken_for_a_slot() -> None:
    assert try_id(POOL) == "orders-try"
    assert try_id(RUN_1) == "orders-run_1-try"
    assert not POOL.owns("orders-try") and not RUN_1.owns("orders-run_1-try")
    assert not belongs_to("orders-try", "orders")  # recovery, list and describe never see it as a transaction


def test_a_newer_try_supersedes_the_older_one_and_only_it() -> None:
    broker = FakeBroker()
    first = begin_try(broker, see_try(broker, POOL), CONFIG)
    check_held(broker, first)  # nothing newer yet
    second = begin_try(broker, see_try(broker, POOL), CONFIG)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    with pytest.raises(SupersededExportError) as raised:
        check_held(broker, first)
    said = str(raised.value)
    assert "exporter 'orders'" in said and "'orders-try' is held by producer" in said
    assert f"epoch {second.producer_epoch}" in said and f"epoch {first.producer_epoch}" in said
    assert "wrote nothing" in said and "clear this task" in said
    check_held(broker, second)
    # An INCREMENTING run's tries are its own: another run's try supersedes nothing of it.
    run_1 = begin_try(broker, see_try(broker, RUN_1), CONFIG)
    begin_try(broker, see_try(broker, Members("orders", NamingStrategy.INCREMENTING, "run_2")), CONFIG)
    check_held(broker, run_1)


def test_a_try_that_finds_its_ids_open_after_its_recovery_pass_stands_down() -> None:
    broker = FakeBroker()
    broker.add(txn_state("orders-3", "Ongoing", 7, 2), txn_state("orders-4", "CompleteCommit", 8, 1))
    with pytest.raises(
        SupersededExportError, match=r"1 of its transaction\(s\) were open .* 'orders-3' by producer 7 epoch 2"
    ):
        begin_try(broker, see_try(broker, POOL), CONFIG)
    broker.add(txn_state("orders-run_2-0", "Ongoing", 9, 0))  # not this run's
    begin_try(broker, see_try(broker, RUN_1), CONFIG)


def test_the_try_travels_to_the_writers_in_the_settings() -> None:
    taken = ExportTry("orders", "orders-try", 1000, 4)
    settings = ExportSettings("orders", {"bootstrap.servers": "b:9092"}, "t", export_try=taken.as_tuple())
    again = ExportSettings.from_json(settings.to_json())
    assert again == settings and again.export_try is not None
    assert ExportTry.from_tuple(again.export_try) == taken


def test_a_broker_that_caps_transactions_at_30_s_gives_a_number_too() -> None:
    broker = FakeBroker()
    broker.max_transaction_timeout_ms = 30_000  # the id never holds a transaction: a short timeout does
    check_held(broker, begin_try(broker, see_try(broker, POOL), CONFIG))


def test_an_open_transaction_found_before_the_number_leaves_the_number_alone() -> None:
    """A try that comes back before it took its number must not supersede the try that is writing."""
    broker = FakeBroker()
    live = begin_try(broker, see_try(broker, POOL), CONFIG)
    broker.add(txn_state("orders-0", "Ongoing", live.producer_id + 1, 0))  # the live try's writer
    with pytest.raises(SupersededExportError, match="were open before this try took its number"):
        begin_try(broker, see_try(broker, POOL), CONFIG)
    check_held(broker, live)
    # A transaction still ending (markers being written) is nobody's writer: not a reason to stand down.
    broker.set_state("orders-0", "PrepareCommit")
    begin_try(broker, see_try(broker, POOL), CONFIG)


def test_a_connection_setting_the_writers_check_cannot_honour_is_refused_on_the_driver_by_name() -> None:
    broker = FakeBroker()
    config = {**CONFIG, "security.protocol": "SSL", "enable.ssl.certificate.verification": "false"}
    with pytest.raises(UnmappableConfigError, match=r"'enable.ssl.certificate.verification'.*producer_config"):
        begin_try(broker, see_try(broker, POOL), config)
    assert not any(e.startswith("init_producer_id") for e in broker.events)


def test_a_try_that_comes_back_after_another_took_a_number_takes_none_and_ends_nothing() -> None:
    """Paused after it looked at the try id (before its checks and its recovery pass): back after a
    newer try took a number and opened a transaction, its recovery pass aborts nothing and it takes
    no number."""
    broker, log = FakeBroker(), MemoryDecisionLog()
    stale = see_try(broker, POOL)
    live = begin_try(broker, see_try(broker, POOL), CONFIG)
    broker.add(txn_state("orders-0", "Ongoing", live.producer_id + 1, 0))  # the live try's writer
    with pytest.raises(SupersededExportError, match="another try took a number since this one began"):
        recover(broker, "orders", log, before_abort=lambda: check_unmoved(broker, stale))
    assert broker.aborts_sent() == [] and broker.state_of("orders-0") == "Ongoing"
    assert log.read().decisions == {}
    with pytest.raises(SupersededExportError, match="another try took a number since this one began"):
        begin_try(broker, stale, CONFIG)
    check_held(broker, live)
    # A pass whose try began after that number (nothing moved since) aborts what is open, as before.
    fresh = see_try(broker, POOL)
    recover(broker, "orders", log, before_abort=lambda: check_unmoved(broker, fresh))
    assert broker.aborts_sent() == ["orders-0"]
