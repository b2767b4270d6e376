"""Run in a subprocess: prepare many transactions, or be one actor of the decision protocol.

Tests kill these processes (SIGKILL of the process group) at chosen moments; what they print on
stderr (INFO logs) tells the test where the process is. Exit status: 0 done, 10 the decision log
ruled against this actor (DecisionConflictError), 11 a loss (TransactionLostError), 12 the run aborted
whole because part of it could no longer commit (RunAbortedError), 13 the Kafka source's snapshot
refused (SourceError).

    prepare --prefix P --count N --records R --topic T [--hold-ms H]   committables as JSON lines on stdout
            [--source-topic S --source-group G --range-out FILE]
    commit  --run R --committables FILE [--stall-after-ends K] [--hold-before-decision-ms MS] [--source-range FILE]
            [--await-committables] [--pause-after-decision] [--hold-after-decision-ms MS]
    recover --prefix P --run R
    abort   --prefix P --run R --committables FILE [--hold-ms H] [--pause-after-decision]

--await-committables starts a commit before its prepare: it connects, makes its decision topic,
says "awaiting" and waits for FILE to appear (tests write it by rename), so that a short broker cap
is not spent on the commit process's start-up.

--hold-ms keeps the process inside its work a while, so that a kill lands there: a prepare holds
half-way through its records, flushed, its transactions open ("holding" on stderr), an abort right
after its decision is appended ("decided").

With --source-topic and --source-group a prepare is a Kafka-sourced export's, in the operator's
order: the range (the group's stable offsets to the last stable offsets) written to --range-out,
the offsets participant's id initialised, the data transactions, then the range's ends sent into
the offsets participant, whose committable comes last. A commit given that range (--source-range)
passes it and the group's guard as the commit operator does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import SourceError
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
from airflow_provider_kafka2pc.txn.protocol.record_digest import RecordDigest
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared, commit_prepared, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.recovery import recover
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from airflow_provider_kafka2pc.txn.two_phase.source_guard import SourceGuard
from tests.helpers.actors import PROTOCOL_ERRORS, report_exit


def prepare(conf: dict[str, str], args: argparse.Namespace) -> int:
    read, offsets = None, None
    if args.source_topic:
        from airflow_provider_kafka2pc.txn.kafka.offsets_writer import OffsetsWriter
        from airflow_provider_kafka2pc.txn.kafka.source_snapshot import KafkaSourceSpec, snapshot_source

        try:
            read = snapshot_source(conf, KafkaSourceSpec(args.source_group, topics=(args.source_topic,)))
        except SourceError as e:
            return report_exit(e)
        with open(args.range_out, "w") as f:
            json.dump(read.to_dict(), f)
        if read.moves:  # as the operator: a run with nothing new opens no offsets participant
            tid = naming.transactional_id(args.prefix, naming.OFFSETS_SLOT)
            offsets = OffsetsWriter(conf, tid, args.timeout_ms, id_prefix=args.prefix).open()

    def one(slot: int) -> Committable:
        tid, tag = naming.transactional_id(args.prefix, slot), args.tag or args.prefix
        return write_slot(conf, tid, args.topic, tag, slot, args.records, args.timeout_ms, args.hold_ms)

    with ThreadPoolExecutor(8) as pool:
        for c in pool.map(one, range(args.count)):
            print(c.to_json(), flush=True)
    if offsets is not None and read is not None:
        from airflow_provider_kafka2pc.operators.kafka_source import send_offsets

        # On a failure the data transactions stay open for the abort task, as the harness runs it.
        print(send_offsets(offsets, read, abort_now=lambda: False).to_json(), flush=True)
    return 0


def write_slot(
    conf: dict[str, str],
    tid: str,
    topic: str,
    tag: str,
    slot: int,
    records: int,
    timeout_ms: int | None,
    hold_ms: int = 0,
    value_prefix: str = "value",
    hold_until: str = "",
) -> Committable:
    """One slot's records (keys ``TAG/slot/i``) in transaction ``tid``, prepared, with the digest of
    its keys and values, as the exporter's writer records it. ``hold_ms`` holds half-way through,
    flushed, the transaction open ("holding" on stderr); ``hold_until``, until that file exists."""
    w = TransactionalWriter(conf, tid, timeout_ms).open()
    digest = RecordDigest()
    for i in range(records):
        key, value = f"{tag}/{slot}/{i}".encode(), f"{value_prefix}-{slot}-{i}".encode()
        w.produce(topic, value, key)
        digest.add(key, value)
        if (hold_ms or hold_until) and i == (records - 1) // 2:  # half written, on the broker, the transaction open
            w.flush_and_verify()
            print(f"holding {slot}", file=sys.stderr, flush=True)
            time.sleep(hold_ms / 1000)
            while hold_until and not os.path.exists(hold_until):
                time.sleep(0.01)
    c = w.prepare()
    assert c is not None
    return dataclasses.replace(c, digest=digest.text())


def source_of(
    args: argparse.Namespace, committables: list[Committable]
) -> tuple[SourceGuard | None, dict[str, SourceRange] | None]:
    """The commit operator's guard and ``sources=`` for a range whose offsets participant is handed."""
    if not args.source_range:  # not a sourced export's commit (which may then have no --prefix)
        return None, None
    tid = naming.transactional_id(args.prefix, naming.OFFSETS_SLOT)
    offsets = next((c for c in committables if c.transactional_id == tid), None)
    if offsets is None:
        return None, None
    with open(args.source_range) as f:
        read = SourceRange.from_dict(json.load(f))
    return SourceGuard({"bootstrap.servers": args.bootstrap}, [(read, offsets)]), {args.prefix: read}


def hold_before_decision(log: DecisionLog, hold_ms: int) -> None:
    """Make this process's decision log say "deciding" and hold ``hold_ms`` before each decision it
    appends: a SIGKILL then lands before the decision, whatever the machine's speed."""
    decide = log.decide

    def hold_then_decide(*args: Any, **kwargs: Any) -> Any:
        print("deciding", file=sys.stderr, flush=True)
        time.sleep(hold_ms / 1000)
        return decide(*args, **kwargs)

    log.decide = hold_then_decide  # type: ignore[method-assign]


def hold_after_decision(log: DecisionLog, hold_ms: int) -> None:
    """Make this process's decision log hold ``hold_ms`` after each decision it appends."""
    decide = log.decide

    def decide_then_hold(*args: Any, **kwargs: Any) -> Any:
        state = decide(*args, **kwargs)
        print("decided", file=sys.stderr, flush=True)
        time.sleep(hold_ms / 1000)
        return state

    log.decide = decide_then_hold  # type: ignore[method-assign]


def pause_after_decision(log: DecisionLog) -> None:
    """Make this process stop itself (SIGSTOP, a real pause: a VM or GC freeze, a black-holed host)
    right after its decision is read back, before its first EndTxn; the test resumes it with SIGCONT
    once other actors have moved on. "paused" on stderr says it is about to stop."""
    _pause_after(log, "decide")


def pause_after_read(log: DecisionLog) -> None:
    """As ``pause_after_decision``, right after the process's first read of the log (a commit: before
    it looks at its transactions), the pause holding what it read."""
    _pause_after(log, "read", once=True)


def _pause_after(log: DecisionLog, method: str, once: bool = False) -> None:
    call = getattr(log, method)
    paused: list[bool] = []

    def call_then_pause(*args: Any, **kwargs: Any) -> Any:
        answer = call(*args, **kwargs)
        if not (once and paused):
            paused.append(True)
            print("paused", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        return answer

    setattr(log, method, call_then_pause)


def await_file(log: DecisionLog, path: str) -> None:
    log.ensure_topic()
    print("awaiting", file=sys.stderr, flush=True)
    while not os.path.exists(path):
        time.sleep(0.005)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["prepare", "commit", "recover", "abort"])
    ap.add_argument("--tag", default="", help="prepare: keys are TAG/slot/i (default: the prefix)")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--decision-topic", default="kafka2pc_decisions")
    ap.add_argument("--prefix")
    ap.add_argument("--run", default="run")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--records", type=int, default=10)
    ap.add_argument("--topic")
    ap.add_argument("--timeout-ms", type=int, default=None)
    ap.add_argument("--hold-ms", type=int, default=0)
    ap.add_argument("--committables")
    ap.add_argument("--await-committables", action="store_true")
    ap.add_argument("--max-workers", type=int, default=16)
    ap.add_argument("--stall-after-ends", type=int, default=None)
    ap.add_argument("--hold-before-decision-ms", type=int, default=0)
    ap.add_argument("--pause-after-decision", action="store_true")
    ap.add_argument("--pause-after-read", action="store_true")
    ap.add_argument("--hold-after-decision-ms", type=int, default=0)
    ap.add_argument("--decision-timeout", type=float, default=30.0)
    ap.add_argument("--end-txn-timeout", type=float, default=60.0)
    ap.add_argument("--source-topic", default="", help="prepare: a Kafka-sourced export's, reading this topic")
    ap.add_argument("--source-group", default="")
    ap.add_argument("--range-out", default="", help="prepare: where the source's range is written (JSON)")
    ap.add_argument("--source-range", default="", help="commit: the range its prepare wrote")
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("airflow_provider_kafka2pc").setLevel(logging.INFO)
    conf = {"bootstrap.servers": args.bootstrap}
    if args.action == "prepare":
        return prepare(conf, args)
    wire, log = WireClient(conf), DecisionLog(conf, topic=args.decision_topic, timeout_s=args.decision_timeout)
    try:
        if args.pause_after_decision:  # a commit, an abort or a recovery that decides
            pause_after_decision(log)
        if args.pause_after_read:
            pause_after_read(log)
        if args.hold_after_decision_ms:  # "decided", then a hold: a black hole lands before the first EndTxn
            hold_after_decision(log, args.hold_after_decision_ms)
        if args.action == "recover":
            result = recover(wire, args.prefix, log, run=args.run)
            print(json.dumps({"done": result.done, "summary": result.describe()}), flush=True)
            return 0
        if args.await_committables:
            await_file(log, args.committables)
        with open(args.committables) as f:
            committables = [Committable.from_json(line) for line in f if line.strip()]
        if args.action == "abort":  # the abort task: XCom committables plus what is open of the prefix
            if args.hold_ms:
                hold_after_decision(log, args.hold_ms)
            refs = {c.transactional_id: ref_of(c) for c in committables}
            refs.update(
                (s.transactional_id, ref_of(s)) for s in TransactionInspector(wire).describe_prefix(args.prefix)
            )
            report = abort_prepared(list(refs.values()), wire, log, args.run)
            print(json.dumps({"resolutions": len(report.resolutions)}), flush=True)
            return 0
        if args.hold_before_decision_ms:
            hold_before_decision(log, args.hold_before_decision_ms)
        guard, sources = source_of(args, committables)
        if args.stall_after_ends is None:
            report = commit_prepared(
                committables,
                wire,
                log,
                args.run,
                max_workers=args.max_workers,
                end_txn_timeout_s=args.end_txn_timeout,
                guard=guard,
                sources=sources,
            )
            print(json.dumps({"resolutions": len(report.resolutions), "note": report.note}), flush=True)
            return 0
        # Decide, end only the first K transactions, then hang until the test kills us.
        decide_commit(
            committables, wire, log, args.run, end_txn_timeout_s=args.end_txn_timeout, guard=guard, sources=sources
        )
        TransactionResolver(wire).resolve([ref_of(c) for c in committables[: args.stall_after_ends]], Intent.COMMIT)
        print("stalled", file=sys.stderr, flush=True)
        time.sleep(3600)
        return 0
    except PROTOCOL_ERRORS as e:
        return report_exit(e)


if __name__ == "__main__":
    sys.exit(main())
