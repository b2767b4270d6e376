"""The Spark driver JVM's output as log records with their own level, not raw stderr.

An Airflow 3 task supervisor logs every line a task writes to stderr at ERROR. Spark's JVM
inherits the task's stderr and writes its log4j lines, its console progress bar, and what its
Python workers print (librdkafka's log lines, Python warnings) there: a successful export showed
a dozen ERROR lines. So the driver JVM is launched with its stdout and stderr piped, and each
line is logged at the level it states (log4j ``WARN``, librdkafka's syslog ``%4|``, a Python
``…Warning:``); a line without one (a stack trace) keeps the level of the line before it.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import IO, Any

from airflow_provider_kafka2pc.txn.kafka.client_logs import SELF_RESOLVING, demote

log = logging.getLogger("airflow_provider_kafka2pc.spark.jvm")
# Every Spark start-up prints these, about the machine and not about the run.
STARTUP_NOISE = (
    r"^WARNING: Using incubator modules",
    r" WARN Utils: Your hostname, .* resolves to a loopback address",
    r" WARN Utils: Set SPARK_LOCAL_IP if you need to bind",
    r" WARN NativeCodeLoader: Unable to load native-hadoop library",
    r"^Setting default log level to ",
    r"^Using Spark's default log4j profile",
    r" WARN Utils: Service 'SparkUI' could not bind on port \d+\. Attempting port",  # another Spark on the host
    r"^To adjust logging level use sc.setLogLevel",
    r"PySpark does not yet fully support pandas >= 3",  # a Python worker's import; Arrow is used, not pandas
)
# Spark's own shutdown race: stopping the context interrupts the cleaner thread while it waits to
# drop a broadcast the job no longer needs (an InterruptedException follows). Nothing of the run.
SHUTDOWN_NOISE = (r" ERROR ContextCleaner: Error cleaning broadcast \d+$",)
demote(log, (*STARTUP_NOISE, *SHUTDOWN_NOISE, *SELF_RESOLVING))

_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
_LIBRDKAFKA = re.compile(r"^%(\d)\|")  # %level|time|facility|client| message
_PY_WARNING = re.compile(r"^(\S+:\d+: \w*Warning: |WARNING: )")
_LOG4J_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}


def level_of(line: str, previous: int) -> int:
    """The level a line of JVM output states, or ``previous`` for a continuation line."""
    if m := _LOG4J.match(line):
        return _LOG4J_LEVELS[m.group(1)]
    if m := _LIBRDKAFKA.match(line):
        syslog = int(m.group(1))  # 0-3 emergency..error, 4 warning, 5-6 notice/info, 7 debug
        return logging.ERROR if syslog <= 3 else logging.WARNING if syslog == 4 else logging.INFO
    if _PY_WARNING.match(line):
        return logging.WARNING
    if line[:1].isspace() or line.startswith(("Caused by", "Traceback", "...")):
        return previous
    return logging.INFO


def _forward(stream: IO[bytes]) -> None:
    level = logging.INFO
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip()
        # The console progress bar redraws with carriage returns; spark_session turns it off.
        if not line.strip():
            continue
        level = level_of(line, level)
        try:
            log.log(level, "%s", line)
        except Exception:  # never stop draining: a full pipe would block the JVM
            continue


def launch_gateway_with_logs(conf: Any) -> bool:
    """Start the driver JVM with its output forwarded to logging, unless a JVM already runs.

    Returns whether it started one. A JVM started earlier in this process (by another task of a
    ``dag.test()`` or by the user) keeps its output as it was."""
    from subprocess import PIPE

    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:  # an RLock, also taken by _ensure_initialized
        if SparkContext._gateway is not None:
            return False
        gateway = launch_gateway(conf, popen_kwargs={"stdout": PIPE, "stderr": PIPE})  # type: ignore[no-untyped-call]
        proc = gateway.proc  # None when PYSPARK_GATEWAY_PORT names a JVM started elsewhere
        if proc is not None:
            for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                threading.Thread(target=_forward, args=(stream,), name=f"kafka2pc-jvm-{name}", daemon=True).start()
        SparkContext._ensure_initialized(gateway=gateway, conf=conf)
    return proc is not None
