"""Run in a subprocess on a broker with a short ``transaction.max.timeout.ms``: make runs that lose
transactions after their COMMIT, as a commit that died half-way does.

For each ``PREFIX:TOPIC`` given: prepare ``--txns`` transactions into TOPIC (``phase_two.write_slot``: keys
``PREFIX/slot/i``, with their digests), append the run's COMMIT, end the first ``--txns - --lost``
of them, and leave the rest open. Once every prefix is there it says "stalled" and hangs; the test
SIGKILLs it, and the broker aborts what is open at its cap. The next recovery records each run LOST.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import TransactionLostError
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase.coordinator import Decided, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.helpers.phase_two import write_slot


def record_lost(config: dict[str, Any], decisions: str, prefixes: Iterable[str], run: str, cap_ms: int) -> None:
    """Once the broker has aborted what each prefix left open at its cap (waited for: listed no
    more, however long its abort check takes on a slow day), each prefix's next recovery fails on
    the loss and records ``run`` LOST (asserted)."""
    from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector

    prefixes = list(prefixes)
    log = DecisionLog(config, topic=decisions)
    with WireClient(config) as wire:
        inspector = TransactionInspector(wire)
        time.sleep(cap_ms / 1000)  # nothing is aborted before the cap: no need to ask sooner
        deadline = time.monotonic() + 300
        while open_ := [t.transactional_id for p in prefixes for t in inspector.list_prefix(p)]:
            assert time.monotonic() < deadline, f"the broker did not abort {open_} at its cap"
            time.sleep(0.5)
        for prefix in prefixes:
            with pytest.raises(TransactionLostError):
                recover(wire, prefix, log, run="next")
            assert log.read_for(prefix, run).runs[(prefix, run)].status is RunStatus.LOST
    log.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", metavar="PREFIX:TOPIC")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--decision-topic", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--txns", type=int, required=True)
    ap.add_argument("--lost", type=int, required=True)
    ap.add_argument("--records", type=int, required=True)
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    conf = {"bootstrap.servers": args.bootstrap}
    log = DecisionLog(conf, topic=args.decision_topic, timeout_s=2)
    log.ensure_topic()
    wire = WireClient(conf)

    def lose(prefix: str, topic: str) -> None:
        def one(slot: int) -> Committable:
            tid = naming.transactional_id(prefix, slot)
            return write_slot(conf, tid, topic, prefix, slot, args.records, None)

        with ThreadPoolExecutor(args.txns) as slots:  # the first record's age at the decision is one slot's time
            cs = list(slots.map(one, range(args.txns)))
        decided = decide_commit(cs, wire, log, args.run, end_txn_timeout_s=2)
        assert isinstance(decided, Decided), decided
        TransactionResolver(wire).resolve([ref_of(c) for c in cs[: args.txns - args.lost]], Intent.COMMIT)
        print(f"stalled {prefix}", file=sys.stderr, flush=True)

    for run in args.runs:  # one run at a time: each must decide within the cap of its first record
        lose(*run.split(":"))
    print("stalled", file=sys.stderr, flush=True)
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
