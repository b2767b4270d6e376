"""Hadoop's own MiniYARNCluster (one ResourceManager, one NodeManager) for the YARN tests: Spark
applications submitted with ``--master yarn --deploy-mode cluster`` run their driver in a YARN
container (the ApplicationMaster), as on a real cluster.

Its classes come from Maven (``hadoop-client-minicluster`` at the Hadoop version PySpark ships,
with what its shaded jar leaves out: JUnit's assertions, which MiniYARNCluster calls, and Bouncy
Castle), fetched once into the jar cache; a launcher of ten lines, compiled there once, starts the
cluster in a process of its own and writes the client configuration (``yarn-site.xml``) for
``HADOOP_CONF_DIR``. The file system is the local one: every container reads the application's
files where spark-submit left them, and sees this checkout and its virtualenv as the test does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.jvm_options import LEAN
from tests.helpers.kafka import kafka_local

_EXTRA = (
    "org.junit.jupiter:junit-jupiter-api:5.10.2",
    "org.opentest4j:opentest4j:1.3.0",
    "org.apiguardian:apiguardian-api:1.1.2",
    "org.junit.platform:junit-platform-commons:1.10.2",
    "org.bouncycastle:bcprov-jdk18on:1.78.1",
    "org.bouncycastle:bcpkix-jdk18on:1.78.1",
    "org.bouncycastle:bcutil-jdk18on:1.78.1",
)
_LAUNCHER = """
import java.io.FileOutputStream;
import java.nio.file.*;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniYarn {
  public static void main(String[] args) throws Exception {
    YarnConfiguration conf = new YarnConfiguration();
    conf.setBoolean("yarn.nodemanager.vmem-check-enabled", false);
    conf.setBoolean("yarn.nodemanager.pmem-check-enabled", false);
    conf.setInt("yarn.nodemanager.resource.memory-mb", 6144);
    conf.setInt("yarn.nodemanager.resource.cpu-vcores", 4);
    conf.setInt("yarn.scheduler.minimum-allocation-mb", 256);
    conf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "99.9");
    conf.set("yarn.resourcemanager.scheduler.class",
             "org.apache.hadoop.yarn.server.resourcemanager.scheduler.fifo.FifoScheduler");
    conf.set("fs.defaultFS", "file:///");
    MiniYARNCluster cluster = new MiniYARNCluster("kafka2pc", 1, 1, 1);
    cluster.init(conf);
    cluster.start();
    org.apache.hadoop.conf.Configuration c = cluster.getConfig();
    for (int i = 0; i < 600 && c.get(YarnConfiguration.RM_ADDRESS).endsWith(":0"); i++) Thread.sleep(100);
    Path dir = Paths.get(args[0]);
    Files.createDirectories(dir);
    try (FileOutputStream out = new FileOutputStream(dir.resolve("yarn-site.xml").toFile())) { c.writeXml(out); }
    System.out.println("READY " + c.get(YarnConfiguration.RM_ADDRESS));
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }
}
"""


@dataclass(frozen=True)
class YarnCluster:
    conf_dir: Path  # HADOOP_CONF_DIR for spark-submit
    rm_address: str
    directory: Path  # the cluster's own files: its containers' logs under target/

    @property
    def rm_webapp(self) -> str:
        """The ResourceManager's REST API (what the apache-spark provider tracks a cluster-mode
        application through), from the client configuration."""
        import xml.etree.ElementTree as ET

        for prop in ET.parse(self.conf_dir / "yarn-site.xml").getroot().iter("property"):
            if prop.findtext("name") == "yarn.resourcemanager.webapp.address":
                return f"http://{prop.findtext('value')}"
        raise AssertionError("no yarn.resourcemanager.webapp.address in the cluster's yarn-site.xml")

    def container_logs(self, application_id: str) -> str:
        """Every log file of the application's containers, concatenated (the driver's is the AM's)."""
        return "".join(
            f"==> {p}\n{p.read_text(errors='replace')}"
            for p in sorted(self.directory.glob(f"target/**/{application_id}/*/*"))
            if p.is_file()
        )


def hadoop_version() -> str:
    """The Hadoop version of the client jars PySpark ships (``hadoop-client-api-X.jar``)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = [m.group(1) for p in jars.glob("hadoop-client-api-*.jar") if (m := re.search(r"-(\d[\w.]*)\.jar$", p.name))]
    assert found, f"no hadoop-client-api jar in {jars}"
    return found[0]


def _classpath() -> str:
    """The launcher's class path, fetched and compiled once into the jar cache."""
    import pyspark

    version = hadoop_version()
    made_of = hashlib.sha256("\n".join([_LAUNCHER, *_EXTRA]).encode()).hexdigest()[:8]  # a new launcher: a new dir
    libs = kafka_local().cache_dir() / f"yarn-minicluster-{version}-{made_of}"
    libs.mkdir(parents=True, exist_ok=True)
    spark_jars = Path(pyspark.__file__).parent / "jars"
    classpath = f"{libs}:{libs}/*:{spark_jars}/*"
    with (libs.parent / ".yarn-minicluster.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (libs / "MiniYarn.class").is_file():
                mvn = shutil.which("mvn")
                assert mvn is not None, "mvn not found on PATH; Maven fetches Hadoop's minicluster"
                for artifact in (f"org.apache.hadoop:hadoop-client-minicluster:{version}", *_EXTRA):
                    command = [
                        mvn,
                        "-q",
                        "-B",
                        "dependency:copy",
                        f"-Dartifact={artifact}",
                        f"-DoutputDirectory={libs}",
                    ]
                    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
                    assert done.returncode == 0, f"{command} failed:\n{done.stdout}{done.stderr}"
                (libs / "MiniYarn.java").write_text(_LAUNCHER)
                compiled = subprocess.run(
                    ["javac", "-cp", classpath, "-d", str(libs), str(libs / "MiniYarn.java")],
                    capture_output=True, text=True, check=False, timeout=300,
                )  # fmt: skip
                assert compiled.returncode == 0, compiled.stderr
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return classpath


@contextlib.contextmanager
def mini_yarn(directory: Path, timeout_s: float = 240.0) -> Iterator[YarnCluster]:
    """A running MiniYARNCluster; stopped (its process group killed) on exit. One that does not
    start within ``timeout_s`` fails the tests that need it, with its log."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "minicluster.log"
    command = ["java", "-Xmx768m", *LEAN, "-cp", _classpath(), "MiniYarn", str(directory / "conf")]
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=directory, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not (ready := re.search(r"^READY (\S+)$", log.read_text(errors="replace"), re.M)):
            assert proc.poll() is None, f"MiniYARNCluster exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, (
                f"MiniYARNCluster not ready in {timeout_s:.0f}s:\n{log.read_text()[-4000:]}"
            )
            time.sleep(0.5)
        yield YarnCluster(directory / "conf", ready.group(1), directory)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        # The NodeManager starts each container in a session of its own, beyond the cluster's group:
        # an application a failed test left running is found by its directory, under the cluster's.
        subprocess.run(["pkill", "-KILL", "-f", str(directory.resolve())], check=False)


def application_masters(application_id: str) -> list[int]:
    """The process groups of the application's ApplicationMaster containers now running (its driver)."""
    found = subprocess.run(["pgrep", "-f", f"ApplicationMaster.*{application_id}"], capture_output=True, text=True)
    return sorted({os.getpgid(int(pid)) for pid in found.stdout.split() if _alive(int(pid))})


def _alive(pid: int) -> bool:
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        return False
    return True


__all__ = ["YarnCluster", "application_masters", "hadoop_version", "mini_yarn"]
