"""The recovery sensor retries by default (issue 37): Airflow 3.3 can fail it with nothing wrong (a
task start the api-server answered too late, a trigger that resumed it before the scheduler read
how the deferring process ended), and a recovery pass is idempotent. A user's retries, given or
from default_args, win."""

from __future__ import annotations

from datetime import timedelta

import pendulum

from airflow_provider_kafka2pc.sensors.recovery import RESUME_RETRIES, RESUME_RETRY_DELAY, Kafka2PCRecoverySensor


def test_the_sensor_retries_by_default_so_a_resume_failed_by_the_scheduler_runs_again() -> None:
    sensor = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders")
    assert RESUME_RETRIES >= 1
    assert (sensor.retries, sensor.retry_delay) == (RESUME_RETRIES, RESUME_RETRY_DELAY)


def test_retries_given_to_the_sensor_win() -> None:
    sensor = Kafka2PCRecoverySensor(
        task_id="recover", transactional_id_prefix="orders", retries=0, retry_delay=timedelta(minutes=1)
    )
    assert (sensor.retries, sensor.retry_delay) == (0, timedelta(minutes=1))


def test_retries_from_the_dags_default_args_win() -> None:
    from airflow.sdk import DAG

    default_args = {"retries": 0, "retry_delay": timedelta(minutes=3)}
    with DAG("d", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), default_args=default_args):
        sensor = Kafka2PCRecoverySensor(task_id="recover", transactional_id_prefix="orders")
    assert (sensor.retries, sensor.retry_delay) == (0, timedelta(minutes=3))
