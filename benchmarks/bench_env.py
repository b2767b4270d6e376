"""Plumbing shared by the benchmarks: the package on the path, the broker, topics, counting."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def use_repo() -> None:
    """Make ``airflow_provider_kafka2pc`` importable here and in Spark's Python workers.

    The repository goes *after* any ``PYTHONPATH`` entry, so a scratch copy of the package put on
    ``PYTHONPATH`` is what both the driver and the workers import.
    """
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, str(REPO)])


def package_dir() -> str:
    """Where this process imports ``airflow_provider_kafka2pc`` from."""
    import airflow_provider_kafka2pc

    return str(Path(airflow_provider_kafka2pc.__file__).parent)


def kafka_local() -> ModuleType:
    """The project's ``scripts/kafka_local.py``, imported by path (it is no package)."""
    name = "kafka_local"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "kafka_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """Yield ``bootstrap``, or start a 1-broker cluster in a temporary directory and stop it after."""
    if bootstrap:
        yield bootstrap
        return
    kl = kafka_local()
    directory = Path(tempfile.mkdtemp(prefix="kafka2pc-bench-"))
    state = kl.start_cluster(directory, brokers=1)
    failed = True
    try:
        yield str(state["bootstrap_servers"])
        failed = False
    finally:
        kl.stop_cluster(directory)
        if failed:
            print(f"broker logs kept in {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)


class Kafka:
    """Topics and read_committed counts on one cluster (confluent-kafka admin and consumer)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.config: dict[str, Any] = {"bootstrap.servers": bootstrap}
        self._admin: Any = AdminClient(self.config)

    def close(self) -> None:
        """Drop the admin client (a librdkafka handle) before its broker goes away."""
        self._admin = None

    def topic(self, label: str, partitions: int = 4) -> str:
        """Create a fresh topic and wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        self._admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = self._admin.list_topics(name, timeout=10).topics[name]
            leaders = [p.leader for p in md.partitions.values()]
            if md.error is None and len(leaders) == partitions and min(leaders) >= 0:
                return name
            time.sleep(0.05)
        raise RuntimeError(f"topic {name} got no leaders in 30 s")

    def _end_offsets(self, topic: str, committed: bool) -> dict[int, int]:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        parts = self._admin.list_topics(topic, timeout=10).topics[topic].partitions
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = self._admin.list_offsets(
            {TopicPartition(topic, p): latest for p in parts}, isolation_level=level, request_timeout=30
        )
        return {tp.partition: f.result().offset for tp, f in futures.items()}

    def wait_stable(self, topic: str, timeout_s: float = 60.0) -> None:
        """Wait until no transaction is open on ``topic`` (last stable offset = high watermark).

        EndTxn returns before the coordinator has written every marker, so a consumer started
        right after a commit could stop short of the end."""
        deadline = time.monotonic() + timeout_s
        while True:
            lso, hw = self._end_offsets(topic, True), self._end_offsets(topic, False)
            if lso == hw:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: last stable offsets {lso} still behind {hw} after {timeout_s:.0f} s")
            time.sleep(0.1)

    def count_committed(self, topic: str, timeout_s: float = 300.0) -> int:
        """How many records a read_committed consumer sees from the beginning to the end of ``topic``."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        self.wait_stable(topic)
        consumer = Consumer(
            {
                **self.config,
                "group.id": f"bench-count-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
                "max.partition.fetch.bytes": 8 << 20,
            }
        )
        try:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            pending = set(parts)
            count = 0
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{topic}: counting did not reach the end of partitions {sorted(pending)}")
                for msg in consumer.consume(100_000, 0.5):
                    err = msg.error()
                    if err is None:
                        count += 1
                    elif err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    else:
                        raise RuntimeError(f"{topic}: {err}")
            return count
        finally:
            consumer.close()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# The command-line mark of the competing load's processes (``competing_load``), while it runs.
_COMPETING: list[str] = []


def machine_cpu_seconds() -> float:
    """The machine's busy CPU seconds so far (``/proc/stat``: user, nice, system, irq, softirq,
    steal), less the competing load's: on the emulated cluster, whose hosts share this kernel, the
    difference of two readings is what every host spent, the executors and the brokers included."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    busy = (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS
    return busy - sum(_process_cpu(pid) for pid in _marked(_COMPETING[0])) if _COMPETING else busy


def _process_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:13]) / _CLOCK_TICKS


def _marked(mark: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


# One competing process: SHA-256 over a 64 KiB block, forever. A fixed amount of work per second of
# CPU it gets, so a run with K of them meets the same competition every time.
_SPIN = "import hashlib, sys\nblock = b'k' * 65536\nwhile True:\n    hashlib.sha256(block).digest()"


@contextlib.contextmanager
def competing_load(processes: int) -> Iterator[None]:
    """``processes`` busy processes on this machine's cores while the block runs (none for 0). They
    are detached (``setsid -f``: no descendant of this process), so the process tree's CPU leaves
    them out, and ``machine_cpu_seconds`` takes theirs off; they are killed on exit."""
    if processes <= 0:
        yield
        return
    mark = f"kafka2pc-bench-competing-{uuid.uuid4().hex[:8]}"
    _COMPETING[:] = [mark]
    try:
        for _ in range(processes):
            subprocess.run(["setsid", "-f", sys.executable, "-c", _SPIN, mark], check=True)
        deadline = time.monotonic() + 10
        while len(_marked(mark)) < processes and time.monotonic() < deadline:
            time.sleep(0.05)
        yield
    finally:
        for pid in _marked(mark):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        _COMPETING.clear()


# The parts of the process tree a run's CPU is split into, by command line (``_part``).
CPU_PARTS = ("python workers", "spark jvm", "broker", "this process")


# A process in a snapshot: (pid, start time in clock ticks), so a reused pid is another process.
ProcessKey = tuple[int, int]


@dataclass(frozen=True)
class ProcessCPU:
    part: str  # one of CPU_PARTS
    cpu: float  # seconds: user + system, plus those of its children it has reaped
    parent: ProcessKey | None


def tree_cpu_seconds(root: int | None = None) -> dict[ProcessKey, ProcessCPU]:
    """The CPU of ``root`` (default: this process) and of every live descendant. The tree holds
    Spark's JVM and its Python workers (with librdkafka's threads) and the broker, when
    ``broker()`` started it.

    The difference of two snapshots (``cpu_between``) is the CPU spent on what ran in between:
    a busy spell on a shared machine slows a run down but does not inflate it."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, int, float]] = {}  # pid -> parent pid, start time, CPU
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # After the command name (proc(5), counted from state): [1] parent pid, [11:15] utime,
        # stime, cutime, cstime, [19] start time.
        cpu = sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
        stats[int(entry)] = (int(fields[1]), int(fields[19]), cpu)
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _, _) in stats.items():
        children[parent].append(pid)
    out: dict[ProcessKey, ProcessCPU] = {}
    todo: list[tuple[int, ProcessKey | None]] = [(root, None)]
    while todo:
        pid, parent = todo.pop()
        if pid in stats:
            _, started, cpu = stats[pid]
            key = (pid, started)
            out[key] = ProcessCPU("this process" if pid == root else _part(pid), cpu, parent)
            todo.extend((child, key) for child in children[pid])
    return out


def _part(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except OSError:
        return "spark jvm"
    if b"kafka.Kafka" in command:
        return "broker"
    if any(arg.startswith(b"pyspark.") for arg in command):  # python -m pyspark.daemon / .worker
        return "python workers"
    return "spark jvm"


def cpu_between(before: dict[ProcessKey, ProcessCPU], after: dict[ProcessKey, ProcessCPU]) -> dict[str, float]:
    """CPU seconds by part (``CPU_PARTS``) between two ``tree_cpu_seconds`` snapshots.

    A process started in between counts whole. One that ended was reaped by an ancestor still
    there, whose children's CPU now holds its whole life: what it had spent by the first
    snapshot is taken off that ancestor's part, so only the time in between is counted."""
    parts = dict.fromkeys(CPU_PARTS, 0.0)
    for key, now in after.items():
        parts[now.part] += now.cpu - (before[key].cpu if key in before else 0.0)
    for key, then in before.items():
        if key in after:
            continue
        ancestor = then.parent
        while ancestor is not None and ancestor not in after:
            ancestor = before[ancestor].parent if ancestor in before else None
        parts[after[ancestor].part if ancestor is not None else then.part] -= then.cpu
    return parts


class Phases:
    """Seconds spent inside patched functions, by phase name: wall clock, and CPU of the calling thread.

    On two cores shared with the broker and librdkafka's threads, wall clock includes waiting for
    a core; the calling thread's CPU time is what the Python code itself costs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def timing(self, owner: Any, attr: str, phase: str) -> Iterator[None]:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started
                self.cpu[phase] += time.thread_time() - cpu
                self.calls[phase] += 1

        setattr(owner, attr, timed)
        try:
            yield
        finally:
            setattr(owner, attr, original)
