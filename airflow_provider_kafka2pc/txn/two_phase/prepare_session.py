"""The Kafka side of one prepare: every step before and after the write job over one set of clients.

Before the write job: the topic and the ACLs, the run's record, the POOLING turn, a recovery pass,
the prefix claim. While it runs: ending what it opened if it fails or overruns. After it: standing
down if the run was decided meanwhile. One wire client and one decision log serve them all, opened
on first use and closed when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.access import (
    DECISION_TOPIC_OPERATIONS,
    check_decision_topic_access,
    check_topic_access,
    principal_of,
)
from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
from airflow_provider_kafka2pc.txn.kafka.errors import DecisionLogError, KafkaAuthorizationError, acl_command
from airflow_provider_kafka2pc.txn.protocol import naming
from airflow_provider_kafka2pc.txn.protocol.committable import Committable
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, MissingTopicError
from airflow_provider_kafka2pc.txn.protocol.records import Lease, RunRecord
from airflow_provider_kafka2pc.txn.protocol.source_files import Splits
from airflow_provider_kafka2pc.txn.two_phase.coordinator import abort_prepared
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.export_try import (
    ExportTry,
    SeenTry,
    begin_try,
    check_try_current,
    check_unmoved,
    see_try,
)
from airflow_provider_kafka2pc.txn.two_phase.recovery import RecoveryResult, recover, recover_until_clear
from airflow_provider_kafka2pc.txn.two_phase.repair import RepairReport, abort_attempts, repair_lost_run
from airflow_provider_kafka2pc.txn.two_phase.repair_plan import RepairPlan
from airflow_provider_kafka2pc.txn.two_phase.ruling import CommitReport, ref_of

log = logging.getLogger(__name__)


class PrepareSession:
    """One prepare of exporter ``prefix`` for run ``run`` (``run_key``: its INCREMENTING ids)."""

    def __init__(self, clients: KafkaClients, prefix: str, run: str, run_key: str | None = None) -> None:
        self.clients = clients
        self.prefix = prefix
        self.run = run
        self.run_key = run_key

    def check_export_access(self, topic: str | None) -> None:
        check_export_access(self.clients, topic)

    def run_status(self) -> RunRecord | None:
        """The run's record in the decision log: None before its decision."""
        with self._acl_named():
            return self.clients.decision_log().read_for(self.prefix, self.run).run_status(self.prefix, self.run)

    def claim_group(self, group: str) -> None:
        """Register this exporter as the only one moving Kafka source group ``group``."""
        with self._acl_named():
            self.clients.decision_log().claim_group(group, self.prefix)

    def last_source(self) -> RunRecord | None:
        """The exporter's latest run whose Kafka source offsets committed (None: none yet)."""
        with self._acl_named():
            return self.clients.decision_log().read_for(self.prefix).last_source(self.prefix)

    def take_turn(self, lease: Lease, is_live: Callable[[Lease], bool]) -> Lease | None:
        """Queue this run for the POOLING exporter; the live run ahead of it, or None: our turn."""
        with self._acl_named():
            return self.clients.decision_log().take_turn(lease, is_live)

    def recover(
        self,
        spare_own_loss: bool = False,
        owns: Callable[[str], bool] | None = None,
        before_abort: Callable[[], None] | None = None,
    ) -> RecoveryResult:
        """One recovery pass over the exporter's open transactions (DESIGN §3.1). ``spare_own_loss``:
        a loss of this run does not fail it (its export task repairs it). ``owns``: abort only the
        undecided transactions whose id it accepts (default: the run's)."""
        with self._acl_named():
            return recover(
                self.clients.wire(),
                self.prefix,
                self.clients.decision_log(),
                run=self.run,
                run_key=self.run_key,
                owns=owns,
                spare=self.run if spare_own_loss else None,
                before_abort=before_abort,
            )

    def repair(
        self,
        export_again: Callable[[RepairPlan], Sequence[Committable]],
        actor: str,
        files_now: Callable[[], Splits | None] | None = None,
    ) -> RepairReport:
        """Repair the run, LOST after its COMMIT (``txn/two_phase/repair.py``)."""
        with self._acl_named():
            return repair_lost_run(
                self.clients.wire(), self.clients.decision_log(), self.prefix, self.run, export_again, actor=actor,
                files_now=files_now,
            )  # fmt: skip

    def abort_repair_attempts(self, actor: str) -> bool:
        """End what a failed re-export of the run's repair opened, now; True when nothing is left open."""
        with self._acl_named():
            return abort_attempts(self.clients.wire(), self.clients.decision_log(), self.prefix, self.run, actor)

    def see_try(self, members: naming.Members) -> SeenTry:
        """The try id as this try finds it, read before its checks (``txn/two_phase/export_try.py``)."""
        with self._acl_named():
            return see_try(self.clients.wire(), members)

    def recover_first(self, retry: str, seen: SeenTry | None = None) -> None:
        """A recovery pass before anything is written, whatever the DAG wiring: an earlier run's
        decided transactions are rolled forward (and a loss reported) before this run's writers
        fence their ids. While transactions are still completing the prepare is refused, and
        ``retry`` says how to try again. With ``seen``, undecided transactions are aborted only while
        no other try took a number since this one began (``SupersededExportError`` otherwise)."""
        wire = self.clients.wire()
        recovered = self.recover(before_abort=(lambda: check_unmoved(wire, seen)) if seen is not None else None)
        if not recovered.done:
            raise Kafka2PCError(
                f"transactions of exporter {self.prefix!r} are still completing on the broker "
                f"({recovered.describe()}); {retry}"
            )

    def begin_try(self, seen: SeenTry, writer_config: Mapping[str, Any]) -> ExportTry:
        """This try's number on the broker, the next after ``seen``, taken once the try's checks and
        recovery pass are done: its writers check it with ``writer_config`` before they take their ids
        (``txn/two_phase/export_try.py``)."""
        with self._acl_named():
            return begin_try(self.clients.wire(), seen, writer_config)

    def abort_opened(self, settings: ExportSettings) -> tuple[bool, RecoveryResult]:
        """The write job failed or overran: recovery passes until nothing of the run is open (ABORT
        decided first); (nothing left open, the last pass). A try that a newer one superseded raises
        ``SupersededExportError`` and touches nothing: its pass would abort the newer try's prepared
        transactions, and the ids are the newer try's to end."""
        check_try_current(settings)
        return recover_until_clear(self.recover)

    def claim(self, owner: str) -> None:
        """Register ``owner`` as the only exporter of the prefix; refuse if another owns it."""
        with self._acl_named():
            self.clients.decision_log().claim_prefix(self.prefix, owner=owner)

    def abort(self, committables: Sequence[Committable]) -> CommitReport:
        """ABORT decided first, then every transaction ended."""
        with self._acl_named():
            return abort_prepared(
                [ref_of(c) for c in committables], self.clients.wire(), self.clients.decision_log(), self.run
            )

    @contextlib.contextmanager
    def _acl_named(self) -> Iterator[None]:
        """The decision log says only TOPIC_AUTHORIZATION_FAILED, a writer only that its id was
        refused: name the one ACL docs/acls.md grants instead. Asked only after a failure."""
        try:
            yield
        except DecisionLogError as e:
            try:
                check_decision_topic_access(self.clients.config, self.clients.decision_topic)
            except KafkaAuthorizationError as named:
                raise named from e
            except Exception:  # the broker could not say: the decision log's error stands
                log.debug("could not check the decision topic's ACLs after %s", e, exc_info=True)
            raise
        except KafkaAuthorizationError as e:
            if e.resource_type != "TransactionalId":
                raise
            # Recovery needs Describe, the writers Write (which implies Describe): name the one grant.
            raise KafkaAuthorizationError(
                e.principal,
                "TransactionalId",
                self.prefix,
                "Write",
                "PREFIXED",
                "the exporter's transactional ids",
                bootstrap=e.bootstrap,
            ) from None

    def close(self) -> None:
        self.clients.close()

    def __enter__(self) -> PrepareSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.clients.__exit__(exc_type, *exc)


def check_export_access(clients: KafkaClients, topic: str | None) -> None:
    """The data topic exists and the principal may do what an export needs: data topic Write;
    decision topic Read, Write and DescribeConfigs when it exists (Create otherwise, asked when it
    is created). ``KafkaAuthorizationError`` names the missing ACL and the ``kafka-acls`` command;
    the transactional id's Write is refused by the first InitProducerId, which writes nothing
    (docs/acls.md)."""
    config = clients.config
    existing = clients.wire().topics()
    if topic is not None and topic not in existing:
        bootstrap, principal = config["bootstrap.servers"], principal_of(config)
        raise MissingTopicError(
            f"topic {topic!r} does not exist on {bootstrap}, or {principal} may not Describe it; create it "
            "first (the export never creates data topics) and grant Write on it (docs/acls.md), which "
            f"implies Describe: {acl_command(principal, 'Topic', topic, 'Write', bootstrap=bootstrap)}"
        )
    needs: dict[str, list[str]] = {}
    if topic is not None:
        needs[topic] = ["WRITE"]
    if clients.decision_topic in existing:
        needs[clients.decision_topic] = list(DECISION_TOPIC_OPERATIONS)
    check_topic_access(config, needs)


__all__ = ["PrepareSession", "check_export_access"]
