"""The DAG run as the coordinator of a run's transactions, named as the decision log names it.

Operators and the recovery sensor both need this name; it lives here so that neither imports the
other's package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import Context


def decision_run(context: Context) -> str:
    """The run as the decision log names it: one DAG run, whichever task writes."""
    from airflow_provider_kafka2pc.txn.protocol.naming import decision_run_name

    return decision_run_name(context["dag"].dag_id, context["run_id"])
