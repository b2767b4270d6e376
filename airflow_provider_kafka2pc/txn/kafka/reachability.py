"""Can this client reach Kafka, and if not, why: the one diagnosis behind every "cannot reach Kafka".

The Test button, the CLI, the exporters page and the tasks all ask ``check_connection`` before their
first Kafka client, and all say the same thing when it fails. librdkafka knows the cause (kafka-python
says only "Unable to bootstrap" once its deadline has passed, and a librdkafka request only "Local:
Timed out") but tells it through its error callback, one line per failed connect; ``check_reachable``
listens there while it asks for metadata in short steps, and answers:

- at once, for a refused login (``KafkaAuthenticationError``) or certificate (``KafkaTlsError``);
- as soon as every bootstrap broker has refused the connection or failed to resolve, and kept doing
  so for ``_GRACE_S`` (a name may resolve to several addresses, tried in turn);
- at the connect timeout otherwise: no answer, with whatever librdkafka said meanwhile.

One message builder (``unreachable_message``) words it for every caller, with the address and the
cause; secrets never reach it (librdkafka's texts are scrubbed of every secret value of the config).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import describe_identity
from airflow_provider_kafka2pc.txn.kafka.config import connection_only, kafka_python_settings
from airflow_provider_kafka2pc.txn.kafka.errors import KafkaAuthenticationError, KafkaTlsError
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError

# How long a client waits to connect, unless the connection says otherwise (its connect_timeout_s).
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_STEP_S = 0.25  # one metadata request: the error callback is served between steps
# After every bootstrap broker has refused or failed to resolve: the probe retries every 0.1-0.5 s,
# so within this grace each address a name resolves to is tried and a broker that is up is found.
_GRACE_S = 1.0
_PROBE_SETTINGS: dict[str, Any] = {"reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 500, "log_level": 0}
_DEFAULT_PORT = 9092

REFUSED = "connection refused (is a broker listening on that port?)"
# A broker that is up accepts a TCP connection in milliseconds; once one has, the others get this long.
_LAGGARD_GRACE_S = 0.5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failure:
    """One failed connect to one broker, as librdkafka's error callback told it."""

    address: str  # "host:port", as the bootstrap list names it
    cause: str  # worded for the user: REFUSED, "the host name h could not be resolved (...)", or librdkafka's
    definite: bool  # refused or not resolved: nothing answers there, however long we wait


# "127.0.0.1:19999/bootstrap: Connect to ipv4#127.0.0.1:19999 failed: Connection refused (after 0ms ...)"
# "sasl_ssl://b:9093/1: Failed to resolve 'b:9093': Name or service not known (after 1ms ...)"
_BROKER_TEXT = re.compile(r"^(?:[a-z_]+://)?(?P<address>\S+?)/(?:bootstrap|\d+): (?P<text>.*)$", re.DOTALL)
_RESOLVE_TEXT = re.compile(r"Failed to resolve '(?P<host>.*?)(?::\d+)?': (?P<why>.*)$", re.DOTALL)
_TIMING = re.compile(r" \(after \d+ms in state [A-Z_]+(?:, \d+ identical error\(s\) suppressed)?\)")


def failure_of(text: str) -> Failure | None:
    """The broker and the cause of one librdkafka connection error; None for a text about no one
    broker ("1/1 brokers are down")."""
    match = _BROKER_TEXT.match(without_timing(text))
    if match is None:
        return None
    address, detail = match["address"], match["text"]
    if "Connection refused" in detail:
        return Failure(address, REFUSED, True)
    resolve = _RESOLVE_TEXT.search(detail)
    if resolve is not None:
        return Failure(address, f"the host name {resolve['host']} could not be resolved ({resolve['why']})", True)
    return Failure(address, detail, False)


def _detail(text: str) -> str:
    """librdkafka's text without its broker prefix ("sasl_ssl://b:9093/bootstrap: ")."""
    match = _BROKER_TEXT.match(text)
    return text if match is None else match["text"]


def bootstrap_addresses(bootstrap: str) -> list[str]:
    """The bootstrap list as librdkafka names its brokers: host:port, a port-less host on 9092."""
    addresses = []
    for entry in bootstrap.split(","):
        entry = re.sub(r"^[a-z_]+://", "", entry.strip(), flags=re.IGNORECASE)
        if entry:
            has_port = re.search(r"(?::\d+)$", entry) and (not entry.startswith("[") or "]:" in entry)
            addresses.append(entry if has_port else f"{entry}:{_DEFAULT_PORT}")
    return addresses


def answering_bootstrap(servers: Sequence[str], timeout_s: float) -> list[str]:
    """The bootstrap servers that accept a TCP connection, asked all at once, in the given order; all
    of them when none does (the client's own error then says why). An entry this cannot read as a
    host and a port (a bare IPv6 literal) is kept without being asked.

    kafka-python bootstraps from one server picked at random and gives that one connect its whole
    bootstrap deadline, so a host that drops packets (cut off the network, powered down) failed the
    commit side's client while the other brokers answered (measured on the emulated cluster). Waits
    ``timeout_s`` at most, and ``_LAGGARD_GRACE_S`` for the others once one has answered."""
    if len(servers) < 2:
        return list(servers)
    answered: dict[int, bool] = {}  # by position: a server listed twice is asked twice
    done = threading.Condition()

    def knock(index: int, address: tuple[str, int] | None) -> None:
        ok = True  # not asked: kept
        if address is not None:
            try:
                socket.create_connection(address, timeout=timeout_s).close()
            except OSError:
                ok = False
        with done:
            answered[index] = ok
            done.notify_all()

    for index, server in enumerate(servers):
        args = (index, _knock_address(server))
        threading.Thread(target=knock, args=args, daemon=True, name="kafka2pc-bootstrap-knock").start()
    deadline = time.monotonic() + timeout_s
    with done:
        while len(answered) < len(servers) and time.monotonic() < deadline:
            if any(answered.values()):
                deadline = min(deadline, time.monotonic() + _LAGGARD_GRACE_S)
            done.wait(max(0.0, deadline - time.monotonic()))
        up = [s for i, s in enumerate(servers) if answered.get(i)]
    if not up:
        return list(servers)
    if len(up) < len(servers):
        log.info(
            "bootstrap servers %s did not accept a connection; the commit side's client starts from %s",
            ", ".join(s for i, s in enumerate(servers) if not answered.get(i)),
            ", ".join(up),
        )
    return up


def _knock_address(server: str) -> tuple[str, int] | None:
    """(host, port) of one bootstrap entry, or None where it is not plainly that."""
    entry = re.sub(r"^[a-z_]+://", "", server.strip(), flags=re.IGNORECASE)
    if not entry or (entry.count(":") > 1 and not entry.startswith("[")):
        return None  # empty, or a bare IPv6 literal, which bootstrap_addresses would split wrongly
    host, _, port = bootstrap_addresses(entry)[0].rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def unreachable_message(bootstrap: str, timeout_s: float, failures: Sequence[Failure]) -> str:
    """The one wording of "cannot reach Kafka": the address and the cause of each failed broker, or
    no answer within the timeout (with the last thing librdkafka said, if anything)."""
    head = f"cannot reach Kafka at {bootstrap}"
    addresses = bootstrap_addresses(bootstrap)
    latest = {f.address: f for f in failures}  # the last failure of each broker
    if not latest:
        return f"{head}: no answer within {timeout_s:g} s (timed out)"
    # Each broker in bootstrap order (then any other librdkafka named); one that said nothing: no answer.
    named = [*addresses, *(a for a in latest if a not in addresses)]
    causes = [(a, latest[a].cause if a in latest else "no answer") for a in named]
    if len(causes) == 1:
        [(_, cause)] = causes
        return f"{head}: {cause}" if latest[named[0]].definite else f"{head}: no answer within {timeout_s:g} s; {cause}"
    listed = "; ".join(f"{a}: {cause}" for a, cause in causes)
    if all(a in latest and latest[a].definite for a in named):
        return f"{head}: {listed}"
    return f"{head}: no broker answered within {timeout_s:g} s: {listed}"


def check_reachable(
    config: Mapping[str, Any], timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, patient: bool = False
) -> None:
    """Return once a broker has answered a metadata request; raise at once for a refused login
    (``KafkaAuthenticationError``, naming mechanism and principal) or certificate (``KafkaTlsError``),
    soon for a bootstrap list that refuses or does not resolve, else after ``timeout_s``
    (``BrokerUnavailableError``, worded by ``unreachable_message``). ``patient`` (the tasks): a
    refused or unresolved broker is asked again until ``timeout_s``, as a restarting broker or a
    pod's DNS record coming back answer within it; a person at the Test button or the CLI is told at
    once."""
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    probe: dict[str, Any] = {**connection_only(config), **_PROBE_SETTINGS, "error_cb": errors.append}
    # Only this list holds the client, and _ask returns its error rather than raising it (a traceback
    # would hold the client too): the thread _destroy_later starts drops the last reference.
    holder = [AdminClient(probe)]
    try:
        error = _ask(holder, errors, config, timeout_s, patient)
    finally:
        _destroy_later(holder)
    if error is not None:
        raise error


def _ask(
    holder: list[Any], errors: list[Any], config: Mapping[str, Any], timeout_s: float, patient: bool
) -> Exception | None:
    """Ask for metadata in short steps, reading the error callback between them: None once a broker
    answered, else the error to raise (see ``check_reachable``)."""
    from confluent_kafka import KafkaError, KafkaException

    bootstrap = str(config.get("bootstrap.servers", ""))
    wanted = set(bootstrap_addresses(bootstrap))
    failures: list[Failure] = []
    deadline = time.monotonic() + timeout_s
    all_failed_at: float | None = None
    while (now := time.monotonic()) < deadline:
        try:
            holder[0].list_topics(timeout=min(_STEP_S, max(0.05, deadline - now)))
            return None
        except KafkaException:
            pass  # what went wrong comes through the error callback
        holder[0].poll(0)
        for err in errors:
            text = without_timing(_without_secrets(err.str(), config))  # the same words every time
            if err.code() == KafkaError._AUTHENTICATION:
                return KafkaAuthenticationError(
                    f"authentication failed: {describe_identity(config)} at {bootstrap}: {_detail(text)}"
                )
            if err.code() == KafkaError._SSL and not _transient_tls_failure(text):
                return KafkaTlsError(_tls_message(config, text))
            failure = failure_of(text)
            if failure is not None:
                failures.append(failure)
        errors.clear()
        latest = {f.address: f for f in failures}
        if not patient and wanted and all(a in latest and latest[a].definite for a in wanted):
            all_failed_at = all_failed_at or time.monotonic()
            if time.monotonic() - all_failed_at >= _GRACE_S:
                break
        else:
            all_failed_at = None
    return BrokerUnavailableError(unreachable_message(bootstrap, timeout_s, failures))


def _destroy_later(holder: list[Any]) -> None:
    """Destroy the probe client on a daemon thread: librdkafka's destroy waits for its broker threads,
    and one may sit in the system resolver for seconds (a name that does not resolve, asked again)."""
    threading.Thread(target=holder.clear, name="kafka2pc-reachability-probe", daemon=True).start()


def check_connection(
    config: Mapping[str, Any], timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, patient: bool = False
) -> None:
    """Before a command's or task's first Kafka client: is the config usable, and does a broker answer
    and let this principal in? Returns once a broker has answered, and raises:

    - ``config.ClientConfigError`` (a ``ValueError``): a setting kafka2pc cannot honour (turning
      certificate verification off, GSSAPI, ...); Kafka was not contacted. A configuration mistake.
    - ``KafkaAuthenticationError``: the broker refused the credentials (names mechanism and
      principal); ``KafkaTlsError``, a subclass: the TLS handshake failed (names the certificate
      problem and ``ssl.ca.location``). Within a second.
    - ``BrokerUnavailableError``: connection refused or a name not resolved, within a second or
      two (``patient``: after ``timeout_s``, if it still is); nothing answered, after ``timeout_s``.
    """
    kafka_python_settings(config)  # pure: refuses what the commit side's client cannot honour
    check_reachable(config, timeout_s, patient)


def without_timing(text: str) -> str:
    """librdkafka's "(after 9ms in state SSL_HANDSHAKE)" tail: repeated errors then read the same."""
    return _TIMING.sub("", text)


def _transient_tls_failure(text: str) -> bool:
    """A handshake cut short by the network (a broker going down), not refused: worth another try."""
    lowered = text.lower()
    return "disconnected" in lowered or "connection reset" in lowered or "timed out" in lowered


def _tls_message(config: Mapping[str, Any], text: str) -> str:
    ca = config.get("ssl.ca.location")
    if ca:
        where = f"ssl.ca.location is {ca}"
    elif config.get("ssl.ca.pem"):
        where = "ssl.ca.pem is set"
    else:
        where = "ssl.ca.location is not set, so the system's CA certificates were used"
    cause = without_timing(text)
    cause = cause.split("SSL handshake failed: ", 1)[-1]
    fix = (
        "set ssl.ca.location to the CA that signed the brokers' certificates"
        if "certificate verify failed" in cause
        else "check the TLS settings (ssl.*) against the broker's listener"
    )
    return (
        f"SSL handshake failed with Kafka at {config.get('bootstrap.servers')} ({describe_identity(config)}): "
        f"{cause}. {where}: {fix}"
    )


def _without_secrets(text: str, config: Mapping[str, Any]) -> str:
    from airflow_provider_kafka2pc.txn.kafka.config import REDACTED, is_secret_key

    for k, v in config.items():
        if is_secret_key(str(k)) and isinstance(v, str) and v:
            text = text.replace(v, REDACTED)
    return text


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "REFUSED",
    "Failure",
    "bootstrap_addresses",
    "check_connection",
    "check_reachable",
    "failure_of",
    "unreachable_message",
]
