"""The committable: everything another process needs to finish a prepared transaction."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_kafka2pc.txn.protocol.errors import MalformedCommittableError

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Committable:
    """A prepared (flushed, not committed) Kafka transaction.

    What the commit needs is the id, producer id, epoch, record count and the records per topic.
    The writer also knows its bytes, partitions, first write and timeout; the export's XCom
    (payload version 2) leaves them out, so they are None/empty in a committable read from it:
    the partitions for messages come from the broker (DescribeTransactions), and so does the
    deadline. It carries no secrets and no connection settings: those come from the committing side.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    records: int
    bytes: int | None = None
    topic_partitions: tuple[TopicPartition, ...] = ()
    first_write_ms: int | None = None  # wall-clock ms before the first record; the broker's timer starts later
    transaction_timeout_ms: int | None = None
    counts_by_topic: Mapping[str, int] = field(default_factory=dict)
    # The writer's digest of its records' keys and values (``record_digest``): what a repair of a
    # lost transaction compares its re-computation with. None when the writer made none.
    digest: str | None = None

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(sorted(self.counts_by_topic))

    def describe_partitions(self) -> tuple[str, ...]:
        return tuple(f"{t}-{p}" for t, p in self.topic_partitions)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["topic_partitions"] = [[t, p] for t, p in self.topic_partitions]
        d["counts_by_topic"] = dict(self.counts_by_topic)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Committable:
        try:
            tps = tuple((str(t), _int(p, "partition")) for t, p in data.get("topic_partitions") or ())
            c = cls(
                transactional_id=_str(data["transactional_id"], "transactional_id"),
                producer_id=_int(data["producer_id"], "producer_id"),
                producer_epoch=_int(data["producer_epoch"], "producer_epoch"),
                records=_int(data["records"], "records"),
                bytes=_optional_int(data.get("bytes"), "bytes"),
                topic_partitions=tps,
                first_write_ms=_optional_int(data.get("first_write_ms"), "first_write_ms"),
                transaction_timeout_ms=_optional_int(data.get("transaction_timeout_ms"), "transaction_timeout_ms"),
                counts_by_topic={str(k): _int(v, "count") for k, v in data.get("counts_by_topic", {}).items()},
                digest=None if data.get("digest") is None else _str(data["digest"], "digest"),
            )
        except MalformedCommittableError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedCommittableError(f"malformed committable {dict(data)!r}: {e!r}") from e
        if c.producer_id < 0 or not 0 <= c.producer_epoch < 32767:
            raise MalformedCommittableError(f"committable {c.transactional_id!r} has no valid producer id/epoch")
        if c.records < 0 or (c.bytes is not None and c.bytes < 0) or any(n < 0 for n in c.counts_by_topic.values()):
            raise MalformedCommittableError(f"committable {c.transactional_id!r} has a negative record or byte count")
        if c.transaction_timeout_ms is not None and c.transaction_timeout_ms <= 0:
            raise MalformedCommittableError(f"committable {c.transactional_id!r} has no transaction timeout")
        return c

    @classmethod
    def from_json(cls, text: str | builtins.bytes) -> Committable:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise MalformedCommittableError(f"committable is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise MalformedCommittableError(f"committable is not a JSON object: {text!r}")
        return cls.from_dict(data)


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MalformedCommittableError(f"committable field {name!r} must be an integer, got {v!r}")
    return v


def _optional_int(v: Any, name: str) -> int | None:
    return None if v is None else _int(v, name)


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str) or not v:
        raise MalformedCommittableError(f"committable field {name!r} must be a non-empty string, got {v!r}")
    return v
