"""The side-by-side throughput runs: each writes the same N records into its own fresh topic.

(a)  raw librdkafka: one confluent-kafka Producer, pre-built bytes, flush
(b)  Spark's built-in Kafka sink, as shipped (kafka-clients defaults)
(b') Spark's Kafka sink with kafka2pc's producer tuning (an extra row, for a like-for-like view)
(c)  kafka2pc EXACTLY_ONCE: export_dataframe (prepare) + commit_prepared, the Python produce loop
(n)  the same on the native writer (Arrow batches into rd_kafka_produce_batch, txn/kafka/native.py)
(n+) (n) with the user guide's setting for small records: Spark's per-row byte check of the Arrow
     batches off (spark.sql.execution.arrow.maxBytesPerBatch = Int.MaxValue) for that job only
(h)  (n) as a Spark application exports (spark.application.export_from_application: its own Kafka
     steps, the handoff through the decision topic), accepted as the Airflow side's sensor does
     (txn.two_phase.handoff.accept), then committed: the handoff path's cost beside (n)
(d)  kafka2pc AT_LEAST_ONCE: export_dataframe (the writer the job chooses: native where it can)
(s)  Spark → Arrow → Python workers and back, no Kafka: the floor of any mapInArrow writer (extra)

Only the write is timed; the read_committed count that verifies each run is not.
"""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench_env import Kafka, Phases, cpu_between, machine_cpu_seconds, tree_cpu_seconds
from bench_txn import coordinator_phases

LABELS: dict[str, str] = {
    "a": "(a)  raw librdkafka loop",
    "b": "(b)  Spark Kafka sink",
    "b'": "(b') Spark Kafka sink, kafka2pc tuning",
    "c": "(c)  kafka2pc EXACTLY_ONCE",
    "n": "(n)  kafka2pc EXACTLY_ONCE, native writer",
    "n+": "(n+) (n), Spark's Arrow byte check off",
    "n0": "(n0) (n), not materialized first",
    "nc": "(nc) (n), store=checkpoint (a cluster before)",
    "nb": "(nb) (n), store=barrier (a cluster now)",
    "h": "(h)  (n) through an application's handoff",
    "k": "(k)  (n) through Spark Connect",
    "d": "(d)  kafka2pc AT_LEAST_ONCE",
    "s": "(s)  Spark mapInArrow only, no Kafka",
}
ORDER = ("a", "b", "b'", "c", "n", "n+", "n0", "nc", "nb", "h", "k", "d", "s")


@dataclass(frozen=True)
class Sample:
    """One timed run of one mode."""

    mode: str
    rows: int
    payload_bytes: int
    seconds: float
    committed: int  # what a read_committed consumer counted afterwards; (s): rows the workers saw
    topic: str
    phases: dict[str, float] = field(default_factory=dict)
    # CPU seconds by part of the process tree (bench_env.CPU_PARTS) while the mode ran, its untimed
    # set-up included and the read_committed count excluded. Steadier than rows/s on a busy machine.
    cpu: dict[str, float] = field(default_factory=dict)
    # The whole machine's busy CPU seconds meanwhile (bench_env.machine_cpu_seconds): on the emulated
    # cluster every host's, the executors and brokers included; the competing load's left out.
    machine_cpu: float = 0.0

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    @property
    def verified(self) -> bool:
        return self.committed == self.rows

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    @property
    def cpu_ns_per_row(self) -> float:
        return self.cpu_seconds / self.rows * 1e9

    @property
    def machine_cpu_ns_per_row(self) -> float:
        return self.machine_cpu / self.rows * 1e9

    @property
    def worker_cpu_ns_per_row(self) -> float:
        """The executor's Python workers alone (the writer, librdkafka's threads, Arrow in)."""
        return self.cpu.get("python workers", 0.0) / self.rows * 1e9

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(verified=self.verified, rows_per_s=round(self.rows_per_s), mb_per_s=round(self.mb_per_s, 2))
        d["seconds"] = round(self.seconds, 4)
        d["cpu"] = {k: round(v, 4) for k, v in self.cpu.items()}
        d.update(cpu_ns_per_row=round(self.cpu_ns_per_row), worker_cpu_ns_per_row=round(self.worker_cpu_ns_per_row))
        d.update(machine_cpu=round(self.machine_cpu, 4), machine_cpu_ns_per_row=round(self.machine_cpu_ns_per_row))
        d["phases"] = {k: round(v, 4) for k, v in self.phases.items()}
        return d


class Runner:
    """Runs the modes against one broker with one SparkSession and one set of records."""

    def __init__(
        self,
        kafka: Kafka,
        rows: int,
        df: Any,
        keys: list[bytes],
        values: list[bytes],
        payload_bytes: int,
        decisions: str,
        connect_df: Any = None,
    ) -> None:
        """``df`` for the Spark modes, ``keys`` and ``values`` (``rows`` of each) for (a),
        ``connect_df`` (the same rows on a Spark Connect session) for (k)."""
        self.kafka = kafka
        self.rows = rows
        self.df = df
        self.keys = keys
        self.values = values
        self.payload_bytes = payload_bytes
        self.decision_topic = decisions
        self.connect_df = connect_df

    def run(self, mode: str) -> Sample:
        runs: dict[str, Callable[[str], dict[str, float]]] = {
            "a": self._raw,
            "b": lambda t: self._spark_sink(t, tuned=False),
            "b'": lambda t: self._spark_sink(t, tuned=True),
            "c": lambda t: self._exactly_once(t, "python"),
            "n": lambda t: self._exactly_once(t, "native"),
            "n+": lambda t: self._exactly_once(t, "native", arrow_bytes_unchecked=True),
            "n0": lambda t: self._exactly_once(t, "native", materialize=False),
            "nc": lambda t: self._exactly_once(t, "native", store="checkpoint"),
            "nb": lambda t: self._exactly_once(t, "native", store="barrier"),
            "h": self._handed_off,
            "k": lambda t: self._exactly_once(t, "native", df=self.connect_df),
            "d": self._at_least_once,
            "s": self._spark_floor,
        }
        topic = self.kafka.topic(mode.replace("'", "p").replace("+", "x")) if mode != "s" else ""
        gc.collect()
        cpu, machine = tree_cpu_seconds(), machine_cpu_seconds()
        phases = runs[mode](topic)
        cpu_by_part = cpu_between(cpu, tree_cpu_seconds())  # before the read_committed count below
        machine = machine_cpu_seconds() - machine
        seconds = phases.pop("total")
        committed = self.kafka.count_committed(topic) if topic else int(phases.pop("rows"))
        return Sample(mode, self.rows, self.payload_bytes, seconds, committed, topic, phases, cpu_by_part, machine)

    # (a) -------------------------------------------------------------------------------
    def _raw(self, topic: str) -> dict[str, float]:
        from confluent_kafka import Producer

        from airflow_provider_kafka2pc.txn.kafka.writer import PRODUCER_DEFAULTS

        producer = Producer({**PRODUCER_DEFAULTS, **self.kafka.config, "acks": "all", "enable.idempotence": True})
        # Connected and the producer id acquired before timing: (a) measures the produce loop itself.
        producer.list_topics(topic, timeout=10)
        keys, values, n = self.keys, self.values, self.rows
        produce, poll = producer.produce, producer.poll
        started = time.perf_counter()
        for lo in range(0, n, 10_000):  # poll every 10,000 records, as DeliveryWriter does
            for key, value in zip(keys[lo : lo + 10_000], values[lo : lo + 10_000], strict=True):
                try:
                    produce(topic, value, key)
                except BufferError:
                    _produce_when_room(producer, topic, value, key)
            poll(0)
        enqueued = time.perf_counter()
        remaining = producer.flush(120)
        done = time.perf_counter()
        if remaining:
            raise RuntimeError(f"(a): {remaining} records still queued after flush")
        return {"total": done - started, "produce": enqueued - started, "flush": done - enqueued}

    # (b), (b') ----------------------------------------------------------------------------
    def _spark_sink(self, topic: str, tuned: bool) -> dict[str, float]:
        writer = (
            self.df.write.format("kafka").option("kafka.bootstrap.servers", self.kafka.bootstrap).option("topic", topic)
        )
        if tuned:
            for key, value in SPARK_TUNING.items():
                writer = writer.option(f"kafka.{key}", value)
        started = time.perf_counter()
        writer.save()
        return {"total": time.perf_counter() - started}

    # (c) ---------------------------------------------------------------------------------
    def _exactly_once(
        self,
        topic: str,
        writer: str,
        arrow_bytes_unchecked: bool = False,
        materialize: bool = True,
        store: str = "auto",
        df: Any = None,
    ) -> dict[str, float]:
        from airflow_provider_kafka2pc.spark.job import export_dataframe
        from airflow_provider_kafka2pc.spark.window import WindowSettings
        from airflow_provider_kafka2pc.spark.write_job import ARROW_BYTES_UNCHECKED, ARROW_MAX_BYTES_PER_BATCH
        from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
        from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
        from airflow_provider_kafka2pc.txn.protocol import naming
        from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
        from airflow_provider_kafka2pc.txn.two_phase.export_try import begin_try, see_try

        settings = ExportSettings(_prefix(), self.kafka.config, topic, writer=writer)
        decision_log = DecisionLog(self.kafka.config, topic=self.decision_topic)
        decision_log.ensure_topic()
        phases = Phases()
        with WireClient(self.kafka.config) as wire, coordinator_phases(phases):
            # As the export task does: the try's number, which every writer checks before it takes its id.
            members = naming.Members(settings.transactional_id_prefix, settings.naming_strategy)
            taken = begin_try(wire, see_try(wire, members), settings.producer_config)
            settings = replace(settings, export_try=taken.as_tuple())
            df = self.df if df is None else df
            conf = df.sparkSession.conf
            before = conf.get(ARROW_MAX_BYTES_PER_BATCH, None)  # a --spark-conf value stays the session's
            if arrow_bytes_unchecked:
                conf.set(ARROW_MAX_BYTES_PER_BATCH, str(ARROW_BYTES_UNCHECKED))
            try:
                started = time.perf_counter()
                result = export_dataframe(df, settings, window=WindowSettings(materialize=materialize, store=store))
                prepared = time.perf_counter()
            finally:
                if arrow_bytes_unchecked and before is None:
                    conf.unset(ARROW_MAX_BYTES_PER_BATCH)
                elif arrow_bytes_unchecked:
                    conf.set(ARROW_MAX_BYTES_PER_BATCH, before)
            report = commit_prepared(
                result.committables, wire, decision_log, run=f"bench-{settings.transactional_id_prefix}"
            )
            done = time.perf_counter()
        decision_log.close()
        if report.count(Verdict.COMMITTED) != len(result.committables) or result.records != self.rows:
            raise RuntimeError(f"{writer}: {result.summary()} but {report.count(Verdict.COMMITTED)} committed")
        return {
            "total": done - started,
            "prepare": prepared - started,
            "prepare:materialize": result.materialize_s,
            "prepare:write": result.write_s,
            "commit": done - prepared,
            "transactions": len(result.committables),
            "commit:log_read": phases.seconds["decision log read"],
            "commit:log_write": phases.seconds["decision log append"],
            "commit:end_txn": phases.seconds["EndTxn (resolve)"],
        }

    # (h) ---------------------------------------------------------------------------------
    def _handed_off(self, topic: str) -> dict[str, float]:
        from airflow_provider_kafka2pc.spark.application import export_from_application
        from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
        from airflow_provider_kafka2pc.txn.kafka.transactions import TransactionInspector
        from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
        from airflow_provider_kafka2pc.txn.protocol import naming
        from airflow_provider_kafka2pc.txn.protocol.outcome import Verdict
        from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared
        from airflow_provider_kafka2pc.txn.two_phase.handoff import accept

        prefix, run_id = _prefix(), f"bench_{uuid.uuid4().hex[:8]}"
        decision_log = DecisionLog(self.kafka.config, topic=self.decision_topic)
        decision_log.ensure_topic()
        with WireClient(self.kafka.config) as wire:
            started = time.perf_counter()
            handoff = export_from_application(
                self.df, topic=topic, transactional_id_prefix=prefix, dag_id="bench", run_id=run_id,
                task_id="submit", kafka_config=self.kafka.config, decision_topic=self.decision_topic,
                writer="native",
            )  # fmt: skip
            handed = time.perf_counter()
            if handoff is None:
                raise RuntimeError("(h): the application handed nothing off")
            strategy, run_key = naming.NamingStrategy.INCREMENTING, naming.sanitize_run_key(run_id)
            accepted = accept(decision_log, TransactionInspector(wire), prefix, handoff.run, strategy, run_key)
            taken = time.perf_counter()
            if accepted.handoff is None:
                raise RuntimeError(f"(h): not accepted: {accepted.waiting}")
            committables = accepted.handoff.committables
            report = commit_prepared(committables, wire, decision_log, run=handoff.run)
            done = time.perf_counter()
        decision_log.close()
        if report.count(Verdict.COMMITTED) != len(committables) or handoff.records != self.rows:
            committed = report.count(Verdict.COMMITTED)
            raise RuntimeError(f"(h): {handoff.records} records handed off, {committed} committed")
        return {
            "total": done - started,
            "prepare": handed - started,
            "handoff:accept": taken - handed,
            "commit": done - taken,
            "transactions": len(committables),
        }

    # (d) ---------------------------------------------------------------------------------
    def _at_least_once(self, topic: str) -> dict[str, float]:
        from airflow_provider_kafka2pc.spark.job import export_dataframe
        from airflow_provider_kafka2pc.txn.two_phase.export_settings import DeliveryGuarantee, ExportSettings

        settings = ExportSettings(
            _prefix(), self.kafka.config, topic, delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE
        )
        started = time.perf_counter()
        result = export_dataframe(self.df, settings)
        done = time.perf_counter()
        if result.records != self.rows:
            raise RuntimeError(f"(d): {result.summary()}")
        return {"total": done - started}

    # (s) ---------------------------------------------------------------------------------
    def _spark_floor(self, _topic: str) -> dict[str, float]:
        """The same mapInArrow job shape as (c)/(d), whose Python side only counts the rows."""
        from pyspark.sql.pandas.types import from_arrow_schema

        def count(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            n = sum(b.num_rows for b in batches)
            yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))

        import pyarrow as pa

        schema = from_arrow_schema(pa.schema([("rows", pa.int64())]))
        started = time.perf_counter()
        rows = sum(r["rows"] for r in self.df.mapInArrow(count, schema).collect())
        return {"total": time.perf_counter() - started, "rows": rows}


# kafka2pc's PRODUCER_DEFAULTS in kafka-clients terms, plus the same acks and idempotence.
SPARK_TUNING: dict[str, str] = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "batch.size": "1000000",
    "compression.type": "lz4",
    "max.in.flight.requests.per.connection": "5",
}


def _prefix() -> str:
    return f"bench{uuid.uuid4().hex[:8]}"


def _produce_when_room(producer: Any, topic: str, value: bytes, key: bytes) -> None:
    while True:
        producer.poll(0.05)  # local queue full: let deliveries drain
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:
            continue
