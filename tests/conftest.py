"""Session fixtures: real Kafka brokers started by the project's own scripts/kafka-local.

A broker that cannot start fails the tests that need it; nothing is skipped.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests that import Airflow get a throw-away home, never the user's ~/airflow; set before any import.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="kafka2pc-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from tests.helpers import cpu_accounting
from tests.helpers.jvm_options import jdk_java_options, spark_class_archive
from tests.helpers.kafka import KafkaEnv, kafka_local
from tests.helpers.oidc import OidcProvider
from tests.helpers.registry import RegistryEnv, schema_registry_local

# Small enough for the timeout tests to finish quickly, and the broker aborts expired
# transactions within a second (see scripts/kafka_local.py). Large enough that a commit process
# spawned right after the prepare still starts outside its 4 s headroom on a loaded CI machine
# (its imports took 2.3 s there with a 6 s cap, and it refused the run as too close to its deadline).
SHORT_TXN_MAX_TIMEOUT_MS = 10_000
# A cap as strict as the transaction-window tests need (issue 20): 30 s.
CAP30_TXN_MAX_TIMEOUT_MS = 30_000


def pytest_configure(config: pytest.Config) -> None:
    """Every JVM of the run gets the tests' options (tests/helpers/jvm_options.py); xdist workers
    inherit them from the controller, which makes Spark's class archive once per checkout. A worker
    counts its CPU in a cgroup of its own (tests/helpers/cpu_accounting.py)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is not None:
        cpu_accounting.join_own_group(worker)
    if worker is not None or "JDK_JAVA_OPTIONS" in os.environ:
        return
    os.environ["JDK_JAVA_OPTIONS"] = jdk_java_options(spark_class_archive())


def run_logs_dir() -> Path | None:
    """Where this run keeps brokers' and DAG runs' logs (scripts/test sets it): one folder per
    pytest-xdist worker, whose brokers and Airflow are its own."""
    base = os.environ.get("KAFKA2PC_TEST_LOGS")
    return Path(base) / os.environ.get("PYTEST_XDIST_WORKER", "main") if base else None


def _start(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    brokers: int,
    oidc_url: str | None = None,
    fixture: str | None = None,
    **kwargs: object,
) -> Iterator[KafkaEnv]:
    """A broker (or 3) for the session; ``fixture`` names a fixture in ``STOPPED_WHEN_DONE``."""
    kl = kafka_local()
    logs = run_logs_dir()
    directory = logs / name if logs else tmp_path_factory.mktemp(name)
    state = kl.start_cluster(directory, brokers=brokers, **kwargs)
    security = {k: v for k, v in kl.client_config(state).items() if k != "bootstrap.servers"}
    bootstrap = state["bootstrap_servers"]
    env = KafkaEnv(Path(directory), bootstrap, brokers, security=security, oidc_url=oidc_url)
    if fixture is not None:
        _running[fixture] = env
    try:
        yield env
    finally:
        _running.pop(fixture or "", None)
        env.close()
        kl.stop_cluster(directory)  # logs stay in the directory for a failed run


# Session brokers that a worker stops as soon as no file left in the run's order uses them: an idle
# 1-node broker costs 0.9 CPU-s a minute, the 3-node cluster 2.9, and the suite is bound by the CPU
# of two cores (a full run kept the 3-node cluster of the leader kills idle for 19 minutes). Sound
# because scripts/test hands files out in collection order (--dist loadfile --no-loadscope-reorder:
# each worker is given the lowest file left), so once a worker runs a file ranked after the last
# user of a broker, no later file of that worker uses it. The broker `kafka` serves nearly every
# file and stays up.
STOPPED_WHEN_DONE = ("kafka_short_timeout", "kafka_cap30", "kafka_cluster", "kafka_secure")
_running: dict[str, KafkaEnv] = {}  # of STOPPED_WHEN_DONE, those this worker started and has not stopped
_stopped_early: set[str] = set()
_file_rank: dict[str, int] = {}  # test file -> its place in the run's order
_last_user: dict[str, int] = {}  # fixture -> the place of the last file that uses it


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    yield from _start(tmp_path_factory, "kafka1", 1)


@pytest.fixture(scope="session")
def kafka_short_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    yield from _start(
        tmp_path_factory, "kafka1short", 1, fixture="kafka_short_timeout", txn_max_timeout_ms=SHORT_TXN_MAX_TIMEOUT_MS
    )


@pytest.fixture(scope="session")
def kafka_cap30(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    yield from _start(
        tmp_path_factory, "kafka1cap30", 1, fixture="kafka_cap30", txn_max_timeout_ms=CAP30_TXN_MAX_TIMEOUT_MS
    )


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    yield from _start(tmp_path_factory, "kafka3", 3, fixture="kafka_cluster")


# The secured broker's SCRAM user and OIDC client for the exporter; made per test session, never committed.
SECURE_EXPORTER = "exporter"
SECURE_EXPORTER_PASSWORD = secrets.token_hex(16)
SECURE_OPERATOR = "ops"  # a second principal: an operations account with fewer ACLs than the exporter
SECURE_OPERATOR_PASSWORD = secrets.token_hex(16)
OIDC_CLIENT = "oauth-exporter"
OIDC_SECRET = secrets.token_hex(16)


@pytest.fixture(scope="session")
def kafka_secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """SASL_SSL with SCRAM-SHA-512 and OAUTHBEARER (a local OIDC provider), StandardAuthorizer denying
    what no ACL allows; ``config`` is the super user."""
    idp = OidcProvider({OIDC_CLIENT: OIDC_SECRET}, kafka_local().OAUTH_AUDIENCE)
    try:
        yield from _start(
            tmp_path_factory,
            "kafka1secure",
            1,
            oidc_url=idp.url,
            fixture="kafka_secure",
            security="sasl_ssl",
            scram_users={SECURE_EXPORTER: SECURE_EXPORTER_PASSWORD, SECURE_OPERATOR: SECURE_OPERATOR_PASSWORD},
            oauth_jwks_url=f"{idp.url}/jwks",
            oauth_issuer=idp.url,
        )
    finally:
        idp.close()


# The loggers whose handlers or levels a program's logging set-up changes (the CLI's main(), in-process).
PROGRAM_LOGGERS = ("", "airflow_provider_kafka2pc", "kafka", "kafka2pc.librdkafka")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A test that sets logging up as a program does (the CLI's main() in-process) leaves a handler
    on the root logger that writes to that test's captured stderr, closed once the test ends: every
    later record of the worker then fails with "I/O operation on closed file", and logging's own
    error report prints the record's exception as raised, before any filter. (CI: the secrets test
    read its exception's password there, after a Kafka-source test had run ``kafka2pc list``.) Put
    their handlers and levels back after every test."""
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in PROGRAM_LOGGERS}
    yield
    for name, (level, handlers) in saved.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).handlers[:] = handlers


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryEnv]:
    """One Apicurio Registry per test session (in memory, basic auth), started by the project's
    scripts/schema-registry-local; one that cannot start fails the tests that need it."""
    srl = schema_registry_local()
    logs = run_logs_dir()
    directory = logs / "registry" if logs else tmp_path_factory.mktemp("registry")
    user, password = "exporter", secrets.token_hex(16)
    state = srl.start_registry(directory, users={user: password})
    try:
        yield RegistryEnv(Path(directory), state["url"], user, password)
    finally:
        srl.stop_registry(directory)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown":
        cpu_accounting.end(item, report)
    if report.failed:
        for name in ("kafka", "kafka_short_timeout", "kafka_cap30", "kafka_cluster", "kafka_secure"):
            env = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if isinstance(env, KafkaEnv):
                report.sections.append(("kafka logs", f"broker logs kept in {env.directory}"))


# The files by the seconds they took in a full run (2026-11-29, this 2-core machine, three workers, a
# fast day: 1,714 s; their wall time per test, setup included, then the CPU-s of the worker's
# processes meanwhile: its brokers, Spark, Airflow, actors), heaviest first. scripts/test hands whole
# files to its workers in this order (pytest-xdist --dist loadfile --no-loadscope-reorder): the long
# ones start first, the short ones fill in at the end. A file not listed runs after these, in
# collection order. The files that use one of the brokers in STOPPED_WHEN_DONE sit close together
# (the 3-node cluster: the leader kills, then test_txn_cluster), so that each worker stops it early;
# the SASL_SSL broker's are ranks 14-20, except the UI module's, which stays among the heaviest.
HEAVIEST_FIRST = (
    "tests/e2e/test_airflow_rest.py",  # 622 s, 386 CPU-s
    "tests/soak/test_soak.py",  # 543 s, 344 CPU-s
    "tests/integration/test_leader_kill.py",  # 431 s, 166 CPU-s: it waits on leader elections
    "tests/integration/test_txn_cluster.py",  # 59 s, 43 CPU-s
    "tests/e2e/test_celery_cluster.py",  # 373 s, 213 CPU-s
    "tests/e2e/test_kafka_source_dag.py",  # 325 s, 216 CPU-s
    "tests/e2e/test_ui_browser.py",  # 305 s, 262 CPU-s
    "tests/integration/test_window_broker.py",  # 221 s, 82 CPU-s
    "tests/e2e/test_window_dag.py",  # 134 s, 56 CPU-s
    "tests/e2e/test_spark_submit_dag.py",  # 150 s alone (2026-12-06): three DAG runs, five spark-submits
    "tests/e2e/test_spark_submit_yarn.py",  # 203 s beside the soak (2026-12-06): a MiniYARNCluster, two apps
    "tests/integration/test_handoff_spark.py",  # 75 s alone (2026-12-06): five spark-submits
    "tests/integration/test_repair_spark.py",  # 152 s, 77 CPU-s
    "tests/integration/test_decisions_broker.py",  # 216 s, 136 CPU-s
    "tests/integration/test_repair_broker.py",  # 131 s, 72 CPU-s
    "tests/integration/test_txn_broker.py",  # 102 s, 33 CPU-s
    "tests/integration/test_netns_cluster.py",  # 182 s, 82 CPU-s
    "tests/e2e/test_dag_runs.py",  # 168 s, 100 CPU-s
    "tests/integration/test_security_broker.py",  # 148 s, 71 CPU-s
    "tests/e2e/test_security_standalone.py",  # 89 s, 70 CPU-s
    "tests/e2e/test_security_dag.py",  # 77 s, 56 CPU-s
    "tests/integration/test_native_broker.py",  # 47 s, 14 CPU-s
    "tests/integration/test_security_visibility.py",  # 36 s, 21 CPU-s (2026-11-29, four workers)
    "tests/integration/test_reach_broker.py",  # 15 s, 8 CPU-s (2026-11-29, four workers)
    "tests/integration/test_spark_export.py",  # 81 s, 41 CPU-s
    "tests/integration/test_spark_cluster.py",  # 77 s, 58 CPU-s
    "tests/e2e/test_airflow_standalone_smoke.py",  # 68 s, 46 CPU-s
    "tests/integration/test_registry_formats.py",  # 54 s, 30 CPU-s
    "tests/e2e/test_lineage_dag.py",  # 50 s, 42 CPU-s
    "tests/integration/test_failure_lines.py",  # 38 s, 16 CPU-s
    "tests/e2e/test_failure_lines_dag.py",  # 37 s, 29 CPU-s
    "tests/integration/test_source_offsets_broker.py",  # 35 s, 20 CPU-s
    "tests/integration/test_spark_connect.py",  # 32 s, 22 CPU-s
    "tests/integration/test_cli.py",  # 29 s, 11 CPU-s
    "tests/integration/test_partitioning.py",  # 27 s, 21 CPU-s
    "tests/unit/test_reachability.py",  # 23 s, 10 CPU-s
    "tests/packaging/test_install_beside_others.py",  # 23 s, 15 CPU-s
    "tests/e2e/test_provider_registration.py",  # 22 s, 16 CPU-s; the rest take seconds
)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item), len(rank)))  # stable: a file stays whole


def pytest_collection_finish(session: pytest.Session) -> None:
    # The final order (after --ff/--nf and deselection reorder or drop items), which xdist hands out.
    for item in session.items:
        place = _file_rank.setdefault(_file_of(item), len(_file_rank))
        for name in STOPPED_WHEN_DONE:
            if name in getattr(item, "fixturenames", ()):
                _last_user[name] = place


@pytest.hookimpl(tryfirst=True)  # before the item's fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    cpu_accounting.begin(item)
    place = _file_rank.get(_file_of(item))
    if place is None:
        return
    for name, env in list(_running.items()):
        if _last_user.get(name, len(_file_rank)) < place:
            del _running[name]
            _stopped_early.add(name)
            env.close()  # its clients first: a kafka-python client of a stopped broker logs warnings
            kafka_local().stop_cluster(env.directory)
    needed = sorted(_stopped_early & set(getattr(item, "fixturenames", ())))
    if needed:  # the run's order broke the rule above: say so, rather than test against a stopped broker
        pytest.fail(f"{needed} were stopped as no longer used, but {item.nodeid} uses them: see STOPPED_WHEN_DONE")


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)
    cpu_accounting.add_wall(report)
    cpu_accounting.tally(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    cpu_accounting.summary(terminalreporter)


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        cpu_accounting.leave_own_group()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test is a test that did not run: fail instead of passing quietly.
    if os.environ.get("CI") and _skipped:
        print(f"\nCI: {len(_skipped)} test(s) skipped, which CI does not accept: {_skipped}")
        session.exitstatus = 1
