#!/usr/bin/env python3
"""Run a real Apache Kafka in KRaft mode on loopback, for tests, CI and demos.

Kafka is assembled from Maven Central jars (``scripts/kafka/pom.xml``) into a cache
outside git and started as 1 or 3 combined broker+controller JVMs. Everything a
cluster needs (configs, data, logs, ``cluster.json``) lives in the directory given
with ``--dir``. Standard library only, so CI and a pytest fixture can use it before
any dependency is installed::

    kafka-local start --dir /tmp/kafka --brokers 3      # prints bootstrap servers
    kafka-local tool --dir /tmp/kafka transactions list
    kafka-local stop --dir /tmp/kafka

``--security sasl_ssl`` starts one broker as a production cluster would run: a SASL_SSL
listener (SCRAM-SHA-512) with a CA and broker certificate made here by ``openssl``, the
StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``, a super user ``admin`` and
SCRAM users created at format time (``--scram-user NAME=PASSWORD``). ``tool`` then runs as
``admin`` (``--command-config`` is added), e.g. ``kafka-local tool --dir D acls --list``. A
second, SSL listener requires a client certificate of that CA (:func:`client_certificate` makes
one): its principal is the certificate's subject.

A test imports this file by path and calls :func:`start_cluster`,
:func:`stop_cluster`, :func:`stop_node`, :func:`start_node` and :func:`run_tool`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

SCRIPT_DIR = Path(__file__).resolve().parent
POM = SCRIPT_DIR / "kafka" / "pom.xml"

KAFKA_VERSION = os.environ.get("KAFKA2PC_KAFKA_VERSION", "4.4.0")
# Maven Central has no kafka-tools 4.4.0 yet; the tools only speak the wire
# protocol to the broker, so the newest release that has them is used.
TOOLS_VERSION = os.environ.get("KAFKA2PC_KAFKA_TOOLS_VERSION", "4.3.1")

HOST = os.environ.get("KAFKA2PC_KAFKA_HOST", "127.0.0.1")  # scripts/cluster-local: its bridge address
DEFAULT_TXN_MAX_TIMEOUT_MS = 900_000
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
STATE_FILE = "cluster.json"
STARTED_MESSAGE = "Kafka Server started"
# What a ZooKeeper-mode broker (Kafka before 3.3, see uses_zookeeper) logs instead.
ZK_STARTED_MESSAGE = "] started (kafka.server.KafkaServer)"
# KRaft is production-ready from Kafka 3.3 (KIP-833); older lines run on a ZooKeeper of their
# own jars' classpath, started and stopped with the brokers.
FIRST_KRAFT_VERSION = (3, 3)

# C1 only: on 2 cores three JVMs starting at once spend their time in the C2
# compiler; without it a 3-node cluster is up in ~7 s instead of ~10 s, and test
# traffic is far too small to miss C2. The serial collector: a broker of a local
# cluster serves one user, and 40 transactions of 50,000 records cost it about a
# quarter less CPU than with G1 (3.0-3.6 CPU-s against 4.4-4.7 measured). No
# hsperfdata: nothing here reads it (jstat), and its sampler wakes every 50 ms.
BROKER_JVM_OPTS: tuple[str, ...] = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
# Tools are short-lived: C1 only and a serial GC start noticeably faster; no hsperfdata, as a broker.
TOOL_JVM_OPTS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)

# Class-data sharing: a node maps the classes that an earlier node of the same Java, jars and main
# class loaded, from a dynamic archive in the cache that such a node wrote when it stopped on SIGTERM
# (a killed one writes none). Measured on this 2-core machine: a 1-node broker starts on 2.4 CPU-s
# instead of 3.8 (1.8 s instead of 3.0); the tests start some 80 of them, restarts included. A JVM
# that cannot map the archive (another Java, jars fetched again) goes on without it, quietly.
CDS_QUIET: tuple[str, ...] = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
ARCHIVE_DIR_NAME = "jvm-archives"

TOOL_ALIASES: dict[str, str] = {
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "acls": "org.apache.kafka.tools.AclCommand",
}
# How each alias takes a client properties file (the admin's credentials on a secured cluster).
TOOL_CONFIG_FLAGS: dict[str, str] = {
    "transactions": "--command-config",
    "topics": "--command-config",
    "console-consumer": "--consumer.config",
    "console-producer": "--producer.config",
    "consumer-groups": "--command-config",
    "acls": "--command-config",
}

SECURITY_MODES = ("plaintext", "sasl_ssl")
ADMIN_USER = "admin"
SCRAM_MECHANISM = "SCRAM-SHA-512"
OAUTH_AUDIENCE = "kafka"  # the "aud" an OAUTHBEARER token must carry for a --security sasl_ssl broker

BROKER_LOG4J2 = """\
# Written by kafka_local.py.
status = warn
name = kafka2pc-broker
appender.server.type = File
appender.server.name = server
appender.server.fileName = {log_file}
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

TOOLS_LOG4J2 = """\
# Written by kafka_local.py: tools print their results on stdout, so logs go to stderr.
status = warn
name = kafka2pc-tools
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = stderr
"""


class KafkaLocalError(RuntimeError):
    """Kafka could not be fetched, started, stopped or found."""


class Libs(NamedTuple):
    broker: Path
    tools: Path


class NodeState(TypedDict):
    id: int
    port: int
    controller_port: int
    pid: int | None
    pid_start_ticks: int | None
    dir: str
    log_dir: str
    data_dir: str
    config: str
    log4j_config: str
    host: NotRequired[str]  # its own address (a host of an emulated network); else HOST
    netns: NotRequired[str]  # the network namespace its JVM runs in (``ip netns exec``)
    class_archive_dump: NotRequired[str]  # where this JVM writes its class archive when it exits


class BrokerHost(NamedTuple):
    """A host of an emulated network (tests/helpers/netns.py) that one broker runs on."""

    address: str
    netns: str


def _broker_host(text: str) -> BrokerHost:
    address, at, netns = text.partition("@")
    if not at or not address or not netns:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDRESS@NETNS")
    return BrokerHost(address, netns)


def _host(node: NodeState) -> str:
    return node.get("host", HOST)


class Security(TypedDict):
    """What a client of a ``sasl_ssl`` cluster needs; the passwords are made per cluster."""

    mode: str
    ca_file: str
    admin_properties: str  # Kafka tools' client config for the super user
    users: dict[str, str]  # SCRAM-SHA-512 name -> password, ``admin`` included
    oauth_jwks_url: NotRequired[str]  # OAUTHBEARER accepted too, tokens checked against this JWKS
    oauth_issuer: NotRequired[str]  # ... and must carry this "iss"
    mtls_bootstrap: NotRequired[str]  # an SSL listener that requires a client certificate (``client_certificate``)


class ClusterState(TypedDict):
    kafka_version: str
    tools_version: str
    cluster_id: str
    bootstrap_servers: str
    brokers: int
    dir: str
    libs_dir: str
    tools_libs_dir: str
    tools_log4j_config: str
    java: str
    nodes: list[NodeState]
    security: NotRequired[Security]
    zookeeper: NotRequired[NodeState]  # Kafka before 3.3 (uses_zookeeper): its ZooKeeper, id 0


class ClusterStatus(ClusterState):
    alive: dict[str, bool]


# Handles of the JVMs started by this process. Keeping them means Python neither
# warns that a collected handle's child still runs nor leaves exited JVMs as zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _log(message: str) -> None:
    print(f"kafka-local: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- fetch


def cache_dir() -> Path:
    """Root of the jar cache, outside the work tree so git never sees the jars."""
    root = os.environ.get("KAFKA2PC_CACHE") or "~/.cache/kafka2pc"
    return Path(root).expanduser().resolve()


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    # Parallel test workers may fetch or mutate the same directory at once.
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_profile(profile: str, libs: Path, properties: Mapping[str, str]) -> None:
    """Copy one profile's runtime jars into ``libs`` unless a matching marker says done."""
    marker = libs.with_name(libs.name + ".complete")
    # The pom's hash is in the marker so editing the pom refreshes the cache.
    wanted = {
        "profile": profile,
        "pom_sha256": hashlib.sha256(POM.read_bytes()).hexdigest(),
        **properties,
    }
    with _locked(libs.parent / ".fetch.lock"):
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(marker.read_text()) == wanted and libs.is_dir():
                return
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaLocalError("mvn not found on PATH; Maven is needed to fetch Kafka")
        marker.unlink(missing_ok=True)
        shutil.rmtree(libs, ignore_errors=True)
        command = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(POM), f"-P{profile}"]
        command += [f"-D{key}={value}" for key, value in properties.items()]
        command += [f"-Dkafka.libs={libs}", "dependency:copy-dependencies"]
        _log(f"fetching {profile} jars into {libs}")
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(libs.glob("*.jar")):
            raise KafkaLocalError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        marker.write_text(json.dumps(wanted, indent=2) + "\n")


def fetch(kafka_version: str = KAFKA_VERSION, tools_version: str = TOOLS_VERSION) -> Libs:
    """Make sure the broker and tool jars are in the cache; return their directories."""
    common = {"kafka.version": kafka_version, "kafka.tools.version": tools_version}
    libs = Libs(
        broker=cache_dir() / f"kafka-{kafka_version}" / "libs",
        tools=cache_dir() / f"kafka-tools-{tools_version}" / "libs",
    )
    _fetch_profile("broker", libs.broker, common)
    # The tools' jars do not depend on the broker's release: their marker names the tools' only,
    # or every start of another broker release would fetch them again.
    _fetch_profile("tools", libs.tools, {"kafka.tools.version": tools_version})
    return libs


# --------------------------------------------------------------------------- processes


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaLocalError("java not found (set JAVA_HOME or put java on PATH)")
    return java


def _classpath(libs: str | Path) -> str:
    """kafka-clients first: a broker names its version from the first kafka/kafka-version.properties
    on the class path, and other Kafka jars (kafka-tools-api at another release) carry one too."""
    clients = sorted(Path(libs).glob("kafka-clients-*.jar"))
    return os.pathsep.join([*(str(c) for c in clients), f"{libs}/*"])


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def uses_zookeeper(kafka_version: str) -> bool:
    """Kafka before 3.3 runs in ZooKeeper mode here (KRaft was a preview until 3.3)."""
    return version_tuple(kafka_version)[:2] < FIRST_KRAFT_VERSION


def _proc_info(pid: int) -> tuple[int, bool] | None:
    """(start time in clock ticks after boot, has exited) of ``pid``; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces
    exited = False
    if fields[0] in ("Z", "X"):
        # A JVM's main thread can be a zombie while its other threads still run
        # (and hold the ports); only a zombie without them has exited.
        try:
            exited = os.listdir(f"/proc/{pid}/task") == [str(pid)]
        except FileNotFoundError:
            exited = True
    return int(fields[19]), exited


def _alive(node: NodeState) -> bool:
    """Whether the node's recorded JVM still runs.

    The process start time, not the command line, tells it apart from a later
    process with the same pid: /proc/PID/cmdline reads empty for a moment while
    the new JVM is still being exec'ed.
    """
    pid = node["pid"]
    if not pid:
        return False
    child = _CHILDREN.get(pid)
    if not Path("/proc/self").exists():  # no procfs (macOS): best effort
        if child is not None:
            return child.poll() is None
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    info = _proc_info(pid)
    if info is None:
        return False
    start_ticks = node.get("pid_start_ticks")
    if start_ticks is None:  # state written before start times were recorded
        with contextlib.suppress(OSError):
            if node["config"].encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                start_ticks = info[0]
    if info[0] != start_ticks:
        return False
    if child is not None:
        # Our own child: waitpid is exact, and reaps it.
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    return not info[1]


# Ports below the kernel's ephemeral range: no outgoing connection is ever given one. A node keeps its
# ports across a restart, and while it was down an ephemeral port could be taken by a client, or by a
# peer reconnecting to it that met itself (TCP's self-connect): its restart failed with "Address
# already in use" (seen in a leader-kill test's restart of a node's controller port).
LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, outside the ephemeral range where it leaves room (else any)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    # All sockets stay bound until every port is picked, so none repeats.
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        attempts = 0
        while len(ports) < count:
            attempts += 1
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            wanted = rng.randrange(LOWEST_PORT, low) if low - LOWEST_PORT > 1000 and attempts < 200 else 0
            try:
                sock.bind((HOST, wanted))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
        return ports


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise KafkaLocalError(f"port {HOST}:{port} is not free: {exc}") from exc


def _random_cluster_id() -> str:
    # Same shape as Kafka's Uuid.randomUuid(): url-safe base64 of 16 bytes, no
    # padding, never starting with "-" (the storage tool would read it as a flag).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _broker_properties(
    node: NodeState,
    nodes: Sequence[NodeState],
    txn_max_timeout_ms: int,
    extra: Mapping[str, str],
) -> dict[str, str]:
    count = len(nodes)
    replicas = min(3, count)
    min_isr = "1" if count == 1 else "2"
    voters = ",".join(f"{n['id']}@{_host(n)}:{n['controller_port']}" for n in nodes)
    host = _host(node)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node["id"]),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{node['port']},CONTROLLER://{host}:{node['controller_port']}",
        "advertised.listeners": f"PLAINTEXT://{host}:{node['port']}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": node["data_dir"],
        "num.partitions": "1",
        "default.replication.factor": str(count),
        "min.insync.replicas": min_isr,
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # Few internal partitions: creating 50 of each makes startup slow.
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "share.coordinator.state.topic.num.partitions": "4",
        "transaction.max.timeout.ms": str(txn_max_timeout_ms),
        # Timed-out transactions get aborted within a second, so timeout tests are quick.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # The active controller appends a no-op record to the metadata log this often (500 ms by
        # default), and every node replays it: most of an idle node's CPU. A test run keeps about
        # 15 nodes up, mostly idle; at 5 s an idle node took 1.7 % of a core instead of 2.2-2.6 %.
        "metadata.max.idle.interval.ms": "5000",
        # A SIGKILLed broker is fenced, and its partitions led elsewhere, once its session lapses:
        # 9 s by default, most of every leader-kill round. 5 s (heartbeats every second) halves the
        # wait and still outlasts any stall seen on a loaded 2-core machine.
        "broker.session.timeout.ms": "5000",
        "broker.heartbeat.interval.ms": "1000",
        # Request handlers and network threads for a local cluster's few clients: each idle handler
        # wakes every 300 ms. 8 and 3 by default: an idle node 1.16 CPU-s a minute, 0.5 of it theirs.
        "num.io.threads": "2",
        "num.network.threads": "2",
    }
    props.update(extra)
    return props


def _zookeeper_mode_properties(node: NodeState, zookeeper: NodeState) -> dict[str, str]:
    """What a ZooKeeper-mode broker takes instead of the KRaft settings (``_broker_properties``)."""
    return {
        "broker.id": str(node["id"]),
        "zookeeper.connect": f"{HOST}:{zookeeper['port']}",
        "listeners": f"PLAINTEXT://{HOST}:{node['port']}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT",
    }


_KRAFT_ONLY = ("process.roles", "node.id", "controller.quorum.voters", "controller.listener.names")


def _zookeeper_properties(zookeeper: NodeState) -> dict[str, str]:
    return {
        "dataDir": zookeeper["data_dir"],
        "clientPort": str(zookeeper["port"]),
        "clientPortAddress": HOST,
        "admin.enableServer": "false",
        "maxClientCnxns": "0",
    }


def _sasl_ssl_properties(
    node: NodeState, security: Security, keystore: Path, keystore_password: str, mtls_port: int
) -> dict[str, str]:
    """One SASL_SSL listener for clients and the broker itself, and an SSL listener for clients with a
    certificate of the cluster's CA (mTLS: the principal is the certificate's subject); the
    controller stays on loopback PLAINTEXT.

    The controller listener's principal is ANONYMOUS, which therefore has to be a super user
    (broker registration and heartbeats need ClusterAction); only the combined node's own
    broker connects to it, and clients are given the SASL_SSL port only.
    """
    admin = security["users"][ADMIN_USER]
    mechanisms = [SCRAM_MECHANISM]
    oauth: dict[str, str] = {}
    jwks = security.get("oauth_jwks_url")
    if jwks:
        # Kafka's own validator: signature from the JWKS, then exp and sub (the principal).
        mechanisms.append("OAUTHBEARER")
        module = "org.apache.kafka.common.security.oauthbearer"
        oauth = {
            "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": f"{module}.OAuthBearerLoginModule required;",
            "listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class": (
                f"{module}.OAuthBearerValidatorCallbackHandler"
            ),
            "sasl.oauthbearer.jwks.endpoint.url": jwks,
            # Kafka 4.4 refuses to start without both.
            "sasl.oauthbearer.expected.audience": OAUTH_AUDIENCE,
            "sasl.oauthbearer.expected.issuer": security.get("oauth_issuer", ""),
        }
    return {
        **oauth,
        "listeners": (
            f"SASL_SSL://{HOST}:{node['port']},SSL://{HOST}:{mtls_port},CONTROLLER://{HOST}:{node['controller_port']}"
        ),
        "advertised.listeners": f"SASL_SSL://{HOST}:{node['port']},SSL://{HOST}:{mtls_port}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
        "listener.name.ssl.ssl.client.auth": "required",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": ",".join(mechanisms),
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": _scram_jaas(ADMIN_USER, admin),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(keystore),
        "ssl.keystore.password": keystore_password,
        "ssl.key.password": keystore_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": security["ca_file"],
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
    }


def _scram_jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaLocalError("openssl not found on PATH (scripts/setup installs it)")
    result = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KafkaLocalError(f"openssl {' '.join(args[:2])} failed:\n{result.stderr}")


def _make_tls(directory: Path) -> tuple[Path, Path, str]:
    """A throw-away CA and a broker certificate for 127.0.0.1/localhost: (ca.pem, broker.p12, its password)."""
    tls = directory / "tls"
    tls.mkdir(mode=0o700)
    password = uuid.uuid4().hex
    (tls / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "30",
        "-subj",
        "/CN=kafka2pc test CA",
        cwd=tls,
    )
    _issue_certificate(tls, "broker", "/CN=localhost", "broker.ext")
    _openssl(
        "pkcs12",
        "-export",
        "-in",
        "broker.pem",
        "-inkey",
        "broker.key",
        "-certfile",
        "ca.pem",
        "-name",
        "broker",
        "-out",
        "broker.p12",
        "-passout",
        f"pass:{password}",
        cwd=tls,
    )
    return tls / "ca.pem", tls / "broker.p12", password


def _issue_certificate(tls: Path, name: str, subject: str, extfile: str | None = None) -> None:
    """``name``.key and ``name``.pem in ``tls``: a new key and its certificate for ``subject``, signed
    by the CA there (ca.pem, ca.key) for 30 days."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=tls)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "30", *(["-extfile", extfile] if extfile else []), cwd=tls)  # fmt: skip


def client_config(state: ClusterState, user: str = ADMIN_USER) -> dict[str, str]:
    """librdkafka settings for ``user`` (the super user by default) on this cluster."""
    config = {"bootstrap.servers": state["bootstrap_servers"]}
    security = state.get("security")
    if security is not None:
        config.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": SCRAM_MECHANISM,
                "sasl.username": user,
                "sasl.password": security["users"][user],
                "ssl.ca.location": security["ca_file"],
            }
        )
    return config


def client_certificate(directory: str | Path, name: str) -> dict[str, str]:
    """librdkafka settings for the mTLS listener of a ``sasl_ssl`` cluster, with a new client
    certificate of the cluster's CA for subject ``CN=name,OU=tests,O=kafka2pc`` (its principal)."""
    root = Path(directory).resolve()
    security = load_state(root).get("security")
    if security is None or "mtls_bootstrap" not in security:
        raise KafkaLocalError(f"the cluster in {root} has no mTLS listener (start it with --security sasl_ssl)")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise KafkaLocalError(f"a client certificate's name is letters, digits, '_', '.' and '-', not {name!r}")
    tls = root / "tls"
    _issue_certificate(tls, name, f"/O=kafka2pc/OU=tests/CN={name}")
    return {
        "bootstrap.servers": security["mtls_bootstrap"],
        "security.protocol": "SSL",
        "ssl.ca.location": security["ca_file"],
        "ssl.certificate.location": str(tls / f"{name}.pem"),
        "ssl.key.location": str(tls / f"{name}.key"),
    }


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    lines = ["# Written by kafka_local.py."] + [f"{key}={value}" for key, value in props.items()]
    path.write_text("\n".join(lines) + "\n")


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def load_state(directory: str | Path) -> ClusterState:
    """Read ``DIR/cluster.json``."""
    path = Path(directory).resolve() / STATE_FILE
    try:
        state: ClusterState = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise KafkaLocalError(f"no cluster here: {path} does not exist") from exc
    return state


def _node(state: ClusterState, node_id: int) -> NodeState:
    for node in state["nodes"]:
        if node["id"] == node_id:
            return node
    raise KafkaLocalError(f"no node {node_id} in {state['dir']}")


def _server_log(node: NodeState) -> Path:
    return Path(node["log_dir"]) / "server.log"


def _stdout_log(node: NodeState) -> Path:
    return Path(node["log_dir"]) / "stdout.log"


def _class_archive(state: ClusterState, main_class: str) -> Path:
    """The cache's class archive for JVMs of this Java, these jars and this main class."""
    key = f"{state['java']}|{Path(state['libs_dir']).resolve()}|{main_class}|{'|'.join(BROKER_JVM_OPTS)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / ARCHIVE_DIR_NAME / f"{main_class.rsplit('.', 1)[-1]}-{digest}.jsa"


def _class_archive_options(state: ClusterState, node: NodeState, main_class: str) -> list[str]:
    """Map the archive if there is one; else have this JVM write one when it exits."""
    node.pop("class_archive_dump", None)
    archive = _class_archive(state, main_class)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", *CDS_QUIET]
    archive.parent.mkdir(parents=True, exist_ok=True)
    dump = archive.with_name(f"{archive.name}.{os.getpid()}.{node['id']}.{uuid.uuid4().hex[:8]}")
    node["class_archive_dump"] = str(dump)
    return [f"-XX:ArchiveClassesAtExit={dump}", *CDS_QUIET]


def _keep_class_archive(node: NodeState) -> None:
    """After a clean exit: the archive the JVM wrote becomes the cache's (the last one wins)."""
    dump = node.pop("class_archive_dump", None)
    if dump is None:
        return
    path = Path(dump)
    if path.is_file() and path.stat().st_size > 0:
        os.replace(path, path.with_name(path.name.split(".jsa.", 1)[0] + ".jsa"))
    else:
        path.unlink(missing_ok=True)


def _tool_class_archive_options(state: ClusterState, main_class: str) -> tuple[list[str], Path | None]:
    """A tool's options for the cache's class archive of its Java, jars and main class (as a node's,
    ``_class_archive_options``), and where this run writes the archive when there is none yet."""
    key = f"{state['java']}|{Path(state['tools_libs_dir']).resolve()}|{main_class}|{'|'.join(TOOL_JVM_OPTS)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    archive = cache_dir() / ARCHIVE_DIR_NAME / f"tool-{main_class.rsplit('.', 1)[-1]}-{digest}.jsa"
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", *CDS_QUIET], None
    archive.parent.mkdir(parents=True, exist_ok=True)
    dump = archive.with_name(f"{archive.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    return [f"-XX:ArchiveClassesAtExit={dump}", *CDS_QUIET], dump


def _jvm_env() -> dict[str, str]:
    """This environment without a class archive named in JDK_JAVA_OPTIONS (a test run names Spark's
    there): the node names its own."""
    env = dict(os.environ)
    options = env.get("JDK_JAVA_OPTIONS")
    if options:
        kept = [o for o in options.split() if not o.startswith(("-XX:SharedArchiveFile=", "-XX:ArchiveClassesAtExit="))]
        env["JDK_JAVA_OPTIONS"] = " ".join(kept)
    return env


def _launch(state: ClusterState, node: NodeState, main_class: str = "kafka.Kafka") -> None:
    """Start the node's JVM (a broker, or ``main_class``) detached and record its pid in ``node``."""
    log_dir = Path(node["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    jwks = state.get("security", {}).get("oauth_jwks_url")
    command = [
        # ``ip netns exec`` execs the JVM: the pid recorded is the JVM's, on whichever host it runs.
        *(["ip", "netns", "exec", node["netns"]] if "netns" in node else []),
        state["java"],
        *BROKER_JVM_OPTS,
        *_class_archive_options(state, node, main_class),
        # Kafka 4 fetches only the OAuth URLs this system property allows.
        *([f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={jwks}"] if jwks else []),
        f"-Dlog4j2.configurationFile={node['log4j_config']}",
        "-cp",
        _classpath(state["libs_dir"]),
        main_class,
        node["config"],
    ]
    with _stdout_log(node).open("ab") as out:
        # A new session detaches the JVM, so it outlives whoever started it.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=node["dir"],
            env=_jvm_env(),
            start_new_session=True,
        )
    _CHILDREN[process.pid] = process
    node["pid"] = process.pid
    info = _proc_info(process.pid)
    node["pid_start_ticks"] = info[0] if info else None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def _logs_tail(nodes: Sequence[NodeState]) -> str:
    parts = []
    for node in nodes:
        for path in (_stdout_log(node), _server_log(node)):
            parts.append(f"----- node {node['id']}: {path} -----\n{_tail(path)}")
    return "\n".join(parts)


# --------------------------------------------------------------------------- readiness


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("connection closed by broker")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def metadata_broker_ids(port: int, timeout: float = 5.0, host: str = HOST) -> set[int]:
    """Ids of the brokers that the broker on ``port`` reports, via a Metadata v9 request.

    Kafka's own tools would need a JVM start per check; this is a few bytes instead. v9, the first
    flexible version (Kafka 2.4), is answered by every broker kafka-local runs (2.8 to 4.x: Kafka 4
    dropped v0-v3 only); v12 is unknown before Kafka 3.1. Its brokers come first, laid out as in v12.
    """
    client_id = b"kafka-local"
    body = struct.pack(">hhih", 3, 9, 1, len(client_id)) + client_id
    # header tagged fields; topics = empty compact array; no auto-create; no cluster authz ops;
    # no topic authz ops; body tagged fields
    body += bytes([0, 1, 0, 0, 0, 0])
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        buf = _recv_exact(sock, size)
    pos = _skip_tagged_fields(buf, 4)  # correlation id, then header tagged fields
    pos += 4  # throttle time
    count, pos = _uvarint(buf, pos)
    ids = set()
    for _ in range(count - 1):
        (node_id,) = struct.unpack_from(">i", buf, pos)
        ids.add(node_id)
        host_len, pos = _uvarint(buf, pos + 4)
        pos += host_len - 1 + 4  # host, port
        rack_len, pos = _uvarint(buf, pos)
        pos += max(rack_len - 1, 0)
        pos = _skip_tagged_fields(buf, pos)
    return ids


def _accepts_tcp(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _log_has_started(node: NodeState, offset: int) -> bool:
    try:
        with _server_log(node).open("rb") as handle:
            handle.seek(offset)
            text = handle.read()
            return STARTED_MESSAGE.encode() in text or ZK_STARTED_MESSAGE.encode() in text
    except FileNotFoundError:
        return False


def _wait_ready(state: ClusterState, starting: Mapping[int, int], timeout: float) -> None:
    """Wait until the nodes in ``starting`` (id -> server.log offset) are up and
    every live node's metadata lists every live broker."""
    deadline = time.monotonic() + timeout
    pending = dict(starting)
    while True:
        for node_id in list(pending):
            node = _node(state, node_id)
            if not _alive(node):
                raise KafkaLocalError(f"node {node_id} exited while starting\n{_logs_tail([node])}")
            if _accepts_tcp(node["port"], _host(node)) and _log_has_started(node, pending[node_id]):
                del pending[node_id]
        if not pending and "security" in state:
            return  # one broker, and the raw Metadata probe below speaks PLAINTEXT only
        if not pending:
            live = [n for n in state["nodes"] if _alive(n)]
            wanted = {n["id"] for n in live}
            try:
                if all(metadata_broker_ids(n["port"], host=_host(n)) >= wanted for n in live):
                    return
            except (OSError, struct.error, IndexError):
                pass  # a broker still settling; ask again
        if time.monotonic() > deadline:
            nodes = [_node(state, node_id) for node_id in starting]
            raise KafkaLocalError(
                f"Kafka not ready after {timeout:.0f}s (waiting for nodes "
                f"{sorted(pending) or 'to see each other'})\n{_logs_tail(nodes)}"
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------- cluster


def _prepare_dir(directory: Path) -> None:
    """Clear a previous cluster's files from ``directory``; refuse anything else."""
    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / STATE_FILE
    if state_path.exists():
        old = load_state(directory)
        alive = [n["id"] for n in _processes(old) if _alive(n)]
        if alive:
            raise KafkaLocalError(f"{directory} still runs nodes {alive}; stop it first")
        for node in _processes(old):
            shutil.rmtree(node["dir"], ignore_errors=True)
        state_path.unlink()
    elif any(p for p in directory.iterdir() if p.name != ".kafka-local.lock"):
        raise KafkaLocalError(f"{directory} is neither empty nor a kafka-local cluster dir")


def start_cluster(
    directory: str | Path,
    brokers: int = 1,
    txn_max_timeout_ms: int = DEFAULT_TXN_MAX_TIMEOUT_MS,
    extra: Mapping[str, str] | None = None,
    *,
    base_port: int | None = None,
    timeout: float = READY_TIMEOUT_S,
    security: str = "plaintext",
    scram_users: Mapping[str, str] | None = None,
    oauth_jwks_url: str | None = None,
    oauth_issuer: str | None = None,
    kafka_version: str | None = None,
    hosts: Sequence[BrokerHost] = (),
) -> ClusterState:
    """Format and start a fresh ``brokers``-node KRaft cluster in ``directory``: Kafka
    ``kafka_version`` (default: ``KAFKA2PC_KAFKA_VERSION``, else 4.4.0). A version before 3.3
    (``uses_zookeeper``) runs in ZooKeeper mode instead, plaintext only, with one ZooKeeper (node 0,
    ``state["zookeeper"]``) from the same jars, stopped with the brokers.

    ``security="sasl_ssl"`` (one broker): SASL_SSL with SCRAM-SHA-512, TLS from a CA made here,
    StandardAuthorizer denying whatever no ACL allows, super user ``admin`` (random password)
    and ``scram_users`` (name -> password) created at format time; see ``client_config``. With
    ``oauth_jwks_url`` and ``oauth_issuer`` the listener accepts SASL/OAUTHBEARER too: tokens signed
    by a key of that JWKS, from that issuer, for audience ``OAUTH_AUDIENCE``; principal = ``sub``.

    ``hosts`` (one per broker, KRaft and plaintext only): each node runs on its own host of an
    emulated network, listening on that host's address (scripts/cluster-local, issue 38).

    Returns the state also written to ``directory/cluster.json`` once every node is
    up. On failure the nodes are stopped, their logs kept, and KafkaLocalError raised.
    """
    if brokers not in (1, 3):
        raise KafkaLocalError(f"brokers must be 1 or 3, not {brokers}")
    if security not in SECURITY_MODES:
        raise KafkaLocalError(f"security must be one of {SECURITY_MODES}, not {security!r}")
    if security != "plaintext" and brokers != 1:
        raise KafkaLocalError(f"--security {security} runs one broker only")
    if (scram_users or oauth_jwks_url) and security == "plaintext":
        raise KafkaLocalError("SCRAM users and OAUTHBEARER need --security sasl_ssl")
    if hosts and (len(hosts) != brokers or security != "plaintext"):
        raise KafkaLocalError(f"hosts: one per broker ({brokers}), plaintext only; got {len(hosts)}, {security}")
    if bool(oauth_jwks_url) != bool(oauth_issuer):
        raise KafkaLocalError("OAUTHBEARER needs both the JWKS URL and the issuer")
    if ADMIN_USER in (scram_users or {}):
        raise KafkaLocalError(f"{ADMIN_USER!r} is the super user made by kafka-local; pick another name")
    version = kafka_version or KAFKA_VERSION
    zookeeper_mode = uses_zookeeper(version)
    if zookeeper_mode and security != "plaintext":
        raise KafkaLocalError(f"Kafka {version} runs in ZooKeeper mode here, which kafka-local runs plaintext only")
    if zookeeper_mode and hosts:
        raise KafkaLocalError(f"Kafka {version} runs in ZooKeeper mode here, which kafka-local runs on this host only")
    started_at = time.monotonic()
    libs = fetch(version)
    root = Path(directory).resolve()
    with _locked(root / ".kafka-local.lock"):
        _prepare_dir(root)
        # The mTLS listener's port, or ZooKeeper's, last.
        count = 2 * brokers + (1 if security == "sasl_ssl" or zookeeper_mode else 0)
        if base_port is None:
            ports = _free_ports(count)
        else:
            ports = list(range(base_port, base_port + count))
            for port in ports:
                _check_port_free(port)
        nodes: list[NodeState] = []
        for index in range(brokers):
            node_dir = root / f"node-{index + 1}"
            nodes.append(
                NodeState(
                    id=index + 1,
                    port=ports[2 * index],
                    controller_port=ports[2 * index + 1],
                    pid=None,
                    pid_start_ticks=None,
                    dir=str(node_dir),
                    log_dir=str(node_dir / "logs"),
                    data_dir=str(node_dir / "data"),
                    config=str(node_dir / "server.properties"),
                    log4j_config=str(node_dir / "log4j2.properties"),
                )
            )
            if hosts:
                nodes[-1]["host"], nodes[-1]["netns"] = hosts[index]
        state = ClusterState(
            kafka_version=version,
            tools_version=TOOLS_VERSION,
            cluster_id=_random_cluster_id(),
            bootstrap_servers=",".join(f"{_host(n)}:{n['port']}" for n in nodes),
            brokers=brokers,
            dir=str(root),
            libs_dir=str(libs.broker),
            tools_libs_dir=str(libs.tools),
            tools_log4j_config=str(root / "tools-log4j2.properties"),
            java=_java(),
            nodes=nodes,
        )
        if zookeeper_mode:
            zk_dir = root / "zookeeper"
            state["zookeeper"] = NodeState(
                id=0,
                port=ports[-1],
                controller_port=ports[-1],
                pid=None,
                pid_start_ticks=None,
                dir=str(zk_dir),
                log_dir=str(zk_dir / "logs"),
                data_dir=str(zk_dir / "data"),
                config=str(zk_dir / "zookeeper.properties"),
                log4j_config=str(zk_dir / "log4j2.properties"),
            )
        # Written before anything can fail, so a retry recognises and clears the dir.
        _write_json(root / STATE_FILE, state)
        Path(state["tools_log4j_config"]).write_text(TOOLS_LOG4J2)
        secured: dict[str, str] = {}
        if security == "sasl_ssl":
            ca, keystore, keystore_password = _make_tls(root)
            admin_properties = root / "tls" / "admin.properties"
            state["security"] = Security(
                mode=security,
                ca_file=str(ca),
                admin_properties=str(admin_properties),
                users={ADMIN_USER: uuid.uuid4().hex, **(scram_users or {})},
                mtls_bootstrap=f"{HOST}:{ports[-1]}",
            )
            if oauth_jwks_url and oauth_issuer:
                state["security"]["oauth_jwks_url"] = oauth_jwks_url
                state["security"]["oauth_issuer"] = oauth_issuer
            _write_properties(
                admin_properties,
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SCRAM_MECHANISM,
                    "sasl.jaas.config": _scram_jaas(ADMIN_USER, state["security"]["users"][ADMIN_USER]),
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(ca),
                },
            )
            secured = _sasl_ssl_properties(nodes[0], state["security"], keystore, keystore_password, ports[-1])
            _write_json(root / STATE_FILE, state)
        zookeeper = state.get("zookeeper")
        for node in nodes:
            Path(node["log_dir"]).mkdir(parents=True)
            props = _broker_properties(node, nodes, txn_max_timeout_ms, {**secured, **(extra or {})})
            if zookeeper is not None:
                props = {k: v for k, v in props.items() if k not in _KRAFT_ONLY}
                props.update({**_zookeeper_mode_properties(node, zookeeper), **(extra or {})})
            _write_properties(Path(node["config"]), props)
            log_file = _server_log(node)
            Path(node["log4j_config"]).write_text(BROKER_LOG4J2.format(log_file=log_file))
        if zookeeper is None:
            _format_storage(state)
        else:
            Path(zookeeper["log_dir"]).mkdir(parents=True)
            _write_properties(Path(zookeeper["config"]), _zookeeper_properties(zookeeper))
            Path(zookeeper["log4j_config"]).write_text(BROKER_LOG4J2.format(log_file=_server_log(zookeeper)))
        try:
            if zookeeper is not None:
                _start_zookeeper(state, zookeeper, timeout)
            for node in nodes:
                _launch(state, node)
            _write_json(root / STATE_FILE, state)
            _wait_ready(state, {n["id"]: 0 for n in nodes}, timeout)
        except BaseException:
            _stop_nodes(state, nodes, timeout=5.0)
            _stop_nodes(state, [zookeeper] if zookeeper is not None else [], timeout=5.0)
            _write_json(root / STATE_FILE, state)
            raise
    _log(
        f"{brokers}-node Kafka {version}{' (ZooKeeper mode)' if zookeeper_mode else ''} ready in "
        f"{time.monotonic() - started_at:.1f}s at {state['bootstrap_servers']}"
    )
    return state


def _processes(state: ClusterState) -> list[NodeState]:
    """Every JVM of the cluster: its nodes, then its ZooKeeper if it has one."""
    zookeeper = state.get("zookeeper")
    return [*state["nodes"], *([zookeeper] if zookeeper is not None else [])]


def _start_zookeeper(state: ClusterState, zookeeper: NodeState, timeout: float) -> None:
    """Launch the ZooKeeper of a ZooKeeper-mode cluster and wait until it takes connections."""
    _launch(state, zookeeper, "org.apache.zookeeper.server.ZooKeeperServerMain")
    deadline = time.monotonic() + timeout
    while not _accepts_tcp(zookeeper["port"]):
        if not _alive(zookeeper):
            raise KafkaLocalError(f"ZooKeeper exited while starting\n{_logs_tail([zookeeper])}")
        if time.monotonic() > deadline:
            raise KafkaLocalError(f"ZooKeeper not ready after {timeout:.0f}s\n{_logs_tail([zookeeper])}")
        time.sleep(0.1)


def _format_storage(state: ClusterState) -> None:
    # Static controller.quorum.voters: format needs neither --standalone nor
    # --initial-controllers, and every node is formatted the same way.
    # SCRAM credentials go into the bootstrap metadata: the broker authenticates its own
    # inter-broker connection with them before any client could create users.
    scram: list[str] = []
    security = state.get("security")
    for name, password in (security["users"] if security else {}).items():
        scram += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
    processes = [
        (
            node,
            subprocess.Popen(
                [
                    state["java"],
                    *TOOL_JVM_OPTS,
                    f"-Dlog4j2.configurationFile={state['tools_log4j_config']}",
                    "-cp",
                    _classpath(state["libs_dir"]),
                    "kafka.tools.StorageTool",
                    "format",
                    "--cluster-id",
                    state["cluster_id"],
                    "--config",
                    node["config"],
                    *scram,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
        )
        for node in state["nodes"]
    ]
    failures = []
    for node, process in processes:
        output, _ = process.communicate()
        if process.returncode != 0:
            failures.append(f"node {node['id']}: {output}")
    if failures:
        raise KafkaLocalError("formatting storage failed:\n" + "\n".join(failures))


def _stop_nodes(state: ClusterState, nodes: Sequence[NodeState], timeout: float) -> None:
    """SIGTERM the nodes together (a controlled shutdown), SIGKILL what outlives ``timeout``."""
    live = [n for n in nodes if _alive(n)]
    for node in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(node["pid"] or 0, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    stopping = list(live)
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = [n for n in live if _alive(n)]
    for node in stopping:
        if node not in live:
            _keep_class_archive(node)
    for node in live:
        _log(f"node {node['id']} ignored SIGTERM for {timeout:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(node["pid"] or 0, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [n for n in live if _alive(n)]
    if live:
        raise KafkaLocalError(f"nodes {[n['id'] for n in live]} survived SIGKILL")
    for node in nodes:
        node["pid"] = node["pid_start_ticks"] = None


def stop_cluster(directory: str | Path, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop every node; ``directory`` and its logs stay."""
    root = Path(directory).resolve()
    with _locked(root / ".kafka-local.lock"):
        state = load_state(root)
        _stop_nodes(state, state["nodes"], timeout)
        zookeeper = state.get("zookeeper")
        if zookeeper is not None:  # after the brokers, whose controlled shutdown needs it
            _stop_nodes(state, [zookeeper], timeout)
        _write_json(root / STATE_FILE, state)


def stop_node(directory: str | Path, node: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop one node (e.g. the transaction coordinator's broker)."""
    root = Path(directory).resolve()
    with _locked(root / ".kafka-local.lock"):
        state = load_state(root)
        _stop_nodes(state, [_node(state, node)], timeout)
        _write_json(root / STATE_FILE, state)


def start_node(directory: str | Path, node: int, timeout: float = READY_TIMEOUT_S) -> NodeState:
    """Start a stopped node again with its config and data, waiting until it is up."""
    root = Path(directory).resolve()
    with _locked(root / ".kafka-local.lock"):
        state = load_state(root)
        entry = _node(state, node)
        if _alive(entry):
            raise KafkaLocalError(f"node {node} is already running (pid {entry['pid']})")
        log = _server_log(entry)
        offset = log.stat().st_size if log.exists() else 0
        _launch(state, entry)
        _write_json(root / STATE_FILE, state)
        try:
            _wait_ready(state, {node: offset}, timeout)
        except BaseException:
            _stop_nodes(state, [entry], timeout=5.0)
            _write_json(root / STATE_FILE, state)
            raise
    return entry


def status(directory: str | Path) -> ClusterStatus:
    """``cluster.json`` plus whether each node's JVM is alive (keyed by node id)."""
    state = load_state(directory)
    info: ClusterStatus = {**state, "alive": {str(n["id"]): _alive(n) for n in state["nodes"]}}
    return info


def run_tool(
    directory: str | Path,
    cls: str,
    args: Sequence[str],
    *,
    capture: bool = True,
    input: str | None = None,
    timeout: float | None = 300.0,
) -> subprocess.CompletedProcess[str]:
    """Run a Kafka tool class (or an alias from TOOL_ALIASES) against the cluster.

    For aliases, ``--bootstrap-server`` is put first when ``args`` lack it, and on a
    secured cluster the super user's client config (``--command-config`` or the
    console tools' own flag) unless ``args`` name one.
    Output is captured as text unless ``capture`` is false; the caller checks
    ``returncode``.
    """
    state = load_state(directory)
    main_class = TOOL_ALIASES.get(cls, cls)
    args = list(args)
    if cls in TOOL_ALIASES and "--bootstrap-server" not in args:
        args = ["--bootstrap-server", state["bootstrap_servers"], *args]
    security = state.get("security")
    flag = TOOL_CONFIG_FLAGS.get(cls)
    if security is not None and flag is not None and flag not in args and "--command-config" not in args:
        args = [flag, security["admin_properties"], *args]
    log4j = Path(state["tools_log4j_config"])
    if not log4j.exists():
        log4j.write_text(TOOLS_LOG4J2)
    # Class-data sharing, as a node's: the tools run often (judges, offsets), each a JVM that would
    # load the same classes again. The first run of a main class writes the archive when it exits.
    archive_options, dump = _tool_class_archive_options(state, main_class)
    command = [
        state["java"],
        *TOOL_JVM_OPTS,
        *archive_options,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        _classpath(state["tools_libs_dir"]),
        main_class,
        *args,
    ]
    done: subprocess.CompletedProcess[str] | None = None
    try:
        done = subprocess.run(
            command,
            capture_output=capture,
            input=input,
            text=True,
            timeout=timeout,
            check=False,
            env=_jvm_env(),  # not the class archive a test run names for Spark's JVMs
        )
    finally:
        if dump is not None:
            # Kept after a clean exit only (the last one wins); a failed or killed run's goes.
            if done is not None and done.returncode == 0 and dump.is_file() and dump.stat().st_size > 0:
                os.replace(dump, dump.with_name(dump.name.split(".jsa.", 1)[0] + ".jsa"))
            else:
                dump.unlink(missing_ok=True)
    return done


# --------------------------------------------------------------------------- CLI


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-local",
        description=f"Run Apache Kafka {KAFKA_VERSION} (KRaft; before 3.3 ZooKeeper mode) on 127.0.0.1 from "
        "Maven Central jars (KAFKA2PC_KAFKA_VERSION or --kafka-version picks another release).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("fetch", help="download the jars into the cache; print both libs dirs")

    start = sub.add_parser("start", help="format and start a fresh cluster; print bootstrap servers")
    start.add_argument("--dir", required=True, type=Path)
    start.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    start.add_argument("--txn-max-timeout-ms", type=int, default=DEFAULT_TXN_MAX_TIMEOUT_MS)
    start.add_argument(
        "--base-port",
        type=int,
        help="node N gets PLAINTEXT port P+2(N-1) and CONTROLLER port P+2(N-1)+1 "
        "(default: free ports picked at random)",
    )
    for flag, metavar, text in (
        ("--extra", "KEY=VALUE", "extra or overriding server.properties entries"),
        ("--scram-user", "NAME=PASSWORD", "SCRAM-SHA-512 users created at format time (with --security sasl_ssl)"),
    ):
        start.add_argument(flag, type=_key_value, nargs="+", action="extend", default=[], metavar=metavar, help=text)
    start.add_argument("--timeout", type=float, default=READY_TIMEOUT_S)
    start.add_argument(
        "--host",
        type=_broker_host,
        action="append",
        default=[],
        metavar="ADDRESS@NETNS",
        help="once per broker: it runs in that network namespace, on that address (scripts/cluster-local)",
    )
    start.add_argument("--kafka-version", default=None, help=f"the Kafka release (default: {KAFKA_VERSION})")
    start.add_argument(
        "--security",
        choices=SECURITY_MODES,
        default="plaintext",
        help="sasl_ssl: one broker, SCRAM-SHA-512 over TLS (CA in DIR/tls/ca.pem), "
        "StandardAuthorizer, super user admin (password in DIR/cluster.json)",
    )

    stop = sub.add_parser("stop", help="stop all nodes (SIGTERM, then SIGKILL); keep DIR")
    stop.add_argument("--dir", required=True, type=Path)

    for name, text in (("stop-node", "stop one node"), ("start-node", "restart one stopped node")):
        node = sub.add_parser(name, help=text)
        node.add_argument("--dir", required=True, type=Path)
        node.add_argument("--node", required=True, type=int)

    stat = sub.add_parser("status", help="print cluster.json and which nodes are alive")
    stat.add_argument("--dir", required=True, type=Path)

    tool = sub.add_parser(
        "tool",
        help="run a Kafka tool class against the cluster",
        description="Aliases: "
        + ", ".join(f"{alias} ({cls})" for alias, cls in TOOL_ALIASES.items())
        + ". For aliases --bootstrap-server is added when missing.",
    )
    tool.add_argument("--dir", required=True, type=Path)
    tool.add_argument("cls", metavar="CLASS", help="main class or alias")
    tool.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the tool")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "fetch":
            libs = fetch()
            print(libs.broker)
            print(libs.tools)
        elif args.command == "start":
            state = start_cluster(
                args.dir,
                args.brokers,
                args.txn_max_timeout_ms,
                dict(args.extra),
                base_port=args.base_port,
                timeout=args.timeout,
                security=args.security,
                scram_users=dict(args.scram_user),
                kafka_version=args.kafka_version,
                hosts=args.host,
            )
            print(state["bootstrap_servers"])
        elif args.command == "stop":
            stop_cluster(args.dir)
        elif args.command == "stop-node":
            stop_node(args.dir, args.node)
        elif args.command == "start-node":
            start_node(args.dir, args.node)
        elif args.command == "status":
            info = status(args.dir)
            print(json.dumps(info, indent=2))
            return 0 if all(info["alive"].values()) else 1
        elif args.command == "tool":
            return run_tool(args.dir, args.cls, args.args, capture=False, timeout=None).returncode
    except KafkaLocalError as exc:
        _log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:  # e.g. ending a console consumer
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
