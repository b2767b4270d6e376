"""The built wheel installs beside other Kafka users: pip's resolver, in a fresh venv, against PyPI.

Resolved with ``pip install --dry-run --report`` (metadata only, nothing installed): what is proven
is that the declared ranges admit a confluent-kafka one minor release older than the locked one
next to the official apache-kafka provider and Airflow 3, and refuse Airflow 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 300


def locked(name: str) -> Version:
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return Version(line.split("==", 1)[1].split(";")[0].strip())
    raise AssertionError(f"{name} is not pinned in requirements.lock")


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the sources, so the build leaves nothing in the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "airflow_provider_kafka2pc",
        src / "airflow_provider_kafka2pc",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    built = pip("wheel", "--no-deps", "--wheel-dir", str(work / "dist"), str(src))
    assert built.returncode == 0, built.stdout + built.stderr
    [whl] = (work / "dist").glob("airflow_provider_kafka2pc-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "airflow_provider_kafka2pc/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    return whl


def resolve(tmp_path: Path, *requirements: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Version]]:
    """Resolve in a fresh, empty venv (the runner's pip drives it with ``--python``: no bundled-pip age
    to depend on); returns pip's answer and, when it resolved, every distribution it would install."""
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    report = tmp_path / "report.json"
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    done = pip("--python", str(python), "install", "--dry-run", "--report", str(report), *requirements)
    if done.returncode != 0:
        return done, {}
    install: list[dict[str, Any]] = json.loads(report.read_text())["install"]
    return done, {i["metadata"]["name"].lower(): Version(i["metadata"]["version"]) for i in install}


def test_installs_next_to_an_older_confluent_kafka_and_the_apache_kafka_provider(wheel: Path, tmp_path: Path) -> None:
    pinned = locked("confluent-kafka")
    older = f"{pinned.major}.{pinned.minor - 1}"
    done, versions = resolve(
        tmp_path,
        f"airflow-provider-kafka2pc[airflow] @ {wheel.as_uri()}",
        f"confluent-kafka=={older}.*",
        "apache-airflow-providers-apache-kafka",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert versions["airflow-provider-kafka2pc"] == Version(declared)
    assert (versions["confluent-kafka"].major, versions["confluent-kafka"].minor) == (pinned.major, pinned.minor - 1)
    assert "apache-airflow-providers-apache-kafka" in versions
    assert versions["apache-airflow"].major == 3
    assert "kafka-python" in versions


def test_refuses_airflow_2(wheel: Path, tmp_path: Path) -> None:
    # The provider does not import under Airflow 2: pip must say so, not install it.
    done, _ = resolve(tmp_path, f"airflow-provider-kafka2pc[airflow] @ {wheel.as_uri()}", "apache-airflow<3")
    assert done.returncode != 0
    assert "ResolutionImpossible" in done.stderr, done.stderr
    assert "apache-airflow" in done.stderr
