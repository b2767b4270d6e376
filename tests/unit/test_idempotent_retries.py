"""The recovery sensor and the abort retry by default (issues 37 and 38): Airflow 3.3 can fail a
try with nothing wrong (a task start the api-server answered too late, a trigger that resumed it
before the scheduler read how the deferring process ended), a try whose worker host died is failed
once its heartbeat is stale, and a recovery pass or an abort is idempotent. A user's retries, given
or from default_args, win."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
import pytest

from airflow_provider_kafka2pc.operators.commit import Kafka2PCAbortOperator
from airflow_provider_kafka2pc.operators.idempotent_retries import IDEMPOTENT_RETRIES, IDEMPOTENT_RETRY_DELAY
from airflow_provider_kafka2pc.sensors.recovery import Kafka2PCRecoverySensor


def _sensor(**kwargs: Any) -> Any:
    return Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders", **kwargs)


def _abort(**kwargs: Any) -> Any:
    return Kafka2PCAbortOperator(task_id="abort", export_task_ids="prepare", **kwargs)


IDEMPOTENT = pytest.mark.parametrize("make", [_sensor, _abort], ids=["recovery sensor", "abort"])


@IDEMPOTENT
def test_it_retries_by_default_so_a_try_failed_with_nothing_wrong_runs_again(make: Any) -> None:
    task = make()
    assert IDEMPOTENT_RETRIES >= 1
    assert (task.retries, task.retry_delay) == (IDEMPOTENT_RETRIES, IDEMPOTENT_RETRY_DELAY)


@IDEMPOTENT
def test_retries_given_to_it_win(make: Any) -> None:
    task = make(retries=0, retry_delay=timedelta(minutes=1))
    assert (task.retries, task.retry_delay) == (0, timedelta(minutes=1))


@IDEMPOTENT
def test_retries_from_the_dags_default_args_win(make: Any) -> None:
    from airflow.sdk import DAG

    default_args = {"retries": 0, "retry_delay": timedelta(minutes=3)}
    with DAG("d", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), default_args=default_args):
        task = make()
    assert (task.retries, task.retry_delay) == (0, timedelta(minutes=3))
