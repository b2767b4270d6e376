"""Waiting out what a retry may cure: a coordinator that moved or loads, a connection that dropped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from airflow_provider_kafka2pc.txn.kafka.errors import RetriableCoordinatorError, is_connection_error
from airflow_provider_kafka2pc.txn.protocol.errors import CoordinatorError

log = logging.getLogger(__name__)

T = TypeVar("T")


def retry(what: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
    """Run ``fn`` until it stops failing with retriable coordinator or connection errors."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            return fn()
        except RetriableCoordinatorError as e:
            last: Exception = e
        except Exception as e:
            if not is_connection_error(e):
                raise
            last = e
        if time.monotonic() + delay > deadline:
            raise CoordinatorError(f"{what}: gave up after {timeout_s:.0f} s: {last}") from last
        log.debug("%s: %s; retrying in %.2f s", what, last, delay)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


__all__ = ["retry"]
