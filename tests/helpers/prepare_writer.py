"""Run in a subprocess: write one transaction, prepare it, print the committable, exit.

The process exits without committing, aborting or closing the producer: the test then checks
that the transaction outlived it. Records come as JSON on stdin:
[{"topic": str, "key": str|null, "value": str|null, "headers": [[k, v], ...], "partition": int|null}, ...]
or {"generate": {"topic": str, "count": int, "key_prefix": str}}.
"""

from __future__ import annotations

import argparse
import json
import sys

from airflow_provider_kafka2pc.txn.kafka.writer import TransactionalWriter


def _b(v: str | None) -> bytes | None:
    return None if v is None else v.encode()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--tid", required=True)
    ap.add_argument("--timeout-ms", type=int, default=None)
    args = ap.parse_args()
    spec = json.load(sys.stdin)
    w = TransactionalWriter({"bootstrap.servers": args.bootstrap}, args.tid, args.timeout_ms).open()
    if isinstance(spec, dict):
        g = spec["generate"]
        for i in range(g["count"]):
            w.produce(g["topic"], f"value-{i}".encode(), f"{g['key_prefix']}{i}".encode())
    else:
        for r in spec:
            headers = [(k, _b(v)) for k, v in r.get("headers") or []]
            w.produce(r["topic"], _b(r.get("value")), _b(r.get("key")), r.get("partition"), headers)
    committable = w.prepare()
    print(committable.to_json() if committable else "null", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
