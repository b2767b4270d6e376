"""Kafka stops between prepare and commit: the commit task's last kafka2pc line says the run's state
(no decision written, how many transactions wait, until when) and the next click; doing exactly that
(clear the task once Kafka is back) ends the run exactly once. A clear of the finished run then
answers "already committed" first and duplicates nothing."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_kafka2pc.operators.payload import ExportPayload
from tests.conftest import _start
from tests.helpers.kafka import KafkaEnv, kafka_local, kill_node
from tests.integration.test_decisions_broker import prepare, visible_keys

pytestmark = pytest.mark.kafka


@pytest.fixture
def kafka_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """A broker of this test's own: it is stopped and started again."""
    yield from _start(tmp_path_factory, "kafka1alone", 1)


def commit_task(env: KafkaEnv, monkeypatch: pytest.MonkeyPatch, payload: ExportPayload) -> Any:
    from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator

    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA2PC_DEFAULT",
        json.dumps({"conn_type": "kafka2pc", "host": env.bootstrap, "extra": {"decision_topic": "decisions_lines"}}),
    )
    xcom = payload.to_xcom()

    class TI:
        def xcom_pull(self, task_ids: str, key: str) -> object:
            return xcom if key == "return_value" else None

    class Dag:
        dag_id = "lines"

    op = Kafka2PCCommitOperator(task_id="commit", export_task_ids="prepare", asset_alias=None)
    # The task logger is structlog's (its output depends on what configured logging before): a plain one to catch.
    monkeypatch.setattr(
        Kafka2PCCommitOperator, "log", property(lambda _self: logging.getLogger("kafka2pc.test.commit"))
    )
    context = {"ti": TI(), "run_id": "manual__lines", "dag": Dag(), "outlet_events": {}}
    return lambda: op.execute(context)  # type: ignore[arg-type]


class Lines(logging.Handler):
    """kafka2pc's log lines of the task, caught at the loggers themselves (how Airflow formats and
    routes task logs depends on what ran before in the session)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "outside of the Task Runner" not in record.getMessage():  # Airflow's, about this test calling execute()
            self.lines.append(record.getMessage())

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


@pytest.fixture
def lines() -> Iterator[Lines]:
    from airflow_provider_kafka2pc.operators.commit import Kafka2PCCommitOperator  # noqa: F401  (Airflow configures logging)

    handler = Lines()
    loggers = [logging.getLogger("airflow_provider_kafka2pc"), logging.getLogger("kafka2pc.test.commit")]
    # A logging configuration that ran earlier in the session (disable_existing_loggers) may have
    # disabled the package's loggers, children included: a real task configures logging first.
    ours = [lg for name, lg in list(logging.root.manager.loggerDict.items()) if name.startswith("airflow_provider")]
    disabled = [lg for lg in ours if isinstance(lg, logging.Logger) and lg.disabled]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in disabled:
        lg.disabled = False
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.disabled = False
    yield handler
    for lg, level in saved:
        lg.removeHandler(handler)
        lg.setLevel(level)
    for lg in disabled:
        lg.disabled = True


def test_kafka_down_after_prepare_the_commit_says_state_and_next_click_and_a_clear_finishes(
    kafka_alone: KafkaEnv, monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    env = kafka_alone
    prefix, topic = f"lines{uuid.uuid4().hex[:6]}", env.topic(2)
    committables = prepare(env, prefix, 3, topic, records=200, timeout_ms=120_000)
    summary = {  # as the export reports it (the XCom's committables do not carry these)
        "first_write_ms": min(c.first_write_ms or 0 for c in committables),
        "transaction_timeout_ms": committables[0].transaction_timeout_ms,
    }
    payload = ExportPayload("kafka2pc_default", prefix, "POOLING", None, "EXACTLY_ONCE", tuple(committables), summary)
    commit = commit_task(env, monkeypatch, payload)

    kill_node(env, 1)
    lines.take()
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017  (whichever error the unreachable broker gives)
        commit()
    took = time.monotonic() - started
    last = lines.take()[-1]
    print(f"commit with Kafka down failed after {took:.1f} s; its last kafka2pc line:\n  {last}")
    assert last.startswith(
        "kafka2pc: run lines/manual__lines: no decision was written; 3 transaction(s) with 600 records are prepared, "
        "not visible, until at least "
    ), last
    assert re.search(r"until at least \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\. ", last), last
    assert "Next: clear this commit task after Kafka is back and before then" in last

    kafka_local().start_node(env.directory, 1)
    lines.take()
    counts = commit()  # the clear: the same task again
    assert counts["records"] == 600
    keys = visible_keys(env, topic)
    assert len(keys) == len(set(keys)) == 600 and env.open_transactions(prefix) == []

    lines.take()
    commit()  # a clear of the finished run
    first = lines.take()[0]
    assert re.match(
        r"run lines/manual__lines: already committed: 600 records in 3 transactions of exporter \w+, final at ", first
    ), first
    assert len(visible_keys(env, topic)) == 600
