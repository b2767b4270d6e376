"""The CLI finds a connection stored in Airflow's metadata database, as one made in the UI is.

The e2e session's Airflow home (SQLite, migrated once): the connection is added with
``airflow connections add``, then looked up by the CLI in another process with AIRFLOW_HOME set.
No Kafka: the lookup is what is tested.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.airflow_dagtest import DagTester

CONN_ID = "kafka2pc_made_in_the_ui"


def test_the_cli_finds_a_connection_in_the_metadata_database(dag_tester: DagTester) -> None:
    env = dag_tester.env({})
    env.pop(f"AIRFLOW_CONN_{CONN_ID.upper()}", None)
    airflow = Path(sys.executable).parent / "airflow"
    extra = json.dumps({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "decision_topic": "td"})
    add = [str(airflow), "connections", "add", CONN_ID, "--conn-type", "kafka2pc", "--conn-host", "b1:9093"]
    add += ["--conn-login", "exporter", "--conn-password", "pw-in-the-database", "--conn-extra", extra]
    done = subprocess.run(add, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    script = textwrap.dedent(
        f"""
        import json
        from airflow_provider_kafka2pc.cli import client_settings
        print(json.dumps(client_settings.airflow_connection({CONN_ID!r})))
        """
    )
    found = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    config, topic, connect_timeout_s = json.loads(found.stdout.strip().splitlines()[-1])
    assert config == {
        "bootstrap.servers": "b1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "exporter",
        "sasl.password": "pw-in-the-database",
    }
    assert (topic, connect_timeout_s) == ("td", 10)

    # Not there: exit 2, naming where it looked, the database included; no traceback.
    cli = [sys.executable, "-m", "airflow_provider_kafka2pc.cli", "list", "--prefix", "p", "--conn-id", "nowhere"]
    missing = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2, missing.stderr
    assert (
        "kafka2pc: error: no Airflow connection 'nowhere': looked where `airflow connections get nowhere` looks: "
        f"the environment variable AIRFLOW_CONN_NOWHERE, the metadata database of AIRFLOW_HOME={dag_tester.home}"
    ) in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
