"""One HTTP exchange with the registry under ONE deadline: connect, headers and body together.

``urllib``'s timeout bounds each socket read, not the request: a registry (or a proxy before it)
that sends a header every 2 s holds a 3 s timeout for as long as it likes (40 s was seen). Here a
watchdog timer shuts the request's socket down when the deadline passes, which wakes the blocked
read; a connect is given only the time that is left. Whatever status the registry answers is
returned as it came (the caller judges it); no answer in time, or none at all, is a
``RegistryUnreachableError``.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.registry import errors


@dataclass(frozen=True)
class Answer:
    """What the registry sent back, whatever its status."""

    url: str
    status: int
    content_type: str
    body: bytes
    elapsed_s: float


class Deadline:
    """A watchdog over the sockets of one request: shuts them down when ``seconds`` have passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._done = False
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def remaining(self) -> float:
        # Never 0: a socket timeout of 0 would make it non-blocking rather than end the request.
        return max(0.001, self._at - time.monotonic())

    def adopt(self, sock: socket.socket) -> None:
        """Watch ``sock`` (a redirect brings a second one); shut it at once if the time is up."""
        with self._lock:
            self._sock = sock
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            if self._sock is not None:
                _shut(self._sock)

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True


def _shut(sock: socket.socket) -> None:
    # shutdown (not close) wakes a read blocked in another thread; the owner closes the socket.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, *, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        # Over TLS the handshake's reads are bounded by the time left at connect; the watchdog takes
        # over once the socket is wrapped.
        self.timeout = self._deadline.remaining()
        super().connect()
        self._deadline.adopt(self.sock)


class _WatchedHTTPS(_WatchedHTTP, http.client.HTTPSConnection):
    """``_WatchedHTTP.connect`` around ``HTTPSConnection.connect`` (the TCP connect, then TLS)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = self._deadline

        def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            return _WatchedHTTP(host, deadline=deadline, **kwargs)

        return self.do_open(connection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._deadline, self._tls = deadline, context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = self._deadline

        def connection(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            return _WatchedHTTPS(host, deadline=deadline, **kwargs)

        return self.do_open(connection, req, context=self._tls)


def exchange(
    request: urllib.request.Request, timeout_s: float, context: ssl.SSLContext | None, base_url: str
) -> Answer:
    """Send ``request`` and read the whole answer within ``timeout_s``, or raise
    ``RegistryUnreachableError`` naming ``base_url`` (never the credentials)."""
    started = time.monotonic()
    with Deadline(timeout_s) as deadline:
        opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline, context))
        try:
            answer = _send(opener, request, deadline)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            if deadline.expired:
                raise errors.timed_out(base_url, request.get_method(), request.full_url, timeout_s) from None
            reason = getattr(e, "reason", e)
            raise errors.unreachable(base_url, f"{type(reason).__name__}: {reason}") from None
    # The watchdog may have ended a body that had no length: what was read is not the answer.
    if deadline.expired:
        raise errors.timed_out(base_url, request.get_method(), request.full_url, timeout_s)
    return Answer(answer[0], answer[1], answer[2], answer[3], time.monotonic() - started)


def _send(
    opener: urllib.request.OpenerDirector, request: urllib.request.Request, deadline: Deadline
) -> tuple[str, int, str, bytes]:
    try:
        with opener.open(request, timeout=deadline.seconds) as response:
            return request.full_url, int(response.status), response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as e:
        with e:
            content_type = e.headers.get("Content-Type", "") if e.headers is not None else ""
            return request.full_url, e.code, content_type, e.read()


__all__ = ["Answer", "Deadline", "exchange"]
