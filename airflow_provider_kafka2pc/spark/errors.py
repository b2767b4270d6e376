"""The Spark glue's exceptions, in one place: a frame that breaks the contract, a session that
would write twice, a lost executor, a barrier stage wider than the cluster, a collected set that is
not one committable per partition.
"""

from __future__ import annotations

from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError


class SchemaError(Kafka2PCError, ValueError):
    """The DataFrame does not fit the Kafka sink contract; raised before any record is written."""


class ExecutorLostError(Kafka2PCError):
    """An executor that held materialized partitions was lost while they were written."""


class SpeculationError(Kafka2PCError):
    """Speculative execution would let a late task attempt fence a finished one."""


class CollectError(Kafka2PCError):
    """The collected set is not exactly one committable per non-empty partition."""


class BarrierSlotsError(Kafka2PCError):
    """Spark refused the barrier stage: it asked for more task slots than the cluster has free."""


class UnsupportedVersionError(Kafka2PCError):
    """A PySpark, an install of it or a pyarrow that kafka2pc is not tested with (``spark/versions.py``);
    refused before anything is written."""
