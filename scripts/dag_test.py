"""Run one DAG with ``dag.test()`` in this process and print the task states as JSON (last line).

Usage: python scripts/dag_test.py DAG_FILE DAG_ID [RUN_CONF_JSON]. The caller sets AIRFLOW_HOME and
the connections in the environment; a separate process keeps each run's Spark and Airflow apart.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from typing import Any


def run(path: str, dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
    """``dag.test()`` of ``dag_id`` in the DAG file at ``path``: the run, its task states and tries."""
    spec = importlib.util.spec_from_file_location("e2e_dag_module", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(d for d in vars(module).values() if getattr(d, "dag_id", None) == dag_id)
    started = time.monotonic()
    dag_run = dag.test(run_conf=conf)
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}
    tries = {ti.task_id: ti.try_number for ti in dag_run.get_task_instances()}
    return {
        "run_id": dag_run.run_id,
        "state": str(getattr(dag_run.state, "value", dag_run.state)),
        "tasks": states,
        "tries": tries,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    conf = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    print(json.dumps(run(sys.argv[1], sys.argv[2], conf)))


if __name__ == "__main__":
    main()
