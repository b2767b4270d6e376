"""scripts/kafka-local's nodes. A node that stops on SIGTERM leaves a class-data-sharing archive in
the jar cache, a node started after it maps it, and a test run's JDK_JAVA_OPTIONS (Spark's archive)
does not reach the node's JVM. A node's ports lie below the kernel's ephemeral range."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.kafka import kafka_local

pytestmark = pytest.mark.kafka


def _mapped(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".jsa" in line}


def test_a_node_maps_the_class_archive_a_cleanly_stopped_node_wrote(tmp_path: Path) -> None:
    kl = kafka_local()
    directory = tmp_path / "kafka"
    state = kl.start_cluster(directory, brokers=1)
    archive = kl._class_archive(state, "kafka.Kafka")
    try:
        node = state["nodes"][0]
        # Without a dump to write it found the archive (the first node of these jars and this Java
        # writes one; another worker's node may write it meanwhile).
        if "class_archive_dump" not in node:
            assert str(archive) in _mapped(node["pid"])
    finally:
        kl.stop_cluster(directory)
    assert archive.is_file() and archive.stat().st_size > 0
    state = kl.start_cluster(directory, brokers=1)
    try:
        node = state["nodes"][0]
        assert "class_archive_dump" not in node
        mapped = _mapped(node["pid"])
        assert str(archive) in mapped, mapped
        assert not any("spark-driver" in m for m in mapped), mapped
    finally:
        kl.stop_cluster(directory)


def test_a_nodes_environment_names_no_other_class_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/x/spark.jsa -Xlog:cds=off")
    assert kafka_local()._jvm_env()["JDK_JAVA_OPTIONS"] == "-XX:TieredStopAtLevel=1 -Xlog:cds=off"


def test_a_nodes_ports_lie_below_the_ephemeral_range() -> None:
    """A restarted node binds its old ports again: no outgoing connection may hold one meanwhile."""
    kl = kafka_local()
    low = kl._ephemeral_low()
    ports = kl._free_ports(20)
    assert len(set(ports)) == 20
    assert all(kl.LOWEST_PORT <= p < low for p in ports), (low, ports)
