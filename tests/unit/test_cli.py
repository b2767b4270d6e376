"""The ``kafka2pc`` command line against the in-memory broker and decision log."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc import cli
from airflow_provider_kafka2pc.txn.decision_log import Decision, DecisionLog, DecisionSnapshot, RunMark
from airflow_provider_kafka2pc.txn.errors import BrokerUnavailableError
from airflow_provider_kafka2pc.txn.wire import WireClient
from tests.helpers.no_airflow import REFUSE_AIRFLOW
from tests.unit.fakes import FakeBroker, FakeClock, MemoryDecisionLog, record, txn_state

REPO = Path(__file__).resolve().parents[2]


class ClaimedLog(MemoryDecisionLog):
    def __init__(self, claims: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.claims = dict(claims)

    def read(self) -> DecisionSnapshot:
        base = super().read()
        return DecisionSnapshot(base.latest, self.claims, base.runs)


class FakeConnection(cli.Connection):
    def __init__(self, broker: FakeBroker, log: MemoryDecisionLog, topic_exists: bool = True) -> None:
        super().__init__({"bootstrap.servers": "fake:9092"}, "decisions", 1.0)
        self.broker, self.log, self.topic_exists = broker, log, topic_exists
        self.configs: list[Mapping[str, Any]] = []
        self.closed = False

    def wire(self) -> WireClient:
        return self.broker

    def decision_log(self) -> DecisionLog:
        return self.log

    def decision_topic_exists(self) -> bool:
        return self.topic_exists

    def close(self) -> None:
        self.closed = True

    def __call__(self, config: Mapping[str, Any], topic: str, timeout_s: float) -> FakeConnection:
        self.configs.append(dict(config))
        return self


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures logging as a program does; put it back for the next test."""
    names = ["", "airflow_provider_kafka2pc", "kafka", "kafka2pc.librdkafka"]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    yield
    for n, (level, handlers) in saved.items():
        logging.getLogger(n).setLevel(level)
        logging.getLogger(n).handlers[:] = handlers


@pytest.fixture
def cli_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> FakeClock:
    monkeypatch.setattr(cli, "time", clock)
    return clock


def run(conn: FakeConnection, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), connect=conn)
    out, err = capsys.readouterr()
    return code, out, err


def arranged(broker: FakeBroker) -> MemoryDecisionLog:
    broker.add(
        txn_state("orders-0", "Ongoing", producer_epoch=5, partitions=(0, 2)),  # decided: commit
        txn_state("orders-1", "Ongoing", producer_epoch=5),  # decided for an older epoch: abort
        txn_state("orders-10", "Ongoing"),  # undecided: abort
        txn_state("orders-2", "PrepareCommit"),  # the broker is completing it: wait
        txn_state("orders2-0", "Ongoing"),  # another exporter's
    )
    return ClaimedLog(
        {"orders": "dag.export"},
        initial=[
            record("orders-0", Decision.COMMIT, producer_epoch=5),
            record("orders-1", Decision.COMMIT, producer_epoch=4),
            record("orders-7", Decision.ABORTED, producer_epoch=2),
            record("orders2-0", Decision.COMMIT),
        ],
    )


# -- list ---------------------------------------------------------------------------------


def test_list_joins_each_open_transaction_with_its_decision_and_planned_action(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log = arranged(broker)
    code, out, _ = run(FakeConnection(broker, log), capsys, "list", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OK
    doc = json.loads(out)
    rows = {r["transactional_id"]: r for r in doc["transactions"]}
    assert [r["transactional_id"] for r in doc["transactions"]] == ["orders-0", "orders-1", "orders-2", "orders-10"]
    assert {t: (r["decision"], r["action"]) for t, r in rows.items()} == {
        "orders-0": ("COMMIT", "commit"),
        "orders-1": (None, "abort"),
        "orders-2": (None, "wait"),
        "orders-10": (None, "abort"),
    }
    assert rows["orders-1"]["latest_record"]["producer_epoch"] == 4  # the stale decision explains itself
    assert rows["orders-0"]["partitions"] == [{"topic": "events", "partition": 0}, {"topic": "events", "partition": 2}]
    assert (rows["orders-0"]["producer_id"], rows["orders-0"]["producer_epoch"]) == (1000, 5)
    assert rows["orders-0"]["age_ms"] >= 0
    assert doc["plan"] == {"commit": ["orders-0"], "abort": ["orders-1", "orders-10"], "wait": ["orders-2"]}
    assert broker.end_txn_calls == [] and log.written == []


def test_list_table_is_readable(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(FakeConnection(broker, arranged(broker)), capsys, "list", "--prefix", "orders")
    assert code == cli.EXIT_OK
    lines = out.splitlines()
    assert lines[0] == "prefix orders: 4 open transaction(s)"
    assert lines[1].split() == [
        "TRANSACTIONAL",
        "ID",
        "STATE",
        "PRODUCER",
        "ID",
        "EPOCH",
        "PARTITIONS",
        "AGE",
        "DECISION",
        "ACTION",
    ]
    assert lines[2].split()[:5] == ["orders-0", "Ongoing", "1000", "5", "events[0,2]"]
    assert lines[2].split()[-2:] == ["COMMIT", "commit"]
    assert "none (log: COMMIT for producer 1000 epoch 4)" in lines[3]
    assert lines[4].endswith("wait (broker completing)")
    assert "orders2" not in out


def test_list_without_a_decision_topic_plans_to_abort_and_says_why(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"))
    log = MemoryDecisionLog(initial=[record("orders-0", Decision.COMMIT)])
    code, out, _ = run(FakeConnection(broker, log, topic_exists=False), capsys, "list", "--prefix", "orders")
    assert code == cli.EXIT_OK
    assert "decision topic kafka2pc_decisions does not exist: no decisions" in out
    assert out.splitlines()[-1].split()[-2:] == ["none", "abort"]


# -- describe -----------------------------------------------------------------------------


def test_describe_shows_the_latest_record_per_id_of_the_prefix_and_its_owner(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log = arranged(broker)
    log.write([], marks=[RunMark("orders", "run-9", 1_700_000_000_000, 3, 30), RunMark("orders2", "run-1", 0, 1, 1)])
    conn = FakeConnection(broker, log)
    code, out, _ = run(conn, capsys, "describe", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OK
    doc = json.loads(out)
    assert doc["claim_owner"] == "dag.export"
    assert [(r["transactional_id"], r["decision"], r["producer_epoch"]) for r in doc["records"]] == [
        ("orders-0", "COMMIT", 5),
        ("orders-1", "COMMIT", 4),
        ("orders-7", "ABORTED", 2),
    ]
    assert doc["records"][0]["run"] == "run-1" and doc["records"][0]["time"].endswith("Z")
    assert doc["committed_runs"] == [
        {"run": "run-9", "time": "2023-11-14T22:13:20Z", "at_ms": 1_700_000_000_000, "transactions": 3, "records": 30}
    ]

    code, out, _ = run(conn, capsys, "describe", "--prefix", "orders")
    assert out.splitlines()[:2] == [
        "prefix orders: claimed by dag.export",
        "3 transactional id(s) in decision log kafka2pc_decisions",
    ]
    assert out.splitlines()[2].split()[:3] == ["TRANSACTIONAL", "ID", "DECISION"]
    assert out.splitlines()[-3:-1] == ["1 run(s) decided COMMIT:", "RUN    TIME                  TRANSACTIONS  RECORDS"]
    assert out.splitlines()[-1].split() == ["run-9", "2023-11-14T22:13:20Z", "3", "30"]
    assert broker.end_txn_calls == []


def test_describe_of_an_unclaimed_prefix_without_decisions(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        FakeConnection(broker, MemoryDecisionLog(), topic_exists=False), capsys, "describe", "--prefix", "x"
    )
    assert code == cli.EXIT_OK
    assert out.splitlines() == [
        "prefix x: not claimed",
        "decision topic kafka2pc_decisions does not exist: no decisions",
    ]


# -- resolve ------------------------------------------------------------------------------


def test_resolve_dry_run_prints_the_plan_and_changes_nothing(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log = arranged(broker)
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--dry-run", "--json")
    assert code == cli.EXIT_OPEN  # there is something to do
    doc = json.loads(out)
    assert doc["dry_run"] is True
    assert doc["plan"] == {"commit": ["orders-0"], "abort": ["orders-1", "orders-10"], "wait": ["orders-2"]}
    assert broker.end_txn_calls == [] and log.written == []

    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--dry-run")
    assert out.startswith("dry run: nothing is changed\n")


def test_resolve_commits_the_decided_aborts_the_rest_and_waits_for_the_broker(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    log = arranged(broker)

    class Completing(FakeClock):
        def sleep(self, seconds: float) -> None:  # the broker finishes its PrepareCommit meanwhile
            super().sleep(seconds)
            broker.set_state("orders-2", "CompleteCommit")

    monkeypatch.setattr(cli, "time", Completing())
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders", "--json")
    assert code == cli.EXIT_OK
    doc = json.loads(out)
    assert doc["passes"] == 2 and doc["still_open"] == [] and doc["lost"] == []
    assert [(r["transactional_id"], r["action"], r["outcome"]) for r in doc["resolutions"]] == [
        ("orders-0", "commit", "committed"),
        ("orders-1", "abort", "aborted"),
        ("orders-10", "abort", "aborted"),
    ]
    assert broker.commits_sent() == ["orders-0"]
    assert sorted(broker.aborts_sent()) == ["orders-1", "orders-10"]
    assert broker.state_of("orders2-0") == "Ongoing"
    assert log.decisions("orders-0") == [Decision.COMMITTED]
    assert {r.run for r in log.written} == {"kafka2pc-cli"}

    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders")
    assert code == cli.EXIT_OK
    assert out == "prefix orders: 0 committed, 0 aborted, 0 lost; 0 still open\n"


def test_resolve_table_and_a_transaction_the_broker_never_completes(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"), txn_state("orders-1", "PrepareAbort"))
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, out, _ = run(conn, capsys, "resolve", "--prefix", "orders", "--wait", "2", "--run", "manual")
    assert code == cli.EXIT_OPEN
    lines = out.splitlines()
    assert lines[0] == "prefix orders: 0 committed, 1 aborted, 0 lost; 1 still open"
    assert lines[2].split()[:5] == ["orders-0", "1000", "0", "abort", "aborted"]
    assert lines[-1] == "still open: orders-1 (PrepareAbort)"
    assert 2 <= sum(cli_clock.sleeps) < 3  # waited --wait, in fake time
    assert conn.log.written[0].run == "manual"


def test_resolve_reports_a_decided_transaction_that_was_lost(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    ongoing = txn_state("orders-0", "Ongoing")
    broker.add(ongoing)
    # Listed and planned while Ongoing; aborted by the broker before the commit gets there.
    broker.upcoming_states["orders-0"] = [ongoing, txn_state("orders-0", "CompleteAbort")]
    log = MemoryDecisionLog(initial=[record("orders-0", Decision.COMMIT)])
    code, out, _ = run(FakeConnection(broker, log), capsys, "resolve", "--prefix", "orders")
    assert code == cli.EXIT_LOST
    assert out.splitlines()[-1] == "LOST (had a COMMIT decision, can no longer commit): orders-0"
    assert log.decisions("orders-0")[-1] is Decision.LOST


def test_resolve_refuses_a_missing_decision_topic_unless_told(
    cli_clock: FakeClock, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.add(txn_state("orders-0", "Ongoing"))
    conn = FakeConnection(broker, MemoryDecisionLog(), topic_exists=False)
    code, out, err = run(conn, capsys, "resolve", "--prefix", "orders", "--decision-topic", "typo")
    assert code == cli.EXIT_USAGE and out == ""
    assert "decision topic 'typo' does not exist" in err and "Traceback" not in err
    assert broker.end_txn_calls == []
    code, _, _ = run(conn, capsys, "resolve", "--prefix", "orders", "--allow-missing-decision-topic")
    assert code == cli.EXIT_OK and broker.aborts_sent() == ["orders-0"]


# -- input, errors, secrets ---------------------------------------------------------------


def test_an_invalid_prefix_is_refused_before_connecting(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, out, err = run(conn, capsys, "list", "--prefix", "orders-eu")
    assert code == cli.EXIT_USAGE and out == ""
    assert err.startswith("kafka2pc: error: invalid transactional id prefix 'orders-eu'")
    assert conn.configs == []


def test_prefix_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["describe"])
    assert e.value.code == cli.EXIT_USAGE
    assert "--prefix" in capsys.readouterr().err


def test_config_settings_and_files_reach_the_clients(
    tmp_path: Path, broker: FakeBroker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cli.ENV_BOOTSTRAP, "env-host:9093")
    f = tmp_path / "client.properties"
    f.write_text("# secrets stay off the command line\nsasl.password=s3cret=with=equals\n\nsasl.username=u\n")
    conn = FakeConnection(broker, MemoryDecisionLog())
    code, _, _ = run(
        conn, capsys, "describe", "--prefix", "o", "--config-file", str(f), "--config", "security.protocol=SASL_SSL"
    )
    assert code == cli.EXIT_OK
    assert conn.configs == [
        {
            "bootstrap.servers": "env-host:9093",
            "sasl.password": "s3cret=with=equals",
            "sasl.username": "u",
            "security.protocol": "SASL_SSL",
        }
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "hunter2"], "--config #1: expected KEY=VALUE"),
        (["--config", "=hunter2"], "--config #1: expected KEY=VALUE"),
        (["--config", "bootstrap.servers=h:1"], "with --bootstrap-servers"),
        (["--config-file", "/nonexistent/kafka2pc.properties"], "cannot read --config-file"),
    ],
)
def test_bad_config_is_a_usage_error_that_never_echoes_the_value(
    argv: list[str], message: str, broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(FakeConnection(broker, MemoryDecisionLog()), capsys, "list", "--prefix", "o", *argv)
    assert code == cli.EXIT_USAGE and out == ""
    assert message in err and "hunter2" not in err


def test_errors_are_one_line_and_never_show_a_secret(capsys: pytest.CaptureFixture[str]) -> None:
    def down(config: Mapping[str, Any], topic: str, timeout_s: float) -> cli.Connection:
        raise BrokerUnavailableError(f"cannot reach Kafka (tried with {config['sasl.password']})")

    code = cli.main(["list", "--prefix", "o", "--config", "sasl.password=hunter2"], connect=down)
    err = capsys.readouterr().err
    assert code == cli.EXIT_FAILED
    assert err == "kafka2pc: error: cannot reach Kafka (tried with ***)\n"


def test_an_unexpected_error_has_no_traceback_unless_debug(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(config: Mapping[str, Any], topic: str, timeout_s: float) -> cli.Connection:
        logging.getLogger("airflow_provider_kafka2pc.txn").warning("password is %s", config["sasl.password"])
        raise RuntimeError(f"boom {config['sasl.password']}")

    argv = ["list", "--prefix", "o", "--config", "sasl.password=hunter2"]
    assert cli.main(argv, connect=broken) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" not in err and "hunter2" not in err
    assert "kafka2pc: error: RuntimeError: boom *** (--debug shows the traceback)" in err
    assert "password is ***" in err

    assert cli.main([*argv, "--debug"], connect=broken) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" in err and "hunter2" not in err


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (999, "0s"), (59_000, "59s"), (61_000, "1m01s"), (7_260_000, "2h01m"), (90_000_000, "1d01h")],
)
def test_durations(ms: int | None, text: str) -> None:
    assert cli._duration(ms) == text


def test_the_cli_never_imports_airflow() -> None:
    """Import, parse, validate and connect (to nothing) with every airflow import refused."""
    script = REFUSE_AIRFLOW + textwrap.dedent(
        """
        from airflow_provider_kafka2pc import cli
        assert cli.main(["list", "--prefix", "bad-prefix"]) == cli.EXIT_USAGE
        code = cli.main(["resolve", "--prefix", "p", "--bootstrap-servers", "127.0.0.1:9", "--timeout", "1"])
        assert code == cli.EXIT_FAILED, code
        assert "kafka" in sys.modules  # the Kafka client was really reached
        loaded = [m for m in sys.modules if m == "airflow" or m.startswith("airflow.")]
        assert loaded == [], loaded
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "cannot reach Kafka at 127.0.0.1:9" in proc.stderr
