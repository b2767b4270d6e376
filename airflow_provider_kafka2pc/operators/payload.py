"""What an export task hands to the commit and abort tasks through XCom (JSON, no secrets)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError
from airflow_provider_kafka2pc.txn.protocol.record_digest import join_digest, split_digest
from airflow_provider_kafka2pc.txn.protocol.source_range import SourceRange

if TYPE_CHECKING:
    from airflow.sdk import Context

# Version 2 stores the committables column-wise with what the commit needs (version 1, a list of
# full committables with every partition, is still read): 4.6 KB for 8 x 8 partitions was several
# MB in the metadata database for 2,000 Spark partitions x 100 Kafka partitions.
PAYLOAD_VERSION = 2
# Version 3: an application's handoff, whose ids carry its driver attempt (``attempt_tag``); written
# only then, so that a commit of a version that cannot rebuild such ids refuses the XCom by name.
ATTEMPT_PAYLOAD_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# Pushed by an export that skipped itself (its run is already decided): not a failure to abort.
SKIPPED_KEY = "kafka2pc_skipped"
WRITE_RATE_KEY = "kafka2pc_write_rate"  # the write rate per slot a successful prepare showed


@dataclass(frozen=True)
class ExportPayload:
    conn_id: str
    prefix: str
    naming_strategy: str
    run_key: str | None
    delivery_guarantee: str
    committables: tuple[Committable, ...] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)
    source: SourceRange | None = None  # a Kafka source's range; its offsets participant is a committable
    attempt_tag: str | None = None  # an application's handoff: the ids' driver attempt

    def to_xcom(self) -> dict[str, Any]:
        return {
            **({"source": self.source.to_dict()} if self.source is not None else {}),
            "version": PAYLOAD_VERSION if self.attempt_tag is None else ATTEMPT_PAYLOAD_VERSION,
            **({"attempt_tag": self.attempt_tag} if self.attempt_tag is not None else {}),
            "conn_id": self.conn_id,
            "prefix": self.prefix,
            "naming_strategy": self.naming_strategy,
            "run_key": self.run_key,
            "delivery_guarantee": self.delivery_guarantee,
            "transactions": self._columns(),
            "summary": dict(self.summary),
        }

    def _columns(self) -> dict[str, Any]:
        """The committables column-wise: slots instead of ids (the id follows from prefix, naming
        and run key), and records per topic only when there is more than one topic."""
        topics = sorted({t for c in self.committables for t in c.counts_by_topic})
        index = {t: i for i, t in enumerate(topics)}
        slots = []
        for c in self.committables:
            parsed = naming.parse_transactional_id(c.transactional_id)
            if parsed is None or self._id(parsed.slot) != c.transactional_id:
                raise MalformedCommittableError(
                    f"committable {c.transactional_id!r} is not one of exporter {self.prefix!r}'s ids for this run"
                )
            slots.append(parsed.slot)
        columns: dict[str, Any] = {
            "topics": topics,
            "slots": slots,
            "producer_ids": [c.producer_id for c in self.committables],
            "producer_epochs": [c.producer_epoch for c in self.committables],
        }
        if len(topics) > 1:  # [topic index, records] pairs; a transaction's records are their sum
            columns["records_by_topic"] = [
                [[index[t], n] for t, n in sorted(c.counts_by_topic.items())] for c in self.committables
            ]
        else:
            columns["records"] = [c.records for c in self.committables]
        if any(c.digest for c in self.committables):  # what a repair of a lost transaction compares with
            columns["digests"] = pack_digests(self.committables)
        return columns

    def offsets_committable(self) -> Committable | None:
        """The committable of the run's offsets participant, with a Kafka source that moved."""
        tid = self._id(naming.OFFSETS_SLOT)
        return next((c for c in self.committables if c.transactional_id == tid), None)

    def _id(self, slot: int) -> str:
        strategy = naming.NamingStrategy(self.naming_strategy)
        return naming.transactional_id(self.prefix, slot, strategy, self.run_key, self.attempt_tag)

    @classmethod
    def from_xcom(cls, value: Any, task_id: str) -> ExportPayload:
        version = value.get("version") if isinstance(value, Mapping) else None
        if version not in READABLE_VERSIONS:
            raise MalformedCommittableError(
                f"XCom of export task {task_id!r} is not a kafka2pc export result (version "
                f"{', '.join(map(str, READABLE_VERSIONS))}): {str(value)[:200]}"
            )
        try:
            payload = cls(
                conn_id=str(value["conn_id"]),
                prefix=str(value["prefix"]),
                naming_strategy=str(value["naming_strategy"]),
                run_key=value.get("run_key"),
                delivery_guarantee=str(value["delivery_guarantee"]),
                summary=dict(value.get("summary") or {}),
                source=SourceRange.from_dict(value["source"]) if value.get("source") is not None else None,
                attempt_tag=None if value.get("attempt_tag") is None else str(value["attempt_tag"]),
            )
            if version == 1:
                committables = tuple(Committable.from_dict(c) for c in value["committables"])
            else:
                committables = payload._from_columns(value["transactions"])
        except (KeyError, TypeError, ValueError, IndexError, binascii.Error) as e:
            if isinstance(e, MalformedCommittableError):
                raise
            raise MalformedCommittableError(f"XCom of export task {task_id!r} lacks or mangles {e!r}") from e
        return replace(payload, committables=committables)

    def _from_columns(self, columns: Mapping[str, Any]) -> tuple[Committable, ...]:
        topics = [str(t) for t in columns["topics"]]
        slots, pids, epochs = columns["slots"], columns["producer_ids"], columns["producer_epochs"]
        if len(topics) > 1:
            by_topic = [{topics[i]: n for i, n in pairs} for pairs in columns["records_by_topic"]]
        else:
            by_topic = [{topics[0]: n} if topics else {} for n in columns["records"]]
        digests = unpack_digests(columns.get("digests"), [sum(c.values()) for c in by_topic])
        out = []
        for slot, pid, epoch, counts, digest in zip(slots, pids, epochs, by_topic, digests, strict=True):
            if isinstance(slot, bool) or not isinstance(slot, int):
                raise ValueError(f"slot {slot!r}")
            if any(isinstance(n, bool) or not isinstance(n, int) for n in counts.values()):
                raise ValueError(f"records {counts!r}")
            if slot == naming.OFFSETS_SLOT:  # the offsets participant holds no record of any topic
                counts = {}
            out.append(
                Committable.from_dict(
                    {
                        "transactional_id": self._id(slot),
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "records": sum(counts.values()),
                        "counts_by_topic": counts,
                        "digest": digest,
                    }
                )
            )
        return tuple(out)


def pack_digests(committables: Sequence[Committable]) -> Any:
    """The digests column: when all are of one scheme and count their transaction's records (what the
    Spark writer makes), the scheme and the sums as one base64 string of 8 bytes each (2,000
    transactions: 21 KB instead of 54); else each digest's text."""
    parsed = [split_digest(c.digest) if c.digest else None for c in committables]
    schemes = {p[0] for p in parsed if p is not None}
    if len(schemes) != 1 or any(p is None or p[1] != c.records for p, c in zip(parsed, committables, strict=True)):
        return [c.digest for c in committables]
    sums = b"".join(p[2].to_bytes(8, "big") for p in parsed if p is not None)
    return {"scheme": schemes.pop(), "sums": base64.b64encode(sums).decode()}


def unpack_digests(column: Any, records: Sequence[int]) -> list[str | None]:
    """The digests of ``pack_digests``'s column, for transactions of ``records`` records each."""
    if column is None:
        return [None] * len(records)
    if isinstance(column, list):
        return [None if d is None else str(d) for d in column]
    sums = base64.b64decode(column["sums"], validate=True)
    if len(sums) != 8 * len(records):
        raise ValueError(f"digests: {len(sums)} bytes for {len(records)} transactions")
    return [
        join_digest(str(column["scheme"]), n, int.from_bytes(sums[8 * i : 8 * i + 8], "big"))
        for i, n in enumerate(records)
    ]


def pull_exports(context: Context, task_ids: Sequence[str]) -> dict[str, ExportPayload | None]:
    """The payload of each export task of this run; None where the task pushed nothing (failed, skipped)."""
    ti = context["ti"]
    out: dict[str, ExportPayload | None] = {}
    for task_id in task_ids:
        value = ti.xcom_pull(task_ids=task_id, key="return_value")
        out[task_id] = None if value is None else ExportPayload.from_xcom(value, task_id)
    return out
