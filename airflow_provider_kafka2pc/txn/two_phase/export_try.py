"""An export try's hold on its transactional ids, and the check every writer makes before it takes one.

A writer takes its id with InitProducerId, and that fences whoever held the id before: the broker
aborts the holder's open transaction. Kafka fences a stale *producer* by its epoch, but nothing
fences a stale *initialiser*. An export try that pauses before its writers take their ids (a frozen
host, a long GC), is retried elsewhere, and resumes would abort the retry's or the next run's
transactions, even after their COMMIT: the run would become LOST (DESIGN §15).

So every try reads ``{prefix}-try`` (``naming.try_id``) first, before its checks, and after them
takes it with an InitProducerId of its own. The epoch the broker gives it is the try's number, and
a newer try's InitProducerId moves it. A try whose recovery pass finds undecided transactions
aborts them only while nobody took a number since it began, and it takes only the next number
after the one it read, checking just before and after that nothing of its ids is open. Every
writer, on any Spark attempt, and the Kafka source's offsets writer describe ``{prefix}-try`` just
before their own InitProducerId. If the epoch is no longer the try's, the writer stands down
without touching its id (``SupersededExportError``).

What this does not close: the moments between a look at the try id and the InitProducerId after it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.config import kafka_python_settings
from airflow_provider_kafka2pc.txn.kafka.errors import UnmappableConfigError
from airflow_provider_kafka2pc.txn.kafka.retries import retry
from airflow_provider_kafka2pc.txn.kafka.transactions import (
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TransactionInspector,
    coordinator_error,
    not_allowed,
)
from airflow_provider_kafka2pc.txn.kafka.wire import TxnState, WireClient
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.errors import BrokerUnavailableError, SupersededExportError
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings

log = logging.getLogger(__name__)

# The try id never holds a transaction, but InitProducerId needs a timeout, and the broker refuses
# one above its transaction.max.timeout.ms (some services cap it at 30 s or less).
_TRY_TIMEOUT_MS = 1_000


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


@dataclass(frozen=True)
class SeenTry:
    """The try id as a try found it when it began, before its checks: the producer and epoch of the
    latest number, or None where the broker did not know the id yet."""

    members: naming.Members
    try_id: str
    producer_id: int | None
    producer_epoch: int | None

    def moved(self, now: TxnState | None) -> str | None:
        """Why ``now`` (the try id described again) shows another try's number since, or None."""
        if now is None and self.producer_id is None:
            return None
        if now is not None and (now.producer_id, now.producer_epoch) == (self.producer_id, self.producer_epoch):
            return None
        was = "unknown" if self.producer_id is None else f"producer {self.producer_id} epoch {self.producer_epoch}"
        held = "unknown" if now is None else f"producer {now.producer_id} epoch {now.producer_epoch}"
        return f"{self.try_id!r} was {was} when this try began, and is {held} now"


def see_try(wire: WireClient, members: naming.Members, timeout_s: float = 60.0) -> SeenTry:
    """The try id as it stands now: read first, before the try's checks and its recovery pass."""
    tid = naming.try_id(members)
    now = TransactionInspector(wire, timeout_s).describe([tid]).get(tid)
    return SeenTry(members, tid, *((now.producer_id, now.producer_epoch) if now is not None else (None, None)))


def check_unmoved(wire: WireClient, seen: SeenTry, timeout_s: float = 60.0) -> None:
    """Raise ``SupersededExportError`` if another try took a number since ``seen``: then an open
    transaction of the exporter may be that try's, writing now, and this one must end nothing."""
    why = seen.moved(TransactionInspector(wire, timeout_s).describe([seen.try_id]).get(seen.try_id))
    if why is not None:
        raise SupersededExportError(seen.members.prefix, f"another try took a number since this one began: {why}")


def begin_try(wire: WireClient, seen: SeenTry, writer_config: Mapping[str, Any], timeout_s: float = 60.0) -> ExportTry:
    """Take the try's number, the next one after ``seen``, with a look before and after for
    transactions of its ids already open: the caller's recovery pass has just ended what was, so an
    open one belongs to another try of the exporter that is writing now. A number taken since
    ``seen``, or an open transaction found before, and the try stands down without taking one (it
    would supersede that try); a number not the next one, or an open transaction found after, and it
    stands down too (the other got in first). ``writer_config`` is what the writers check the number
    with: refused now, naming the setting, if the commit side's client cannot connect with it."""
    check_writer_config(writer_config)
    inspector = TransactionInspector(wire, timeout_s)
    members, tid = seen.members, seen.try_id
    check_unmoved(wire, seen, timeout_s)
    _stand_down_if_open(inspector, members, "before this try took its number")

    def init() -> tuple[int, int]:
        node = inspector.coordinators([tid])[tid]
        code, producer_id, epoch = wire.init_producer_id(node, tid, _TRY_TIMEOUT_MS)
        if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise not_allowed(wire, tid)
        if code:
            raise coordinator_error(code, f"InitProducerId({tid!r})")
        return producer_id, epoch

    producer_id, epoch = retry(f"InitProducerId({tid!r})", init, timeout_s)
    # The next number after the one seen: the same producer one epoch on, or a new producer at epoch 0
    # (a new id, or the epochs of the old producer used up).
    if not (producer_id == seen.producer_id and epoch == (seen.producer_epoch or 0) + 1) and not (
        producer_id != seen.producer_id and epoch == 0
    ):
        raise SupersededExportError(
            members.prefix,
            f"another try took a number between this one's look and its own: {tid!r} was "
            f"{seen.producer_id} epoch {seen.producer_epoch}, this try got producer {producer_id} epoch {epoch}",
        )
    _stand_down_if_open(inspector, members, f"when this try took its number (epoch {epoch} of {tid!r})")
    log.info("kafka2pc: export try of %s holds %s at producer %d epoch %d", members.prefix, tid, producer_id, epoch)
    return ExportTry(members.prefix, tid, producer_id, epoch)


def _stand_down_if_open(inspector: TransactionInspector, members: naming.Members, when: str) -> None:
    """Ongoing only: a transaction still ending (its markers being written) is no writer's."""
    open_now = [s for s in inspector.describe_prefix(members.prefix, ("Ongoing",)) if members.owns(s.transactional_id)]
    if open_now:
        first = open_now[0]
        raise SupersededExportError(
            members.prefix,
            f"{len(open_now)} of its transaction(s) were open {when}, after its recovery pass, "
            f"{first.transactional_id!r} by producer {first.producer_id} epoch {first.producer_epoch}",
        )


def check_writer_config(config: Mapping[str, Any]) -> None:
    """The writers describe the try id with the commit side's client (kafka-python): a connection
    setting in the export's ``producer_config`` it cannot honour is refused on the driver, by name."""
    try:
        kafka_python_settings(config)
    except UnmappableConfigError as e:
        raise UnmappableConfigError(
            e.key,
            f"{str(e).split(': ', 1)[-1]}. The export's writers check their export try with kafka2pc's commit-side "
            "client, which cannot honour it: set how to connect on the connection, and only producer tuning in "
            "producer_config",
        ) from e


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


__all__ = [
    "ExportTry",
    "SeenTry",
    "begin_try",
    "check_held",
    "check_still_current",
    "check_try_current",
    "check_unmoved",
    "check_writer_config",
    "see_try",
    "superseded_error",
]
