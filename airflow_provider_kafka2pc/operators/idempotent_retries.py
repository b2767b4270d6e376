"""Retries by default for the tasks every try of which is idempotent: the recovery sensor and the
abort. A try can fail with nothing wrong with it: Airflow 3.3 fails tasks on a loaded machine ("...
but the task instance's state attribute is queued|running" in the scheduler's log: a worker whose
task start the api-server answered too late, or a trigger that resumed the task before the
scheduler read how the deferring process ended; apache/airflow#67287, #72716), and a try whose
worker host died is failed once its heartbeat is stale. A recovery pass, or an abort that skips
itself when every export succeeded, then runs again instead of failing the DAG run (issues 37 and
38; docs/runbook.md). Retries given to the task, ``default_args`` included, win."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

IDEMPOTENT_RETRIES = 2
IDEMPOTENT_RETRY_DELAY = timedelta(seconds=5)


def idempotent_retries(retries: int | None, retry_delay: timedelta | float | None) -> dict[str, Any]:
    """The operator's ``retries`` and ``retry_delay``: the given ones (Airflow fills them from
    ``default_args`` before the operator's own ``__init__`` sees them), else these defaults."""
    return {
        "retries": IDEMPOTENT_RETRIES if retries is None else retries,
        "retry_delay": IDEMPOTENT_RETRY_DELAY if retry_delay is None else retry_delay,
    }
