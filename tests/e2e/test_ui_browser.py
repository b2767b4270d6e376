"""The Airflow UI in a real browser (Debian's headless Chromium through Selenium) on a standalone
Airflow 3 (PostgreSQL, SimpleAuthManager with an admin and a viewer) with the test brokers.

- The connection form: a kafka2pc connection made in the form, Test pressed on its row, succeeds
  against the test broker; a wrong password on the SASL_SSL broker shows the hook's own SASL message;
  the saved extra holds no null.
- The Test button names the cause of each first-hour mistake made in the form, before the connect
  timeout: a closed port (connection refused), a host name that does not resolve, a CA that did not
  sign the SASL_SSL broker's certificate (the TLS handshake), a wrong password (SASL); the CLI, given
  the refused connection, prints the very text the browser showed.
- The CLI uses a connection made in the form: ``kafka2pc list --conn-id`` run as a user would on the
  Airflow's machine (its AIRFLOW_HOME and settings, no AIRFLOW_CONN_* variable) lists a transaction
  left open on that connection's broker.
- The example DAG (dags/kafka2pc_example.py, unchanged) triggered with the Trigger button on a broker
  that has never held its topic: its first task makes the topic, the run succeeds, a read_committed
  consumer sees every record exactly once and nothing of its exporter is left open; no WARNING or
  ERROR in its task logs nor in what the api-server logged for its tasks (the asset manager's).
- A failed commit and its clear: Kafka (a broker of this module's own) stops after the prepare; the
  commit task's log, read on its page, ends with the kafka2pc line that says no decision was written,
  how many transactions wait until when, and to clear the task once Kafka is back; Kafka comes back,
  the task is cleared with the page's Clear button, the run succeeds and the topic holds the run
  exactly once. The task's "Kafka exporters" extra link opens the exporter's page.
- The exporters page (the provider's plugin): an open transaction with the decision that rules it;
  a loss (a COMMIT decided, one transaction then aborted by the broker, the other committed) with
  its visible/lost counts before any recovery ran; a viewer sees it and cannot acknowledge (no
  button, and the POST is refused); anonymous requests are refused; the admin acknowledges it with
  the run id retyped and the page shows ACKNOWLEDGED.
- A repair from the exporters page: a run of the repair DAG whose commit died after committing half
  of its transactions, the rest aborted by the broker at their timeout, recorded LOST. A viewer sees
  no Repair button and its POST is refused, nothing cleared; the admin retypes the run id and presses
  Repair: Airflow clears the run's export task and what follows it, the export repairs the run, the
  topic holds every record of the run once and the page shows it REPAIRED.

Screenshots of the key pages go to build/ui-screenshots/ (a failing test's as <test>-failed.png).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest

from airflow_provider_kafka2pc.txn.kafka.reachability import DEFAULT_CONNECT_TIMEOUT_S, REFUSED
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.conftest import SECURE_EXPORTER, SECURE_EXPORTER_PASSWORD, _start
from tests.e2e.test_dag_runs import exactly_once, visible_keys
from tests.helpers.airflow_standalone import StandaloneAirflow
from tests.helpers.kafka import REPO, KafkaEnv, kafka_local, kill_node

pytestmark = [pytest.mark.airflow_standalone, pytest.mark.kafka]

SHOTS = REPO / "build" / "ui-screenshots"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
NO_ANIMATIONS = """document.addEventListener("DOMContentLoaded", () => {
  const style = document.createElement("style");
  style.textContent = "*, *::before, *::after { animation: none !important; transition: none !important; }";
  document.head.appendChild(style);
});"""
WAIT_S = 30.0


DAGS = Path(__file__).parent / "dags"
DAG_ID = "e2e_kafka2pc"  # its tasks on the connection "stoppable", a broker this module stops
REPAIR_DAG_ID = "e2e_kafka2pc_repair"  # the same tasks, 30 s transactions, prefix {prefix}_rep
STOPPABLE = "kafka2pc_stoppable"
# The example DAG, as a user finds it: on kafka2pc_default, which here names the module's own broker
# (no other module's run has made the example's topic there); the exporters page uses the shared one.
EXAMPLE_DAG = REPO / "dags" / "kafka2pc_example.py"
EXAMPLE_DAG_ID, EXAMPLE_TOPIC, EXAMPLE_PREFIX = "kafka2pc_example", "kafka2pc_example_orders", "kafka2pc_example.orders"
EXAMPLE_ROWS = 100_000  # its "rows" param's default: what the Trigger button's form offers
SHARED = "kafka2pc_shared"  # the session's broker (the kafka fixture)


@dataclass
class UI:
    af: StandaloneAirflow
    passwords: dict[str, str]
    stoppable: KafkaEnv
    prefix: str
    topic: str

    def token(self, user: str) -> str:
        r = httpx.post(f"{self.af.base_url}/auth/token", json={"username": user, "password": self.passwords[user]})
        r.raise_for_status()
        return str(r.json()["access_token"])


@pytest.fixture(scope="module")
def stoppable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaEnv]:
    """A broker of this module's own: one test stops it and starts it again."""
    yield from _start(tmp_path_factory, "kafka1ui", 1)


@pytest.fixture(scope="module")
def ui(kafka: KafkaEnv, stoppable: KafkaEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    assert CHROMIUM and CHROMEDRIVER, "Debian's chromium and chromium-driver are needed (scripts/setup installs them)"
    base = tmp_path_factory.mktemp("airflow_ui")
    home = base / "home"
    # This Airflow's DAGs folder: the module's test DAG and the example DAG, linked, not copied.
    dags = base / "dags"
    dags.mkdir()
    for dag_file in (DAGS / f"{DAG_ID}.py", EXAMPLE_DAG):
        (dags / dag_file.name).symlink_to(dag_file)
    prefix, topic = f"ui_{uuid.uuid4().hex[:8]}", stoppable.topic(partitions=4)
    env = {
        "AIRFLOW_CONN_KAFKA2PC_DEFAULT": json.dumps({"conn_type": "kafka2pc", "host": stoppable.bootstrap}),
        f"AIRFLOW_CONN_{SHARED.upper()}": json.dumps({"conn_type": "kafka2pc", "host": kafka.bootstrap}),
        f"AIRFLOW_CONN_{STOPPABLE.upper()}": json.dumps({"conn_type": "kafka2pc", "host": stoppable.bootstrap}),
        "KAFKA2PC_EXAMPLE_BOOTSTRAP": stoppable.bootstrap,  # the example declares its topic's asset
        "E2E_CONN_ID": STOPPABLE,
        "E2E_PREFIX": prefix,
        "E2E_TOPIC": topic,
        "E2E_COMMIT_RETRIES": "0",  # the second try comes from the user's clear
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    config = {
        "CORE__TEST_CONNECTION": "Enabled",
        "CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:ADMIN,viewer:VIEWER",
    }
    af = StandaloneAirflow(home, dags, env, config=config, dag_ids=[DAG_ID, EXAMPLE_DAG_ID])
    with af:
        af.unpause(DAG_ID)
        # The SimpleAuthManager wrote the viewer's generated password next to the admin's.
        passwords = json.loads((af.home / "simple_auth_manager_passwords.json").read_text())
        yield UI(af, passwords, stoppable, prefix, topic)


@pytest.fixture
def browser(ui: UI, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Any]]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    drivers: list[Any] = []
    failed_before = request.session.testsfailed

    def open_as(user: str) -> Any:
        options = Options()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
            options.add_argument(arg)
        # Nothing a test looks at: no GPU process, extensions, background fetches (component and
        # safe-browsing updates, sync) or first-run work; each costs CPU at every browser's start.
        for arg in ("--disable-gpu", "--disable-extensions", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run", "--disable-sync"):  # fmt: skip
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        driver.implicitly_wait(0)
        drivers.append(driver)
        # No CSS animations: the UI's indeterminate progress bar, once shown, animates for good, and
        # a headless Chromium drew it at 6.7 CPU-s in 40 s on the DAGs page (0.4 without): the
        # suite is bound by two cores. The tests read text and states, never motion.
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NO_ANIMATIONS})
        # Logged in as the UI is after its login page: the auth manager's JWT in the _token cookie.
        driver.get(f"{ui.af.base_url}/api/v2/monitor/health")
        driver.add_cookie({"name": "_token", "value": ui.token(user), "path": "/"})
        return driver

    yield open_as
    failed = request.session.testsfailed > failed_before  # this test's call failed
    for i, driver in enumerate(drivers):
        if failed:
            shot(driver, f"{request.node.name}-failed{'' if i == 0 else i}")
        driver.quit()


def shot(driver: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S, poll: float = 0.25) -> Any:
    """``check()`` every ``poll`` seconds until it returns something true (returned) or ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = check()
            if last:
                return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def body_text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


# -- the connection form ----------------------------------------------------------------------------


def add_connection(driver: Any, base_url: str, conn_id: str, fields: dict[str, str], extra: dict[str, Any]) -> None:
    """Airflow 3's Add Connection form, filled as a person would: type, standard fields, choices."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{base_url}/connections")
    wait_for("Add Connection", lambda: [b for b in driver.find_elements(By.TAG_NAME, "button")
                                        if b.text == "Add Connection"])[0].click()  # fmt: skip
    wait_for("the form", lambda: driver.find_element(By.NAME, "connection_id")).send_keys(conn_id)
    # The connection type's search box, the first text input after the id.
    kind = driver.find_element(By.XPATH, "//input[@name='connection_id']/following::input[@type='text'][1]")
    kind.send_keys("kafka2pc")
    time.sleep(0.5)
    kind.send_keys(Keys.ENTER)
    wait_for("the kafka2pc fields", lambda: driver.find_element(By.NAME, "host"))
    for name, value in fields.items():
        driver.find_element(By.NAME, name).send_keys(value)
    next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.startswith("Extra Fields")).click()
    for name in ("security_protocol", "sasl_mechanism"):
        if name in extra:
            choose(driver, name, extra[name])
    if "config" in extra:
        # The librdkafka settings' JSON editor: the first code editor of the Extra Fields.
        frame = wait_for("the settings editor", lambda: driver.find_elements(By.CSS_SELECTOR, ".monaco-editor"))[0]
        paste_into_editor(driver, frame, json.dumps(extra["config"]))
        landed = lambda: extra_fields_json(driver).get("config") == extra["config"]  # noqa: E731
        wait_for("the settings in the Extra Fields JSON", landed)
    save = wait_for("Save", lambda: [b for b in driver.find_elements(By.TAG_NAME, "button")
                                     if b.text == "Save" and b.is_enabled()])[0]  # fmt: skip
    shot(driver, f"connection-form-{conn_id}")
    save.click()
    wait_for(f"row {conn_id}", lambda: conn_id in body_text(driver) and not driver.find_elements(By.NAME, "host"))


def paste_into_editor(driver: Any, frame: Any, text: str) -> None:
    """Replace the text of the form's code editor (Monaco) by ``text`` as a person does: copy, click, Ctrl+A, Ctrl+V.

    Not send_keys: Airflow 3.3's Monaco types through the browser's EditContext on its
    div.native-edit-context (its <textarea> is a read-only IME helper that drops keys), and the form's
    object field re-renders the editor with the pretty-printed JSON whenever the text parses, so keys
    typed one by one (with Monaco's auto-closed quotes: '{"k": ""' already parses) are rearranged
    mid-way. A paste is one edit. The clipboard is filled through the page's Clipboard API (the
    person's copy from elsewhere); the editor itself gets real clicks and keys.
    """
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    origin = re.match(r"https?://[^/]+", driver.current_url)
    assert origin, driver.current_url
    permissions = ["clipboardReadWrite", "clipboardSanitizedWrite"]
    driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": origin.group(0), "permissions": permissions})
    copied = driver.execute_async_script(
        "const done = arguments[1];"
        "navigator.clipboard.writeText(arguments[0]).then(() => done('copied'), (e) => done(String(e)))",
        text,
    )
    assert copied == "copied", copied
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", frame)
    frame.find_element(By.CSS_SELECTOR, ".view-lines").click()
    wait_for("the editor's focus", lambda: frame.find_element(By.CSS_SELECTOR, ".native-edit-context")
             == driver.switch_to.active_element)  # fmt: skip
    ActionChains(driver).key_down(Keys.CONTROL).send_keys("a").send_keys("v").key_up(Keys.CONTROL).perform()


def extra_fields_json(driver: Any) -> dict[str, Any]:
    """The form's "Extra Fields JSON" section (opened if closed): the extra the form is about to save."""
    from selenium.webdriver.common.by import By

    section = next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.startswith("Extra Fields JSON"))
    if section.get_attribute("aria-expanded") != "true":
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", section)
        section.click()
    content = driver.find_element(By.ID, str(section.get_attribute("aria-controls")))
    lines = content.find_element(By.CSS_SELECTOR, ".monaco-editor .view-lines")
    # The rendered lines, clipped ones too (.text holds only what is in view); Monaco draws spaces as NBSP.
    return dict(json.loads(str(lines.get_attribute("textContent")).replace("\u00a0", " ")))


def choose(driver: Any, field: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    hidden = driver.find_element(By.NAME, f"element_{field}")
    box = hidden.find_element(By.XPATH, "./preceding::input[@type='text'][1]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.send_keys(value)
    time.sleep(0.3)
    box.send_keys(Keys.ENTER)
    wait_for(f"{field} = {value}", lambda: hidden.get_attribute("value") == value)


def press_test(driver: Any, conn_id: str, answer: str, pressed: list[float] | None = None) -> str:
    """Press Test on the connection's row; the page's text once the toast shows its title and ``answer``
    (its description can render a moment after the title). ``pressed`` gets the moment of the click."""
    from selenium.webdriver.common.by import By

    rows = lambda: [r for r in driver.find_elements(By.TAG_NAME, "tr") if conn_id in r.text]  # noqa: E731
    row = wait_for(f"row {conn_id}", rows)[0]
    buttons = row.find_elements(By.TAG_NAME, "button")
    test = [b for b in buttons if "test" in (b.get_attribute("aria-label") or b.get_attribute("title") or "").lower()]
    assert test, [(b.get_attribute("aria-label"), b.get_attribute("title"), b.text) for b in buttons]
    if pressed is not None:
        pressed.append(time.monotonic())
    test[0].click()
    seen = {"text": ""}

    def answered() -> bool:
        seen["text"] = body_text(driver)
        return bool(re.search(r"Test Connection (Successful|Failed)", seen["text"])) and answer in seen["text"]

    with contextlib.suppress(AssertionError):  # the asserts on the text say what was shown instead
        wait_for(f"the test's answer {answer!r}", answered)
    return seen["text"]


def press_test_timed(driver: Any, base_url: str, conn_id: str, answer: str) -> tuple[str, float]:
    """``press_test`` on a freshly loaded connections page (no earlier answer left on it), and the
    seconds from pressing Test to the answer: the hook's diagnosis and its round trip, not the page
    loading its list of connections (under CI's load, that alone took seconds)."""
    driver.get(f"{base_url}/connections")
    pressed: list[float] = []
    text = press_test(driver, conn_id, answer, pressed)
    return text, time.monotonic() - pressed[0]


def stored(ui: UI, conn_id: str) -> dict[str, Any]:
    return dict(ui.af.request("GET", f"/api/v2/connections/{conn_id}").json())


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka2pc_cli(ui: UI, *args: str) -> subprocess.CompletedProcess[str]:
    """``kafka2pc`` as a user runs it on the Airflow's machine: that Airflow's AIRFLOW_HOME and
    settings (its metadata database's), no AIRFLOW_CONN_* variable."""
    env = {k: v for k, v in ui.af.env.items() if not k.startswith("AIRFLOW_CONN_")}
    command = [sys.executable, "-m", "airflow_provider_kafka2pc.cli", *args]
    return subprocess.run(command, env=env, cwd=ui.af.home, capture_output=True, text=True, timeout=120)


def test_connection_made_in_the_form_tests_green_and_a_wrong_password_names_sasl(
    ui: UI, kafka: KafkaEnv, kafka_secure: KafkaEnv, browser: Callable[[str], Any]
) -> None:
    driver = browser("admin")
    base = ui.af.base_url
    host, port = kafka.bootstrap.rsplit(":", 1)
    add_connection(driver, base, "ui_plain", {"host": host, "port": port}, {"security_protocol": "PLAINTEXT"})
    conn = stored(ui, "ui_plain")
    extra = json.loads(conn["extra"])
    assert None not in extra.values(), extra  # no null saved into the extra
    assert (conn["port"], extra["security_protocol"]) == (int(port), "PLAINTEXT"), conn
    answer = press_test(driver, "ui_plain", "connected to 1 broker(s)")
    shot(driver, "connection-test-ok")
    assert "connected to 1 broker(s)" in answer, answer
    assert "Bad Request" not in answer

    secure_host, secure_port = kafka_secure.bootstrap.rsplit(":", 1)
    add_connection(
        driver,
        base,
        "ui_secure",
        {"host": secure_host, "port": secure_port, "login": SECURE_EXPORTER, "password": "not-the-password"},
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "config": {"ssl.ca.location": kafka_secure.security["ssl.ca.location"]},
        },
    )
    extra = json.loads(stored(ui, "ui_secure")["extra"])
    assert extra["config"] == {"ssl.ca.location": kafka_secure.security["ssl.ca.location"]}, extra
    cause = f"authentication failed: SASL SCRAM-SHA-512 as User:{SECURE_EXPORTER}"
    answer, took = press_test_timed(driver, base, "ui_secure", cause)
    shot(driver, "connection-test-wrong-password")
    assert "Test Connection Failed" in answer, answer
    assert cause in answer, answer
    assert took < DEFAULT_CONNECT_TIMEOUT_S, (took, answer)  # refused at once, not after the connect timeout
    assert "not-the-password" not in answer
    assert "not-the-password" not in driver.page_source  # nor anywhere in the page, hidden text included

    # The CLI, on the Airflow's machine, finds ui_plain where the form put it (the metadata database)
    # and lists from its broker: the transaction left open there under a prefix of this test's.
    prefix = f"uicli{uuid.uuid4().hex[:6]}"
    left_open = prepare(kafka, kafka.topic(partitions=1), prefix, 0, 3, "uicli")
    wire = kafka.new_wire()
    try:
        listed = kafka2pc_cli(ui, "list", "--conn-id", "ui_plain", "--prefix", prefix, "--json")
        assert listed.returncode == 1, listed.stderr  # 1: transactions open
        report = json.loads(listed.stdout)
        assert [t["transactional_id"] for t in report["transactions"]] == [naming.transactional_id(prefix, 0)], report
        assert report["prefix"] == prefix and report["losses"] == [], report
    finally:
        TransactionResolver(wire).resolve([ref_of(left_open)], Intent.ABORT)
        wire.close()


def test_the_test_button_names_the_cause_of_a_refused_port_an_unknown_host_and_a_wrong_ca(
    ui: UI, kafka: KafkaEnv, kafka_secure: KafkaEnv, browser: Callable[[str], Any]
) -> None:
    """Each mistake made in the form, Test pressed on its row: the cause the hook's diagnosis words
    (airflow_provider_kafka2pc/txn/kafka/reachability.py), before the connect timeout."""
    import certifi

    driver = browser("admin")
    base = ui.af.base_url
    port = closed_port()
    unknown = f"kafka2pc-{uuid.uuid4().hex[:6]}.invalid"  # .invalid never resolves (RFC 2606)
    kafka_port = kafka.bootstrap.rsplit(":", 1)[1]
    secure_host, secure_port = kafka_secure.bootstrap.rsplit(":", 1)
    wrong_ca = certifi.where()  # a real CA bundle, not the one that signed the broker's certificate
    plaintext = {"security_protocol": "PLAINTEXT"}
    secure = {"host": secure_host, "port": secure_port, "login": SECURE_EXPORTER, "password": SECURE_EXPORTER_PASSWORD}
    sasl_ssl = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"}
    who = f"SASL SCRAM-SHA-512 as User:{SECURE_EXPORTER}"
    unreachable = "cannot reach Kafka at "
    mistakes: list[tuple[str, dict[str, str], dict[str, Any], str]] = [
        (
            "ui_refused",
            {"host": "127.0.0.1", "port": str(port)},
            plaintext,
            f"{unreachable}127.0.0.1:{port}: {REFUSED}",
        ),
        (
            "ui_unknown_host",
            {"host": unknown, "port": kafka_port},
            plaintext,
            f"{unreachable}{unknown}:{kafka_port}: the host name {unknown} could not be resolved (",
        ),
        (
            "ui_wrong_ca",
            secure,
            {**sasl_ssl, "config": {"ssl.ca.location": wrong_ca}},
            f"SSL handshake failed with Kafka at {kafka_secure.bootstrap} ({who}",
        ),
    ]
    for conn_id, fields, extra, _ in mistakes:
        add_connection(driver, base, conn_id, fields, extra)
    shown: dict[str, str] = {}
    for conn_id, _, _, cause in mistakes:
        answer, took = press_test_timed(driver, base, conn_id, cause)
        shot(driver, f"connection-test-{conn_id.removeprefix('ui_').replace('_', '-')}")
        assert "Test Connection Failed" in answer, (conn_id, answer)
        assert cause in answer, (conn_id, answer)
        # Told at once (refused, not resolved, a certificate refused), not after the connect timeout.
        assert took < DEFAULT_CONNECT_TIMEOUT_S, (conn_id, took, answer)
        shown[conn_id] = next(line for line in answer.splitlines() if cause in line)
        print(f"{conn_id}: {took:.1f} s: {shown[conn_id]}")
    assert "certificate verify failed" in shown["ui_wrong_ca"], shown["ui_wrong_ca"]
    assert f"ssl.ca.location is {wrong_ca}" in shown["ui_wrong_ca"], shown["ui_wrong_ca"]
    assert SECURE_EXPORTER_PASSWORD not in driver.page_source

    # The CLI says it in the browser's very words, with its prefix.
    refused = kafka2pc_cli(ui, "list", "--conn-id", "ui_refused", "--prefix", "p")
    assert refused.returncode == 3, refused.stderr  # 3: Kafka failing
    assert refused.stderr == f"kafka2pc: error: {shown['ui_refused']}\n", (refused.stderr, shown["ui_refused"])


# -- the example DAG, triggered in the UI -----------------------------------------------------------


def test_the_example_dag_triggered_in_the_ui_makes_its_topic_and_exports_exactly_once(
    ui: UI, browser: Callable[[str], Any]
) -> None:
    from selenium.webdriver.common.by import By

    af, broker = ui.af, ui.stoppable  # kafka2pc_default: the module's own broker
    assert EXAMPLE_TOPIC not in broker.wire.topics()  # a fresh broker, as far as the example goes
    assert af.dag_runs(EXAMPLE_DAG_ID) == []
    driver = browser("admin")
    driver.get(f"{af.base_url}/dags/{EXAMPLE_DAG_ID}")

    def trigger_buttons(within: Any) -> list[Any]:
        return [
            b for b in within.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Trigger" and b.is_enabled()
        ]

    wait_for("the Trigger button", lambda: trigger_buttons(driver))[0].click()
    dialog = wait_for("the trigger dialog", lambda: [d for d in driver.find_elements(By.CSS_SELECTOR, "[role=dialog]")
                                                     if "Trigger Dag" in d.text])[0]  # fmt: skip
    confirm = wait_for("the dialog's Trigger button", lambda: trigger_buttons(dialog))[0]
    shot(driver, "example-dag-trigger-dialog")
    confirm.click()
    runs = wait_for("the triggered run", lambda: af.dag_runs(EXAMPLE_DAG_ID))
    assert len(runs) == 1 and runs[0]["triggered_by"] == "ui", runs  # the click's run, none of the API's
    run_id = str(runs[0]["dag_run_id"])
    # The run takes minutes, and the DAG's page, left open, would poll the API and redraw meanwhile
    # (the CPU of two processes); the run's page is opened anew below.
    driver.get("about:blank")
    state = af.wait_run(EXAMPLE_DAG_ID, run_id, timeout=420)
    assert state == "success", af.task_states(EXAMPLE_DAG_ID, run_id)
    created = af.task_log(EXAMPLE_DAG_ID, run_id, "create_topic", 1)
    assert f"kafka2pc: topic {EXAMPLE_TOPIC} created: 8 partition(s)" in created, created[-2000:]
    # A successful run: no WARNING, no ERROR in its task logs (as the UI shows them), nor in what the
    # api-server logged for its tasks (where Airflow's asset manager warns about an undeclared asset:
    # the commit's is declared, KAFKA2PC_EXAMPLE_BOOTSTRAP set as docker-compose.yml and scripts/demo set it).
    tis = af.task_instances(EXAMPLE_DAG_ID, run_id)
    ran = [str(t["task_id"]) for t in tis if t["state"] == "success"]
    assert len(ran) == 4, ran  # create_topic, recover, prepare, commit (the abort skipped)
    for task_id in ran:
        log = af.task_log(EXAMPLE_DAG_ID, run_id, task_id, 1)
        loud = re.findall(r"^\S* (?:warning|error|critical) .*$", log, re.MULTILINE | re.IGNORECASE)
        assert loud == [], (task_id, loud)
    ti_ids = tuple(f"ti_id={t['id']}" for t in tis)
    server = (af.log_dir / "api-server.log").read_text(errors="replace").splitlines()
    about_run = [line for line in server if any(ti_id in line for ti_id in ti_ids)]
    assert about_run, "the api-server logged nothing for the run's tasks: ti_id= is no longer in its lines"
    loud = [line for line in about_run if re.search(r"\[(?:warning|error|critical)\s*\]", line)]
    assert loud == [], loud
    driver.get(f"{af.base_url}/dags/{EXAMPLE_DAG_ID}/runs/{quote(run_id, safe='')}")
    wait_for("the run's page", lambda: "success" in body_text(driver).lower())
    shot(driver, "example-dag-run-succeeded")

    records = broker.read_committed(EXAMPLE_TOPIC, timeout_s=120)
    keys = Counter((r.key or b"").decode() for r in records)
    assert len(keys) == EXAMPLE_ROWS and set(keys.values()) == {1}, (len(keys), len(records))
    assert set(keys) == {str(i) for i in range(EXAMPLE_ROWS)}
    assert {json.loads(r.value or b"{}")["run"] for r in records} == {run_id.replace("'", "")}
    assert broker.open_transactions(EXAMPLE_PREFIX) == []


# -- a failed commit and its clear ------------------------------------------------------------------


def task_page(ui: UI, run_id: str, task_id: str, tab: str = "") -> str:
    return f"{ui.af.base_url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{task_id}{tab}"


def kafka2pc_lines(text: str) -> list[str]:
    return re.findall(r"kafka2pc: [^\n]*", text)


def test_a_failed_commit_says_the_state_and_the_next_click_and_a_clear_in_the_ui_finishes_it(
    ui: UI, browser: Callable[[str], Any], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    af, stoppable = ui.af, ui.stoppable
    tag, rows, partitions = "uiclear", 2000, 4
    gate = tmp_path / "gate"  # the commit's first try waits for it: Kafka stops in between
    conf = {"tag": tag, "rows": rows, "partitions": partitions, "fault": "commit_waits", "gate": str(gate)}
    run_id = af.trigger(DAG_ID, conf=conf)
    prepare_state = wait_for("the prepare's end", lambda: af.task_states(DAG_ID, run_id).get("prepare")
                             in ("success", "failed", "upstream_failed") and af.task_states(DAG_ID, run_id)["prepare"],
                             timeout=300, poll=1.0)  # fmt: skip
    assert prepare_state == "success", af.task_log(DAG_ID, run_id, "prepare", 1)[-3000:]
    assert len(stoppable.open_transactions(ui.prefix, settle_s=0)) == partitions
    # While the run awaits its commit, the exporter's page shows its transactions as its live run's,
    # not as what a prefix-wide resolve would abort.
    page_driver = browser("admin")
    page_driver.get(f"{af.base_url}/kafka2pc/exporters?conn_id={STOPPABLE}&prefix={ui.prefix}")
    open_table = f"[data-prefix='{ui.prefix}'] [id$='-open'] tbody tr"
    cells = wait_for(
        "the open transactions", lambda: [r.text for r in page_driver.find_elements(By.CSS_SELECTOR, open_table)]
    )
    assert len(cells) == partitions, cells
    assert all(f"LIVE DAG run {DAG_ID}/{run_id}: nothing: its DAG run is live" in c for c in cells), cells
    assert "A transaction without a decision belongs to" not in body_text(page_driver)
    shot(page_driver, "live-run-exporters-page")
    kill_node(stoppable, 1)  # Kafka stops after the prepare
    try:
        gate.touch()
        assert af.wait_run(DAG_ID, run_id, timeout=300) == "failed"
    finally:
        kafka_local().start_node(stoppable.directory, 1)  # "after Kafka is back"
    assert af.task_states(DAG_ID, run_id) == {
        "recover": "success",
        "prepare": "success",
        "commit": "failed",
        "abort": "skipped",  # the prepare succeeded: the abort has nothing to do
    }

    # The user opens the failed task: its log's last kafka2pc line says the state and the next click.
    driver = browser("admin")
    driver.get(task_page(ui, run_id, "commit"))
    lines = wait_for("the kafka2pc line in the log", lambda: kafka2pc_lines(body_text(driver)))
    last = lines[-1]
    assert last.startswith(
        f"kafka2pc: run {DAG_ID}/{run_id}: no decision was written; {partitions} transaction(s) with {rows} "
        "records are prepared, not visible, until at least "
    ), last
    assert re.search(r"until at least \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\. ", last), last
    assert "Next: clear this commit task after Kafka is back and before then" in last, last
    driver.find_element(By.CSS_SELECTOR, "button[aria-label='Log Settings']").click()
    wait_for("the Wrap choice", lambda: [m for m in driver.find_elements(By.CSS_SELECTOR, "[role=menuitem]")
                                         if m.text.startswith("Wrap")])[0].click()  # fmt: skip
    shot(driver, "failed-commit-log")

    # The next click: Clear on the task's page, confirmed.
    driver.find_element(By.CSS_SELECTOR, "button[aria-label='Press shift+c to clear']").click()
    dialog = wait_for("the clear dialog", lambda: [d for d in driver.find_elements(By.CSS_SELECTOR, "[role=dialog]")
                                                   if "Clear Task Instance: commit" in d.text])[0]  # fmt: skip
    # The dialog counts the affected tasks with a dry-run request of its own: "0" until it answers.
    wait_for("the dialog's count of affected tasks", lambda: "Affected Tasks: 1" in dialog.text)
    shot(driver, "failed-commit-clear-dialog")
    next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text == "Confirm").click()
    wait_for("the cleared run to start again", lambda: af.run_state(DAG_ID, run_id) != "failed")
    driver.get("about:blank")  # not the task's page, polling, while the run ends: it is opened anew below
    assert af.wait_run(DAG_ID, run_id, timeout=300) == "success", af.task_states(DAG_ID, run_id)
    assert [(int(t["try_number"]), t["state"]) for t in af.task_tries(DAG_ID, run_id, "commit")] == [
        (1, "failed"),
        (2, "success"),
    ]
    exactly_once(visible_keys(stoppable, ui.topic), tag, rows)
    assert stoppable.open_transactions(ui.prefix) == []
    driver.get(task_page(ui, run_id, "commit"))
    # The commit's one summary line: every transaction committed by the second try, none lost.
    done = re.compile(
        rf"commit of run {re.escape(f'{DAG_ID}/{run_id}')} under COMMIT decision \w+: {partitions} transaction\(s\): "
        rf"{partitions} committed and 0 aborted by this call, 0 already ended, 0 lost"
    )
    wait_for("the second try's log", lambda: done.search(body_text(driver)))
    shot(driver, "failed-commit-cleared")

    # The task's extra link opens its exporter's page, which shows the run committed and nothing open.
    driver.get(task_page(ui, run_id, "commit", "/details"))
    link = wait_for("the extra link", lambda: driver.find_element(By.LINK_TEXT, "Kafka exporters"))
    href = str(link.get_attribute("href"))
    assert href.startswith(f"{ui.af.base_url}/plugin/kafka2pc-exporters/") and f"prefix={ui.prefix}" in href, href
    assert f"conn_id={STOPPABLE}" in href, href
    windows = set(driver.window_handles)
    link.click()
    opened = wait_for("the exporters page", lambda: set(driver.window_handles) - windows or driver.current_url == href)
    if isinstance(opened, set):
        driver.switch_to.window(opened.pop())
    driver.switch_to.frame(wait_for("the page's frame", lambda: driver.find_element(By.CSS_SELECTOR, "iframe")))
    runs_table = f"[data-prefix='{ui.prefix}'] [id$='-runs']"
    runs = wait_for("the runs", lambda: driver.find_element(By.CSS_SELECTOR, runs_table))
    row = next(r for r in runs.find_elements(By.TAG_NAME, "tr") if run_id in r.text)
    assert f"COMMITTED {partitions} {rows:,}" in row.text, row.text
    assert "0 open transaction(s) · 0 loss(es) not acknowledged" in body_text(driver), body_text(driver)
    driver.switch_to.default_content()
    shot(driver, "failed-commit-exporters-page")


def test_a_lost_run_is_repaired_from_the_exporters_page_and_a_viewer_cannot(
    ui: UI, browser: Callable[[str], Any]
) -> None:
    from selenium.webdriver.common.by import By

    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover

    af, stoppable = ui.af, ui.stoppable
    prefix, tag, rows, partitions = f"{ui.prefix}_rep", f"rep{uuid.uuid4().hex[:4]}", 2000, 4
    af.unpause(REPAIR_DAG_ID)
    conf = {"tag": tag, "rows": rows, "partitions": partitions, "fault": "commit_half"}
    run_id = af.trigger(REPAIR_DAG_ID, conf=conf)
    assert af.wait_run(REPAIR_DAG_ID, run_id, timeout=300) == "failed", af.task_states(REPAIR_DAG_ID, run_id)
    # The commit died after committing 2 of 4; the broker aborts the other 2 at their 30 s timeout.
    wait_for("the broker's abort", lambda: not stoppable.open_transactions(prefix, settle_s=0), timeout=180, poll=1.0)
    half = [k for k in visible_keys(stoppable, ui.topic) if k.startswith(f"{tag}-")]
    assert 0 < len(half) < rows
    wire, decision_log = stoppable.new_wire(), DecisionLog(stoppable.config)
    try:  # the next recovery pass records the run LOST (what the recovery sensor does)
        with pytest.raises(TransactionLostError, match="2 of 4 transaction"):
            recover(wire, prefix, decision_log, run="ui-recovery")
    finally:
        decision_log.close()
        wire.close()
    run = f"{REPAIR_DAG_ID}/{run_id}"
    url = f"{af.base_url}/kafka2pc/exporters?conn_id={STOPPABLE}&prefix={prefix}"
    loss_box = f"[data-run='{run}']"

    # A viewer sees the loss and how it is repaired, but no button; its POST is refused, nothing cleared.
    viewer = browser("viewer")
    viewer.get(url)
    loss = wait_for("the loss (viewer)", lambda: viewer.find_element(By.CSS_SELECTOR, loss_box))
    assert f"needs permission to clear task instances of DAG {REPAIR_DAG_ID}" in loss.text, loss.text
    assert not viewer.find_elements(By.CSS_SELECTOR, "form.repair")
    form = {"conn_id": STOPPABLE, "prefix": prefix, "run": run, "confirm_run": run}
    r = httpx.post(f"{af.base_url}/kafka2pc/exporters/repair", data=form,
                   headers={"Authorization": f"Bearer {ui.token('viewer')}"})  # fmt: skip
    assert r.status_code == 403 and "needs permission to clear task instances" in r.text, r.text
    assert af.run_state(REPAIR_DAG_ID, run_id) == "failed"

    # The admin retypes the run id and presses Repair: Airflow clears the export task, which repairs.
    admin = browser("admin")
    admin.get(url)
    repair = wait_for("the repair form", lambda: admin.find_element(By.CSS_SELECTOR, f"{loss_box} form.repair"))
    repair.find_element(By.NAME, "confirm_run").send_keys(run)
    shot(admin, "exporters-repair-form")
    repair.find_element(By.TAG_NAME, "button").click()
    notice = wait_for("the notice", lambda: admin.find_element(By.ID, "notice"))
    assert f"Repair of run {run} started: Airflow cleared task(s) abort, commit, prepare of the run" in notice.text
    assert af.wait_run(REPAIR_DAG_ID, run_id, timeout=300) == "success", af.task_states(REPAIR_DAG_ID, run_id)
    exactly_once(visible_keys(stoppable, ui.topic), tag, rows)
    assert stoppable.open_transactions(prefix) == []
    repaired = af.task_log(REPAIR_DAG_ID, run_id, "prepare", 2)
    assert "is LOST: repairing it" in repaired and f"is REPAIRED: all {rows} records are visible once" in repaired
    admin.get(url)
    runs = wait_for("the runs", lambda: admin.find_element(By.CSS_SELECTOR, f"[data-prefix='{prefix}'] [id$='-runs']"))
    row = next(r for r in runs.find_elements(By.TAG_NAME, "tr") if run in r.text)
    assert "REPAIRED" in row.text and f"repaired by {REPAIR_DAG_ID}.prepare" in row.text, row.text
    assert not admin.find_elements(By.CSS_SELECTOR, loss_box)
    shot(admin, "exporters-repaired")


# -- the exporters page -----------------------------------------------------------------------------


def prepare(kafka: KafkaEnv, topic: str, prefix: str, slot: int, records: int, run: str) -> Committable:
    from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter

    writer = TransactionalWriter(kafka.config, naming.transactional_id(prefix, slot), 300_000).open()
    for i in range(records):
        writer.produce(topic, f"{run}/{slot}/{i}".encode(), f"{run}/{slot}/{i}".encode())
    committable = writer.prepare()
    assert committable is not None
    return committable


def page(ui: UI, prefix: str) -> str:
    return f"{ui.af.base_url}/kafka2pc/exporters?conn_id={SHARED}&prefix={prefix}"


def test_exporters_page_shows_open_transactions_a_loss_and_its_acknowledgement(
    ui: UI, kafka: KafkaEnv, browser: Callable[[str], Any]
) -> None:
    from selenium.webdriver.common.by import By

    from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
    from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import Decided, decide_commit
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover

    tag = uuid.uuid4().hex[:6]
    topic = kafka.topic(partitions=2)
    opened, lossy, run = f"uiopen{tag}", f"uiloss{tag}", f"run_{tag}"
    base = ui.af.base_url

    # Every endpoint asks the auth manager: nobody logged in gets nothing.
    endpoints = (("GET", "/kafka2pc/exporters"), ("GET", "/kafka2pc/api/exporters"),
                 ("POST", "/kafka2pc/exporters/acknowledge"), ("POST", "/kafka2pc/exporters/repair"))  # fmt: skip
    for method, path in endpoints:
        data = {"conn_id": SHARED} if method == "POST" else None
        r = httpx.request(method, f"{base}{path}", params={"prefix": lossy}, data=data)
        if (method, path) == ("GET", "/kafka2pc/exporters"):  # a browser: to Airflow's login, and back after it
            assert r.status_code == 303, (path, r.status_code, r.text)
            login = urlsplit(r.headers["location"])
            assert login.path == "/auth/login", r.headers["location"]
            assert parse_qs(login.query)["next"] == [f"{base}{path}?prefix={lossy}"], r.headers["location"]
            assert httpx.get(f"{base}{login.path}?{login.query}").status_code == 200  # the login page answers
        else:
            assert r.status_code in (401, 403), (method, path, r.status_code, r.text)
    plugins = ui.af.request("GET", "/api/v2/plugins").json()["plugins"]
    views = [v for p in plugins if p["name"] == "kafka2pc" for v in p["external_views"]]
    assert [(v["name"], v["url_route"]) for v in views] == [("Kafka exporters", "kafka2pc-exporters")], plugins

    # 1. An open transaction: prepared, no decision yet.
    open_one = prepare(kafka, topic, opened, 0, 10, run)
    wire = kafka.new_wire()
    decision_log = DecisionLog(kafka.config)
    try:
        admin = browser("admin")
        # Inside the Airflow UI, as the "Kafka exporters" extra link opens it.
        admin.get(f"{base}/plugin/kafka2pc-exporters/kafka2pc/exporters?conn_id={SHARED}&prefix={opened}")
        frame = wait_for("the page's frame", lambda: admin.find_element(By.CSS_SELECTOR, "iframe"))
        admin.switch_to.frame(frame)
        table = wait_for("the open transactions", lambda: admin.find_element(By.ID, f"exporter-{opened}-open"))
        assert f"{opened}-0" in table.text and "Ongoing" in table.text and "no decision" in table.text, table.text
        admin.switch_to.default_content()
        shot(admin, "exporters-open-transaction")

        # 2. A loss: the COMMIT decided, then the broker aborted one transaction (as its timeout
        # would) and the other committed; no recovery has run.
        lost_run = [prepare(kafka, topic, lossy, 0, 30, run), prepare(kafka, topic, lossy, 1, 20, run)]
        assert isinstance(decide_commit(lost_run, wire, decision_log, run, prefixes=[lossy]), Decided)
        TransactionResolver(wire).resolve([ref_of(lost_run[1])], Intent.ABORT)
        TransactionResolver(wire).resolve([ref_of(lost_run[0])], Intent.COMMIT)
        admin.get(page(ui, lossy))
        loss = wait_for("the loss", lambda: admin.find_element(By.CSS_SELECTOR, f"[data-run='{run}']"))
        assert "1 of 2 transactions visible (30 of 50 records), 1 lost (20 records)" in loss.text, loss.text
        assert "no recovery has recorded this run yet" in loss.text, loss.text
        assert f"{lossy}-1" in loss.text
        shot(admin, "exporters-loss-before-recovery")

        # The next recovery pass records the run LOST (what the recovery sensor does).
        with pytest.raises(TransactionLostError, match="1 of 2 transaction"):
            recover(wire, lossy, decision_log, run="ui-recovery")

        # 3. A viewer sees the loss and cannot acknowledge it: no button, and the POST is refused.
        viewer = browser("viewer")
        viewer.get(page(ui, lossy))
        loss = wait_for("the loss (viewer)", lambda: viewer.find_element(By.CSS_SELECTOR, f"[data-run='{run}']"))
        assert "needs permission to edit connection" in loss.text, loss.text
        assert not viewer.find_elements(By.NAME, "confirm_run")
        shot(viewer, "exporters-loss-viewer")
        form = {"conn_id": SHARED, "prefix": lossy, "run": run, "confirm_run": run}
        r = httpx.post(f"{base}/kafka2pc/exporters/acknowledge", data=form,
                       headers={"Authorization": f"Bearer {ui.token('viewer')}"})  # fmt: skip
        assert r.status_code == 403, r.text

        # 4. The admin acknowledges it, retyping the run id.
        admin.get(page(ui, lossy))
        confirm = wait_for("the acknowledge form", lambda: admin.find_element(By.NAME, "confirm_run"))
        confirm.send_keys(run)
        admin.find_element(By.NAME, "note").send_keys("checked by the browser test")
        shot(admin, "exporters-loss-acknowledge-form")
        admin.find_element(By.CSS_SELECTOR, "button.danger").click()
        notice = wait_for("the notice", lambda: admin.find_element(By.ID, "notice"))
        assert f"Run {run} acknowledged" in notice.text
        runs = admin.find_element(By.ID, f"exporter-{lossy}-runs")
        row = next(r for r in runs.find_elements(By.TAG_NAME, "tr") if run in r.text)
        assert "ACKNOWLEDGED" in row.text and "acknowledged in the Airflow UI by admin" in row.text, row.text
        assert not admin.find_elements(By.CSS_SELECTOR, f"[data-run='{run}']")  # no loss left to acknowledge
        shot(admin, "exporters-acknowledged")
    finally:
        TransactionResolver(wire).resolve([ref_of(open_one)], Intent.ABORT)
        decision_log.close()
        wire.close()
