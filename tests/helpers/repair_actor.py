"""Run in a subprocess: repair one LOST run, as ``kafka2pc repair`` does, with the slots written
again by ``phase_two.write_slot`` (the same keys and values as the run's prepare wrote). Tests kill
it (SIGKILL of its process group) at a point it announces on stderr:

    --hold-in-export-ms MS     "holding" with the first re-exported slot half written, open
    --hold-in-export-until F   the same, until file F exists
    --hold-after-decision-ms MS "decided" once the repair's COMMIT is appended, before any EndTxn
    --pause-after-decision      "paused", then SIGSTOP of itself, once the repair's COMMIT is read back
    --stall-after-ends K       "stalled" after the first K EndTxns of the repair's commit

``--export-after F`` and ``--decide-after F`` hold the actor ("planned", "exported" on stderr) until
file F exists: two repairs of one run then export, and decide, at the same moment (a race test).
``--change-slot S`` writes slot S with other values: the source changed since the run. Exit status:
0 done (the report's JSON on stdout), 10 a void decision (DecisionConflictError), 11 a loss,
14 refused (RepairRefusedError), 15 nothing lost (NotLostError).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
from airflow_provider_kafka2pc.txn.protocol.repair_lease import DEFAULT_TTL_MS
from airflow_provider_kafka2pc.txn.two_phase.repair import repair_lost_run
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from tests.helpers.actors import PROTOCOL_ERRORS, report_exit
from tests.helpers.phase_two import write_slot


def stall_commit_after(ends: int) -> None:
    """The repair's commit ends ``ends`` transactions, says "stalled" and hangs until killed."""
    resolve = TransactionResolver.resolve

    def stalling(self: TransactionResolver, refs: Sequence[Any], intent: Intent, *a: Any, **kw: Any) -> Any:
        if intent is not Intent.COMMIT:
            return resolve(self, refs, intent, *a, **kw)
        resolve(self, list(refs)[:ends], intent, *a, **kw)
        print("stalled", file=sys.stderr, flush=True)
        time.sleep(3600)

    TransactionResolver.resolve = stalling  # type: ignore[method-assign]


def await_file(path: str, say: str) -> None:
    print(say, file=sys.stderr, flush=True)
    while not os.path.exists(path):
        time.sleep(0.005)


def around_repair_decision(log: DecisionLog, hold_after_ms: int, decide_after: str, pause: bool = False) -> None:
    """Wait for ``decide_after`` before the repair's COMMIT is appended; hold after it, or stop
    (SIGSTOP, "paused" on stderr) until the test resumes it."""
    decide = log.decide

    def decide_then_hold(decision: Any, *args: Any, **kwargs: Any) -> Any:
        if decision.repairs is not None and decide_after:
            await_file(decide_after, "exported")
        state = decide(decision, *args, **kwargs)
        if decision.repairs is not None and hold_after_ms:
            print("decided", file=sys.stderr, flush=True)
            time.sleep(hold_after_ms / 1000)
        if decision.repairs is not None and pause:
            print("paused", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return state

    log.decide = decide_then_hold  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--decision-topic", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--tag", default="")
    ap.add_argument("--change-slot", type=int, default=None)
    ap.add_argument("--hold-in-export-ms", type=int, default=0)
    ap.add_argument("--hold-in-export-until", default="")
    ap.add_argument("--lease-ttl-ms", type=int, default=DEFAULT_TTL_MS)
    ap.add_argument("--hold-after-decision-ms", type=int, default=0)
    ap.add_argument("--pause-after-decision", action="store_true")
    ap.add_argument("--stall-after-ends", type=int, default=None)
    ap.add_argument("--export-after", default="")
    ap.add_argument("--decide-after", default="")
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("airflow_provider_kafka2pc").setLevel(logging.INFO)
    conf = {"bootstrap.servers": args.bootstrap}
    log = DecisionLog(conf, topic=args.decision_topic)
    if args.hold_after_decision_ms or args.decide_after or args.pause_after_decision:
        around_repair_decision(log, args.hold_after_decision_ms, args.decide_after, args.pause_after_decision)
    if args.stall_after_ends is not None:
        stall_commit_after(args.stall_after_ends)

    def export_again(plan: RepairPlan) -> list[Committable]:
        if args.export_after:
            await_file(args.export_after, "planned")

        def one(slot: int) -> Committable:
            first = slot == plan.slots[0]
            hold, until = (args.hold_in_export_ms, args.hold_in_export_until) if first else (0, "")
            value = "changed" if slot == args.change_slot else "value"
            tag = args.tag or args.prefix
            tid = plan.transactional_id(slot)
            return write_slot(conf, tid, args.topic, tag, slot, args.records, None, hold, value, until)

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, plan.slots))

    try:
        with WireClient(conf) as wire:
            report = repair_lost_run(wire, log, args.prefix, args.run, export_again, lease_ttl_ms=args.lease_ttl_ms)
        rec = report.record
        decision = rec.repair.decision_id if rec.repair is not None else None
        print(json.dumps({"status": rec.status.value, "now": report.repaired_now, "note": report.note,
                          "decision": decision}))  # fmt: skip
        return 0
    except PROTOCOL_ERRORS as e:
        return report_exit(e)
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
