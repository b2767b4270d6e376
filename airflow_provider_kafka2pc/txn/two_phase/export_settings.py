"""What an export writes and how: the settings every partition writer gets, serialisable for Spark tasks.

Also callable without Spark: the settings are plain data, sent to each task as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.record_digest import SPARK_SCHEME


class DeliveryGuarantee(StrEnum):
    EXACTLY_ONCE = "EXACTLY_ONCE"  # one transaction per partition, committed by the coordinator
    AT_LEAST_ONCE = "AT_LEAST_ONCE"  # idempotent producer, flushed; a retried task may duplicate
    NONE = "NONE"  # acks=1, no idempotence


@dataclass(frozen=True)
class ExportSettings:
    transactional_id_prefix: str
    producer_config: Mapping[str, Any]
    topic: str | None = None
    naming_strategy: naming.NamingStrategy = naming.NamingStrategy.POOLING
    run_key: str | None = None
    # An application's driver attempt (``naming.attempt_tag``): its ids are its own (DESIGN §16).
    attempt_tag: str | None = None
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    transaction_timeout_ms: int | None = None
    # Testing aid: the first attempt of this partition raises after writing N records.
    fail_first_attempt: tuple[int, int] | None = None
    # "auto": the native path (Arrow buffers into librdkafka's batch API, txn/kafka/native.py) where it
    # can write the frame, the Python loop otherwise; "native" or "python" force one (native fails
    # loudly where it cannot).
    writer: str = "auto"
    # Record a digest per transaction (``txn/protocol/record_digest.py``), so that a run that loses
    # transactions after its COMMIT can be repaired; costs one hash per record in Spark's JVM.
    repairable: bool = True
    # Which digest (``txn/protocol/record_digest.py``): a repair computes the one its run recorded.
    digest_scheme: str = SPARK_SCHEME
    # The export try's number (``txn/two_phase/export_try.py``, ``ExportTry.as_tuple``): each writer
    # checks it is still current before it takes its id. None: no check (an application attempt's
    # ids are its own; a repair holds a lease).
    export_try: tuple[str, str, int, int] | None = None

    def to_json(self) -> str:
        d = asdict(self)
        d["producer_config"] = dict(self.producer_config)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> ExportSettings:
        d = json.loads(text)
        d["naming_strategy"] = naming.NamingStrategy(d["naming_strategy"])
        d["delivery_guarantee"] = DeliveryGuarantee(d["delivery_guarantee"])
        for name in ("fail_first_attempt", "export_try"):
            if d.get(name) is not None:
                d[name] = tuple(d[name])

        return cls(**d)

    def transactional_id(self, slot: int) -> str:
        return naming.transactional_id(
            self.transactional_id_prefix, slot, self.naming_strategy, self.run_key, self.attempt_tag
        )


WRITERS = ("auto", "native", "python")


def validate_writer(writer: str) -> str:
    """``writer`` when it names a path of ``WRITERS``; else a ValueError naming the choices."""
    if writer not in WRITERS:
        raise ValueError(f"writer={writer!r}: choose one of {list(WRITERS)}")
    return writer


__all__ = ["WRITERS", "DeliveryGuarantee", "ExportSettings", "validate_writer"]
