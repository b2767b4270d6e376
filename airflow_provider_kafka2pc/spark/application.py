"""The export as a call any Spark application makes: spark-submit (client or cluster mode), a
managed job, a notebook; its driver need not be the Airflow task (DESIGN §16).

``export_from_application`` prepares a DataFrame with the export task's own job
(``spark.job.export_dataframe``: materialized first, the window budget, one transaction per Spark
partition, digests for repairs) between the same Kafka steps (the topic and ACL check, the run's
record, a recovery pass, the prefix claim, standing down if the run was decided meanwhile), then
hands the committables to the Airflow side through the decision topic (``txn.two_phase.handoff``)
instead of XCom. Airflow's ``Kafka2PCHandoffSensor`` accepts them; commit, abort and recovery
follow as for an export task.

Connection settings come from the call (``kafka_config``), or from the environment:
``KAFKA2PC_BOOTSTRAP_SERVERS`` and ``KAFKA2PC_CONFIG_FILE`` (librdkafka settings, one KEY=VALUE a
line, as ``kafka2pc --config-file`` reads them), never from Airflow. The run's identity is given by
the DAG: its id and run id (template ``{{ dag.dag_id }}`` and ``{{ run_id }}`` into the
application's arguments).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.kafka.config import properties_lines, redact
from airflow_provider_kafka2pc.txn.kafka.decision_topic_client import DEFAULT_DECISION_TOPIC
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

if TYPE_CHECKING:
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.protocol.handoff import Handoff

log = logging.getLogger(__name__)

ENV_BOOTSTRAP = "KAFKA2PC_BOOTSTRAP_SERVERS"
ENV_CONFIG_FILE = "KAFKA2PC_CONFIG_FILE"
ENV_DECISION_TOPIC = "KAFKA2PC_DECISION_TOPIC"


def export_from_application(
    df: Any,
    *,
    topic: str | None,
    transactional_id_prefix: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    kafka_config: Mapping[str, Any] | None = None,
    decision_topic: str | None = None,
    naming_strategy: str = "INCREMENTING",  # the only one: runs never share ids (POOLING is refused)
    transaction_timeout_ms: int | None = None,
    window: WindowSettings | None = None,
    attempt: str | None = None,
    writer: str = "auto",
    repairable: bool = True,
) -> Handoff | None:
    """Prepare ``df`` for run ``run_id`` of DAG ``dag_id`` and hand its transactions to Airflow.

    ``task_id`` names the task that submits the application (template ``{{ task.task_id }}``): the
    exporter ``transactional_id_prefix`` belongs to it, so a second task, or a second call in one
    application, that exports under the same prefix is refused by name instead of fencing the first.

    Returns the handoff, or None when the run had already reached its decision (a resubmission
    after the commit): nothing is then written, or what was written is aborted. ``attempt`` names
    this driver attempt (default: Spark's application id and attempt id). Raises as the export task
    does: the write job's failure, a window overrun, a refused topic or ACL, each after ending what
    it opened."""
    from airflow_provider_kafka2pc.spark.job import export_run
    from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
    from airflow_provider_kafka2pc.txn.protocol.handoff import Handoff, check_attempt
    from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
    from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
    from airflow_provider_kafka2pc.txn.two_phase.handoff import hand_off
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession
    from airflow_provider_kafka2pc.txn.two_phase.recovery import recover_until_clear

    prefix = naming.validate_prefix(transactional_id_prefix)
    strategy = naming.NamingStrategy(naming_strategy)
    if strategy is not naming.NamingStrategy.INCREMENTING:
        # POOLING ids are shared by every run: runs must take turns, which only the DAG can arrange.
        raise Kafka2PCError(
            f"naming_strategy {strategy.value!r}: an application's export writes INCREMENTING ids (new ids every "
            "run), so that a run never fences another; POOLING needs the export task's turn-taking"
        )
    run = naming.decision_run_name(dag_id, run_id)
    run_key = naming.sanitize_run_key(run_id)
    attempt = check_attempt(attempt or attempt_of(df.sparkSession))
    tag = naming.attempt_tag(attempt)
    config = dict(kafka_config) if kafka_config is not None else config_from_environment()
    topic_name = decision_topic or os.environ.get(ENV_DECISION_TOPIC) or DEFAULT_DECISION_TOPIC
    log.info("kafka2pc: run %s of exporter %s, attempt %s, producer config %s", run, prefix, attempt, redact(config))
    with PrepareSession(KafkaClients(config, topic_name, timeout_s=30.0), prefix, run, run_key) as session:
        session.check_export_access(topic)
        status = session.run_status()
        if status is not None and status.status is not RunStatus.DECIDED:
            log.warning(
                "kafka2pc: run %s already reached its decision (%s): nothing exported", run, status.status.value
            )
            return None
        session.recover_first("run the application again in a few seconds")
        if session.run_status() is not None:
            log.warning("kafka2pc: run %s was rolled forward by recovery: nothing exported", run)
            return None
        session.claim(owner=f"{dag_id}.{task_id}")  # the submit task's, as an export task's is its own
        # Where the log stood once this attempt's own recovery pass had ended what earlier ones left:
        # an ABORT of the run after it is the abort task's (``aborted_since`` below).
        started = session.clients.decision_log().read_for(prefix, run)
        if attempt in started.handoffs.get((prefix, run), {}):
            raise Kafka2PCError(
                f"attempt {attempt!r} already handed off run {run} of exporter {prefix!r}: one export per exporter and "
                "run. Give the second export a transactional id prefix of its own"
            )
        settings = ExportSettings(
            transactional_id_prefix=prefix,
            producer_config=config,
            topic=topic,
            naming_strategy=strategy,
            run_key=run_key,
            attempt_tag=tag,  # ids of its own: no attempt fences another
            transaction_timeout_ms=transaction_timeout_ms,
            writer=writer,
            repairable=repairable,
        )
        this_attempts = naming.Members(prefix, strategy, run_key, tag)

        def abort_now() -> bool:
            # Only what this attempt opened: another attempt's may be the one being committed.
            return recover_until_clear(lambda: session.recover(owns=this_attempts.owns))[0]

        result = export_run(session, df, settings, window=window, abort_opened=abort_now)
        now = session.clients.decision_log().read_for(prefix, run)
        if now.run_status(prefix, run) is not None or now.aborted_since(run, started.end_offset):
            # Decided while this attempt wrote (a second export), or aborted by the run's abort task
            # (the submit or the sensor gave up on it): nothing of it may stay open.
            log.warning("kafka2pc: run %s was decided while this attempt wrote: aborting its transactions", run)
            session.abort(result.committables)
            return None
        handoff = Handoff(
            prefix, run, attempt, strategy, run_key, result.committables, result.summary(), int(time.time() * 1000)
        )
        if not hand_off(session.clients.decision_log(), handoff):
            # Decided between the check above and the handoff; the commit's pass over the run's ids
            # aborts what this attempt prepared, or the next recovery does.
            log.warning("kafka2pc: run %s was decided while this attempt handed off: it is not the run's", run)
            return None
        return handoff


def config_from_environment() -> dict[str, Any]:
    """Client settings from ``KAFKA2PC_BOOTSTRAP_SERVERS`` and ``KAFKA2PC_CONFIG_FILE``."""
    config: dict[str, Any] = {}
    path = os.environ.get(ENV_CONFIG_FILE)
    if path:
        try:
            lines = properties_lines(path)
        except OSError as e:
            raise Kafka2PCError(f"cannot read {ENV_CONFIG_FILE}={path}: {e.strerror}") from None
        for where, line in lines:
            key, sep, value = line.partition("=")
            if not sep or not key.strip():  # never echo the line: it may be a bare password
                raise Kafka2PCError(f"{where}: expected KEY=VALUE")
            config[key.strip()] = value.strip()
    bootstrap = os.environ.get(ENV_BOOTSTRAP)
    if bootstrap:
        config["bootstrap.servers"] = bootstrap
    if not config.get("bootstrap.servers"):
        raise Kafka2PCError(
            f"no Kafka to export to: pass kafka_config, or set {ENV_BOOTSTRAP} (and {ENV_CONFIG_FILE} for the "
            "security settings) in the application's environment"
        )
    return config


def attempt_of(spark: Any) -> str:
    """This driver attempt's name: Spark's application id and attempt id (YARN restarts a driver
    under the same application id and the next attempt id; a resubmission gets a new application id)."""
    app = spark.conf.get("spark.app.id", None) or f"session-{uuid.uuid4().hex[:12]}"
    number = spark.conf.get("spark.app.attempt.id", None) or "1"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{app}.{number}")[:120]


__all__ = ["config_from_environment", "export_from_application"]
