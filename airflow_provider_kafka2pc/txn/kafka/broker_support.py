"""Which brokers kafka2pc can work with, and the one sentence that refuses the others.

Ending a transaction from another process needs three APIs that came with Kafka 3.0: batched
FindCoordinator (v4, KIP-699), DescribeTransactions and ListTransactions (KIP-664). A broker
without them accepts everything the prepare writes, then refuses every commit, abort and recovery,
and the open transactions hold back every read_committed reader until the broker's transaction
timeout. So the wire client reads the broker's API versions (the ApiVersions answer it got when it
connected: no extra request) before any transaction is opened, and refuses with
``UnsupportedBrokerError``, worded here for the tasks, the CLI and the exporters page alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError

MINIMUM_KAFKA = "3.0"


@dataclass(frozen=True)
class Need:
    """One API the transactions need: its key, its name, the lowest version we send and the
    highest we may send (a broker whose own lowest version is above it does not serve us)."""

    api_key: int
    name: str
    min_version: int = 0
    max_version: int | None = None


# What the librdkafka writers (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit,
# EndTxn) and the wire client (FindCoordinator v4, EndTxn pinned at <= 4, DescribeTransactions,
# ListTransactions) send. Kafka 2.8 has all but the last three's new versions.
NEEDS: tuple[Need, ...] = (
    Need(10, "FindCoordinator", min_version=4),
    Need(65, "DescribeTransactions"),
    Need(66, "ListTransactions"),
    Need(22, "InitProducerId"),
    Need(24, "AddPartitionsToTxn"),
    Need(25, "AddOffsetsToTxn"),
    Need(28, "TxnOffsetCommit"),
    Need(26, "EndTxn", max_version=4),  # wire.END_TXN_MAX_VERSION
)


class UnsupportedBrokerError(Kafka2PCError):
    """The broker lacks an API the transactions need (Kafka older than 3.0); refused before any
    transaction was opened or ended by the step that asked."""


def gaps(api_versions: Mapping[int, tuple[int, int]], needs: Sequence[Need] = NEEDS) -> list[str]:
    """What the broker lacks, worded per API ("FindCoordinator up to v3 (v4 needed)"); empty: none."""
    found: list[str] = []
    absent: list[str] = []
    for need in needs:
        versions = api_versions.get(need.api_key)
        if versions is None:
            absent.append(need.name)
            continue
        low, high = int(versions[0]), int(versions[1])
        if high < need.min_version:
            found.append(f"{need.name} up to v{high} (v{need.min_version} needed)")
        elif need.max_version is not None and low > need.max_version:
            found.append(f"{need.name} from v{low} only (v{need.max_version} or lower needed)")
    if absent:
        found.append(f"{_and(absent)} not at all")
    return found


def unsupported_message(bootstrap: str, lacking: Sequence[str], version: str | None) -> str:
    """The one refusal: the broker, what it lacks, the version its APIs tell, the version needed."""
    told = f": Kafka {version}, by its API versions" if version else ""
    return (
        f"the Kafka broker at {bootstrap} answers {', '.join(lacking)}{told}. kafka2pc needs Kafka "
        f"{MINIMUM_KAFKA} or newer: it ends and recovers transactions from another process with batched "
        "FindCoordinator (KIP-699), DescribeTransactions and ListTransactions (KIP-664); upgrade the "
        "brokers. Refused before this step opened or ended any transaction: nothing was written"
    )


def check_api_versions(bootstrap: str, api_versions: Mapping[int, tuple[int, int]], version: str | None) -> None:
    """Raise ``UnsupportedBrokerError`` unless the broker serves every API of ``NEEDS``. No answer at
    all is not an old broker (every broker since 0.10 answers ApiVersions): kafka-python has not read
    one yet, and the requests themselves tell later."""
    if not api_versions:
        return
    lacking = gaps(api_versions)
    if lacking:
        raise UnsupportedBrokerError(unsupported_message(bootstrap, lacking, version))


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


__all__ = ["MINIMUM_KAFKA", "NEEDS", "Need", "UnsupportedBrokerError", "check_api_versions", "gaps"]
