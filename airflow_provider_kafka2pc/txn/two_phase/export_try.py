"""An export try's hold on its transactional ids, and the check every writer makes before it takes one.

A writer takes its id with InitProducerId, and that fences whoever held the id before: the broker
aborts the holder's open transaction. Kafka fences a stale *producer* by its epoch, but nothing
fences a stale *initialiser*. An export try that pauses before its writers take their ids (a frozen
host, a long GC), is retried elsewhere, and resumes would abort the retry's or the next run's
transactions, even after their COMMIT: the run would become LOST (DESIGN §15).

So every try first takes ``{prefix}-try`` (``naming.try_id``) with an InitProducerId of its own. The
epoch the broker gives it is the try's number, and a newer try's InitProducerId moves it. Then the
try checks that nothing of its ids is open (its recovery pass has just ended what was). Every writer,
on any Spark attempt, and the Kafka source's offsets writer describe ``{prefix}-try`` just before
their own InitProducerId. If the epoch is no longer the try's, the writer stands down without
touching its id (``SupersededExportError``).

What this does not close: the moment between that describe and the InitProducerId.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.kafka.transactions import (
    OPEN_STATES,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TransactionInspector,
    coordinator_error,
    not_allowed,
)
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, SupersededExportError
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

log = logging.getLogger(__name__)

# The try id never holds a transaction; a timeout is required by InitProducerId all the same.
_TRY_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class ExportTry:
    """The try's number: the producer id and epoch the broker gave its InitProducerId of ``try_id``."""

    prefix: str
    try_id: str
    producer_id: int
    producer_epoch: int

    def as_tuple(self) -> tuple[str, str, int, int]:
        return (self.prefix, self.try_id, self.producer_id, self.producer_epoch)

    @classmethod
    def from_tuple(cls, t: Any) -> ExportTry:
        prefix, try_id, producer_id, producer_epoch = t
        return cls(str(prefix), str(try_id), int(producer_id), int(producer_epoch))


def begin_try(wire: WireClient, members: naming.Members, timeout_s: float = 60.0) -> ExportTry:
    """Take the try's number, then check that none of ``members``' ids is open: the caller's recovery
    pass has just ended what was, so an open one is a newer try's or run's, already writing."""
    inspector = TransactionInspector(wire, timeout_s)
    tid = naming.try_id(members)

    def init() -> tuple[int, int]:
        node = inspector.coordinators([tid])[tid]
        code, producer_id, epoch = wire.init_producer_id(node, tid, _TRY_TIMEOUT_MS)
        if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise not_allowed(wire, tid)
        if code:
            raise coordinator_error(code, f"InitProducerId({tid!r})")
        return producer_id, epoch

    producer_id, epoch = retry(f"InitProducerId({tid!r})", init, timeout_s)
    taken = ExportTry(members.prefix, tid, producer_id, epoch)
    open_now = [s for s in inspector.describe_prefix(members.prefix, OPEN_STATES) if members.owns(s.transactional_id)]
    if open_now:
        first = open_now[0]
        raise SupersededExportError(
            members.prefix,
            f"{len(open_now)} of its transactions were opened after this try's recovery pass, "
            f"{first.transactional_id!r} by producer {first.producer_id} epoch {first.producer_epoch}",
        )
    log.info("kafka2pc: export try of %s holds %s at producer %d epoch %d", members.prefix, tid, producer_id, epoch)
    return taken


def check_still_current(config: Mapping[str, Any], taken: ExportTry, timeout_s: float = 30.0) -> None:
    """``check_held`` over a connection of its own: by a writer just before its InitProducerId, on
    the executor; and by the driver before it aborts what its failed write job opened (a superseded
    try's pass would abort the newer one's prepared transactions: those ids are the newer try's)."""
    try:
        wire = WireClient(config, reachable=True)  # the writer's own client connects next, and names a cause
    except BrokerUnavailableError as e:
        raise BrokerUnavailableError(
            f"a writer of exporter {taken.prefix!r} could not ask Kafka at {config.get('bootstrap.servers')} "
            f"whether its export try is still the current one, and took no transactional id: {e.__cause__ or e}"
        ) from e
    try:
        check_held(wire, taken, timeout_s)
    finally:
        wire.close()


def check_held(wire: WireClient, taken: ExportTry, timeout_s: float = 30.0) -> None:
    """Raise ``SupersededExportError`` unless ``taken.try_id`` is still at the try's producer and epoch."""
    now = TransactionInspector(wire, timeout_s).describe([taken.try_id]).get(taken.try_id)
    if now is None or (now.producer_id, now.producer_epoch) != (taken.producer_id, taken.producer_epoch):
        held = "no one" if now is None else f"producer {now.producer_id} epoch {now.producer_epoch}"
        raise SupersededExportError(
            taken.prefix,
            f"{taken.try_id!r} is held by {held}, this try took it at producer {taken.producer_id} "
            f"epoch {taken.producer_epoch}",
        )


def superseded_error(settings: ExportSettings) -> SupersededExportError | None:
    """After a failed write job: the broker's word that a newer try superseded this one (its writers
    stood down), or None, also where the broker cannot say now (the job's own error then stands)."""
    try:
        check_try_current(settings)
    except SupersededExportError as e:
        return e
    except Exception as e:
        log.info("kafka2pc could not check whether this export try is still current: %s", e)
    return None


def check_try_current(settings: ExportSettings) -> None:
    """``check_still_current`` for the try the settings carry (none where they carry no try): before
    a writer takes one of its ids (a partition's, the Kafka source's offsets participant), and before
    the driver aborts what its failed write job opened."""
    if settings.export_try is not None:
        check_still_current(settings.producer_config, ExportTry.from_tuple(settings.export_try))


__all__ = ["ExportTry", "begin_try", "check_held", "check_still_current", "check_try_current", "superseded_error"]
