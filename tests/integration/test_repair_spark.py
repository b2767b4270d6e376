"""Repair with real Spark (DESIGN §6): runs exported by ``export_dataframe`` from Parquet files on a
broker with a 30 s ``transaction.max.timeout.ms``, whose commit decided COMMIT, ended half of the
transactions and stopped; the broker aborted the rest at its cap and recovery recorded the run LOST.
``kafka2pc repair`` (a process of its own, with its own Spark) exports the lost Spark partitions
again and commits them. Judged by a read_committed consumer (every key once), the transactions
left open and ``kafka2pc list``'s exit status; a changed file and a non-deterministic plan are
refused before anything becomes visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kafka2pc.txn.kafka.decision_log import DecisionLog
from airflow_provider_kafka2pc.txn.kafka.wire import WireClient
from airflow_provider_kafka2pc.txn.protocol.outcome import Intent
from airflow_provider_kafka2pc.txn.protocol.records import RunStatus
from airflow_provider_kafka2pc.txn.two_phase.coordinator import Decided, decide_commit
from airflow_provider_kafka2pc.txn.two_phase.export_settings import ExportSettings
from airflow_provider_kafka2pc.txn.two_phase.resolver import TransactionResolver
from airflow_provider_kafka2pc.txn.two_phase.ruling import ref_of
from tests.conftest import CAP30_TXN_MAX_TIMEOUT_MS
from tests.e2e.test_kafka_source_dag import group_offsets, kafka_source_jars
from tests.helpers.jvm_options import stop_driver_jvm
from tests.helpers.kafka import REPO, KafkaEnv
from tests.helpers.lost_runs import record_lost
from tests.helpers.registry import RegistryEnv, spark_avro_jar

pytestmark = pytest.mark.kafka

RUN = "orders/manual__2026-11-28T12:00:00+00:00"
FILES, LOST, RECORDS = 8, 4, 300  # one Spark partition per Parquet file; the last 4 transactions lost
CASES = ("main", "changed", "random", "topics", "old", "avro")  # "topics": a topic column over two
# topics; "old": digests of the scheme exports recorded before the topic was hashed (key and value
# only); "avro": values framed for the schema registry, Avro records
KAFKA_PARTITIONS, KAFKA_LOST = 4, 2  # the Kafka-sourced run: one Spark partition per source partition
KAFKA_JARS = json.loads(kafka_source_jars())["spark.jars"]
JARS = f"{KAFKA_JARS},{spark_avro_jar()}"  # Spark's Kafka source and spark-avro
# One Spark partition per small file: Spark packs files up to a split size counting each file's open
# cost, so an open cost of the default split size (128 MB) leaves each file a partition of its own.
ONE_PARTITION_PER_FILE = ("spark.sql.files.openCostInBytes", str(128 * 1024 * 1024))


@dataclass(frozen=True)
class LostRuns:
    env: KafkaEnv
    decisions: str
    prefixes: dict[str, str]
    topics: dict[str, str]
    sources: dict[str, Path]  # the Parquet directory each run exported
    odd_topic: str  # the "topics" run's second topic (its records with odd keys)
    source_topic: str  # the Kafka-sourced run's source, read by group ``group``
    group: str
    ends: dict[int, int]  # the Kafka-sourced run's range: where its group stands after its COMMIT
    registry: RegistryEnv
    registry_file: Path  # the registry's credentials, as a user keeps them for the CLI

    def keys(self, case: str) -> Counter[bytes]:
        self.env.open_transactions(self.prefixes[case])
        return Counter(r.key for r in self.env.read_committed(self.topics[case]) if r.key)

    def kafka2pc(
        self,
        command: str,
        case: str,
        source: str = "parquet_frame",
        packing: tuple[str, str] = ONE_PARTITION_PER_FILE,
        more: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "airflow_provider_kafka2pc.cli", command, "--prefix", self.prefixes[case],
                "--json", "--bootstrap-servers", self.env.bootstrap, "--decision-topic", self.decisions]  # fmt: skip
        if command == "repair":
            topic = [] if case == "topics" else ["--topic", self.topics[case]]  # the frame's topic column
            argv += ["--run", RUN, "--source", f"tests.helpers.repair_sources:{source}", *topic,
                     "--spark-master", "local[2]", "--spark-conf", "spark.ui.enabled=false",
                     "--spark-conf", "=".join(packing),
                     "--spark-conf", f"spark.jars={JARS}", *more]  # fmt: skip
        env = {**os.environ, "KAFKA2PC_TEST_REPAIR_PARQUET": str(self.sources.get(case, "")),
               "KAFKA2PC_TEST_REPAIR_TOPIC": self.source_topic, "KAFKA2PC_TEST_REPAIR_GROUP": self.group,
               "KAFKA2PC_TEST_REPAIR_TOPICS": f"{self.topics['topics']},{self.odd_topic}",
               "PYSPARK_PYTHON": sys.executable}  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)

    def status(self, case: str) -> RunStatus:
        log = DecisionLog(self.env.config, topic=self.decisions)
        try:
            return log.read_for(self.prefixes[case], RUN).runs[(self.prefixes[case], RUN)].status
        finally:
            log.close()


def _write_files(spark: Any, directory: Path, prefix: str) -> None:
    """One Parquet file per future Spark partition, keys ``prefix/file/i``."""
    from pyspark.sql import functions as F

    df = spark.range(FILES * RECORDS, numPartitions=FILES).select(
        F.concat(F.lit(f"{prefix}/"), (F.col("id") / RECORDS).cast("int").cast("string"), F.lit("/"),
                 (F.col("id") % RECORDS).cast("string")).alias("key"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).alias("value"),
    )  # fmt: skip
    df.write.parquet(str(directory))


def _lose(spark: Any, env: KafkaEnv, decisions: str, prefix: str, topic: str, directory: Path,
          odd_topic: str | None = None, scheme: str = "xxh64t", formats: Any = None) -> None:  # fmt: skip
    """Export the files (to ``topic``, or with odd keys to ``odd_topic``), decide COMMIT, end the
    first transactions only: the broker aborts the rest."""
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.source_listing import record_source_files
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from tests.helpers.repair_sources import avro_frame, with_two_topics

    settings = ExportSettings(prefix, env.config, topic=topic, digest_scheme=scheme)
    os.environ["KAFKA2PC_TEST_REPAIR_PARQUET"] = str(directory)  # where avro_frame reads
    df = avro_frame(spark) if formats is not None else spark.read.parquet(str(directory)).select("key", "value")
    if odd_topic is not None:
        df = with_two_topics(df, topic, odd_topic)
    log = DecisionLog(env.config, topic=decisions)
    record_source_files(df, settings, lambda: log, prefix, RUN)  # as the export task does, before its window
    result = export_dataframe(df, settings, window=WindowSettings(handover_ms=1_000), formats=formats)
    cs = sorted(result.committables, key=lambda c: int(c.transactional_id.rsplit("-", 1)[1]))
    assert len(cs) == FILES and all(c.digest and c.digest.startswith(f"{scheme}:") for c in cs), cs
    with WireClient(env.config) as wire:
        decided = decide_commit(cs, wire, log, RUN, end_txn_timeout_s=2)
        assert isinstance(decided, Decided), decided
        TransactionResolver(wire).resolve([ref_of(c) for c in cs[: FILES - LOST]], Intent.COMMIT)
    log.close()


def _lose_kafka_run(spark: Any, env: KafkaEnv, decisions: str, prefix: str, topic: str, source_topic: str,
                    group: str) -> dict[int, int]:  # fmt: skip
    """As the export operator does with a KafkaSource: the range after the group's position, the
    output prepared, the offsets participant holding the range's ends; COMMIT decided, then only the
    offsets and the first output transactions ended. Returns the range's end offsets."""
    from airflow_provider_kafka2pc.operators.kafka_source import open_offsets_writer, send_offsets, take_snapshot
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.spark.window import WindowSettings
    from airflow_provider_kafka2pc.txn.kafka.clients import KafkaClients
    from airflow_provider_kafka2pc.txn.two_phase.prepare_session import PrepareSession
    from tests.helpers.repair_sources import kafka_source

    settings = ExportSettings(prefix, env.config, topic=topic, transaction_timeout_ms=CAP30_TXN_MAX_TIMEOUT_MS)
    os.environ.update(KAFKA2PC_TEST_REPAIR_TOPIC=source_topic, KAFKA2PC_TEST_REPAIR_GROUP=group)
    source = kafka_source()
    with PrepareSession(KafkaClients(env.config, decisions, 30), prefix, RUN) as session:
        read = take_snapshot(source, env.config, session, topic)
    offsets = open_offsets_writer(settings, read, CAP30_TXN_MAX_TIMEOUT_MS)
    assert offsets is not None
    df = source.dataframe(spark, env.config, read, None)
    result = export_dataframe(df, settings, window=WindowSettings(handover_ms=1_000))
    held = send_offsets(offsets, read, lambda: True)
    cs = sorted(result.committables, key=lambda c: int(c.transactional_id.rsplit("-", 1)[1]))
    assert len(cs) == KAFKA_PARTITIONS, cs
    log = DecisionLog(env.config, topic=decisions)
    with WireClient(env.config) as wire:
        decided = decide_commit([*cs, held], wire, log, RUN, end_txn_timeout_s=2, sources={prefix: read})
        assert isinstance(decided, Decided), decided
        done = [held, *cs[: KAFKA_PARTITIONS - KAFKA_LOST]]
        TransactionResolver(wire).resolve([ref_of(c) for c in done], Intent.COMMIT)
    log.close()
    return {p.partition: p.end for p in read.partitions}


def _fill(env: KafkaEnv, topic: str, key_prefix: str) -> None:
    """RECORDS committed records per partition of the source topic, keys ``{key_prefix}{i}``."""
    from confluent_kafka import Producer

    producer = Producer({**env.config, "linger.ms": 5})
    for i in range(KAFKA_PARTITIONS * RECORDS):
        producer.produce(topic, key=f"{key_prefix}{i}".encode(), value=b"v%d" % i, partition=i % KAFKA_PARTITIONS)
    assert producer.flush(30) == 0


def _warm_up(spark: Any, env: KafkaEnv, tag: str) -> None:
    """One small export, committed: the broker's transaction coordinators loaded and Spark's Python
    workers started before the runs."""
    from airflow_provider_kafka2pc.spark.job import export_dataframe
    from airflow_provider_kafka2pc.txn.two_phase.coordinator import commit_prepared

    topic = env.topic(1)
    df = spark.range(100, numPartitions=8).selectExpr("CAST(id AS STRING) AS value")
    from airflow_provider_kafka2pc.spark.window import WindowSettings

    settings = ExportSettings(f"rsp{tag}_warm", env.config, topic=topic)
    result = export_dataframe(df, settings, window=WindowSettings(handover_ms=1_000))
    log = DecisionLog(env.config, topic=f"decisions_repair_spark_{tag}")
    with WireClient(env.config) as wire:
        commit_prepared(result.committables, wire, log, "warm-up")
    log.close()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    stop_driver_jvm()  # a running JVM keeps its class path: this one needs Spark's Kafka source
    session = SparkSession.builder.master("local[2]").appName("kafka2pc-repair-tests").config(
        "spark.ui.enabled", "false"
    ).config(*ONE_PARTITION_PER_FILE).config("spark.jars", JARS).getOrCreate()  # fmt: skip
    yield session
    session.stop()


@pytest.fixture(scope="module")
def lost(
    spark: Any, kafka_cap30: KafkaEnv, schema_registry: RegistryEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LostRuns]:
    from airflow_provider_kafka2pc.spark.record_formats import RecordFormats
    from tests.helpers.repair_sources import AVRO_VALUE

    env, tmp = kafka_cap30, tmp_path_factory.mktemp("repair-spark")
    tag = uuid.uuid4().hex[:6]
    prefixes = {c: f"rsp{tag}_{c}" for c in CASES}
    topics = {c: env.topic(4) for c in CASES}
    decisions, sources = f"decisions_repair_spark_{tag}", {c: tmp / c for c in CASES}
    DecisionLog(env.config, topic=decisions).ensure_topic()
    _warm_up(spark, env, tag)
    odd_topic = env.topic(4)
    for case in CASES:
        _write_files(spark, sources[case], prefixes[case])
        formats = RecordFormats(schema_registry.settings(), value=AVRO_VALUE) if case == "avro" else None
        _lose(spark, env, decisions, prefixes[case], topics[case], sources[case],
              odd_topic if case == "topics" else None, "xxh64" if case == "old" else "xxh64t", formats)  # fmt: skip
    prefixes["kafka"], topics["kafka"] = f"rsp{tag}_kafka", env.topic(4)
    source_topic, group = env.topic(KAFKA_PARTITIONS), f"rsp{tag}_group"
    _fill(env, source_topic, f"{prefixes['kafka']}/")
    ends = _lose_kafka_run(spark, env, decisions, prefixes["kafka"], topics["kafka"], source_topic, group)
    record_lost(env.config, decisions, prefixes.values(), RUN, CAP30_TXN_MAX_TIMEOUT_MS)  # the broker aborts the rest
    registry_file = tmp / "registry.properties"
    registry_file.write_text(f"basic.auth.user.info={schema_registry.user}:{schema_registry.password}\n")
    runs = LostRuns(
        env, decisions, prefixes, topics, sources, odd_topic, source_topic, group, ends, schema_registry, registry_file
    )
    yield runs


def test_kafka2pc_repair_exports_the_lost_spark_partitions_again_exactly_once(
    lost: LostRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repaired once; ``--openlineage`` announces it through OpenLineage's own client (its file
    transport, configured as a user configures it: the environment) with the kafka2pc_repair facet."""
    assert sum(lost.keys("main").values()) == (FILES - LOST) * RECORDS
    assert lost.kafka2pc("list", "main").returncode == 4
    events = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "file")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__LOG_FILE_PATH", str(events))
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__APPEND", "true")
    done = lost.kafka2pc("repair", "main", more=("--openlineage",))
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["status"] == "REPAIRED" and report["repair"]["restored"] == LOST * RECORDS, report
    assert report["repaired_now"] is True and report["atomic"] is False, report
    [event] = [json.loads(line) for line in events.read_text().splitlines()]
    assert event["eventType"] == "COMPLETE" and event["job"]["name"] == f"kafka2pc.repair.{lost.prefixes['main']}"
    assert [o["name"] for o in event["outputs"]] == [lost.topics["main"]], event["outputs"]
    assert event["outputs"][0]["namespace"] == f"kafka://{lost.env.bootstrap.split(',')[0]}", event["outputs"]
    [repair] = event["run"]["facets"]["kafka2pc_repair"]["repairs"]
    assert repair["restoredRecords"] == LOST * RECORDS and repair["restoredTransactions"] == LOST, repair
    assert event["run"]["facets"]["kafka2pc_repair"]["atomic"] is False
    assert report["announced"] == [f"announced to OpenLineage: run {event['run']['runId']} of job default/"
                                   f"kafka2pc.repair.{lost.prefixes['main']}"], report  # fmt: skip
    seen = lost.keys("main")
    expected = {f"{lost.prefixes['main']}/{f}/{i}".encode() for f in range(FILES) for i in range(RECORDS)}
    assert set(seen) == expected and set(seen.values()) == {1}, (len(seen), seen.most_common(1))
    assert lost.env.open_transactions(lost.prefixes["main"]) == []
    assert lost.kafka2pc("list", "main").returncode == 0
    again = lost.kafka2pc("repair", "main")
    assert again.returncode == 0, again.stderr[-2000:]
    second = json.loads(again.stdout)
    assert second["repaired_now"] is False and second["outcome"].startswith("nothing to do: run "), second
    assert lost.keys("main") == seen


def test_a_rewritten_file_is_refused_before_anything_becomes_visible(lost: LostRuns, spark: Any) -> None:
    """First the same files under Spark's default packing (several small files per partition): the
    refusal says the files are the same but packed differently. Then the files rewritten: it names
    each file of a lost partition that was removed and each that was added."""
    visible = lost.keys("changed")
    packed = lost.kafka2pc("repair", "changed", packing=("spark.sql.files.openCostInBytes", str(4 * 1024 * 1024)))
    assert packed.returncode == 4, packed.stderr[-3000:]  # the run stays LOST
    assert "what changed in the files it read: Spark partition 4: the same files are packed differently: it read " in (
        packed.stderr
    ), packed.stderr[-3000:]
    assert lost.keys("changed") == visible and lost.env.open_transactions(lost.prefixes["changed"]) == []
    # Rewrite the source: the same files, but one record of every file changed (the lost ones too).
    from pyspark.sql import functions as F

    changed = lost.sources["changed"]
    df = spark.read.parquet(str(changed)).withColumn(
        "value", F.when(F.col("key").endswith("/7"), F.lit("changed")).otherwise(F.col("value"))
    )
    df.localCheckpoint().write.mode("overwrite").parquet(str(changed))
    done = lost.kafka2pc("repair", "changed")
    assert done.returncode == 4  # the run stays LOST
    assert "refused: the source no longer gives the records the run lost" in done.stderr, done.stderr[-3000:]
    assert "Spark partition" in done.stderr and "different keys, values, topics or partitions" in done.stderr, (
        done.stderr[-3000:]
    )
    # Overwritten: every file of the run is gone, new ones (other names) read instead.
    assert "what changed in the files it read: Spark partition 4: file://" in done.stderr, done.stderr[-3000:]
    assert ".parquet was removed; file://" in done.stderr and ".parquet was added" in done.stderr
    assert lost.keys("changed") == visible
    assert lost.env.open_transactions(lost.prefixes["changed"]) == []
    assert lost.status("changed") is RunStatus.LOST


def test_a_non_deterministic_plan_is_refused_before_writing(lost: LostRuns) -> None:
    visible = lost.keys("random")
    done = lost.kafka2pc("repair", "random", source="random_frame")
    assert done.returncode == 4  # the run stays LOST
    assert "cannot be repaired from this source: the frame's plan is not deterministic" in done.stderr, done.stderr
    assert lost.keys("random") == visible
    assert lost.env.open_transactions(lost.prefixes["random"]) == []
    assert lost.status("random") is RunStatus.LOST


def test_a_kafka_sourced_run_is_repaired_from_its_stored_range_and_its_group_does_not_move(lost: LostRuns) -> None:
    prefix = lost.prefixes["kafka"]
    assert group_offsets(lost.env, lost.group) == lost.ends  # moved with the run's COMMIT
    before = lost.keys("kafka")
    assert sum(before.values()) == (KAFKA_PARTITIONS - KAFKA_LOST) * RECORDS
    done = lost.kafka2pc("repair", "kafka", source="KAFKA_SOURCE")
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["status"] == "REPAIRED" and report["repair"]["restored"] == KAFKA_LOST * RECORDS, report
    seen = lost.keys("kafka")
    expected = {f"{prefix}/{i}".encode() for i in range(KAFKA_PARTITIONS * RECORDS)}
    assert set(seen) == expected and set(seen.values()) == {1}, (len(seen), seen.most_common(1))
    assert lost.env.open_transactions(prefix) == []
    assert group_offsets(lost.env, lost.group) == lost.ends  # the repair read the range, moved nothing
    assert lost.kafka2pc("list", "kafka").returncode == 0


def test_a_repair_whose_rows_swap_topics_is_refused_and_the_run_s_own_frame_repairs_it(lost: LostRuns) -> None:
    """Each transaction wrote to both topics, so the swapped frame writes to the topics each lost one
    did: the digest, which hashes where every record goes, tells them apart."""
    prefix, even, odd = lost.prefixes["topics"], lost.topics["topics"], lost.odd_topic

    def where() -> Counter[tuple[str, bytes]]:
        lost.env.open_transactions(prefix)
        return Counter((t, r.key) for t in (even, odd) for r in lost.env.read_committed(t) if r.key)

    visible = where()
    assert sum(visible.values()) == (FILES - LOST) * RECORDS
    swapped = lost.kafka2pc("repair", "topics", source="swapped_topic_frame")
    assert swapped.returncode == 4, swapped.stderr[-3000:]  # the run stays LOST
    assert "refused: the source no longer gives the records the run lost" in swapped.stderr, swapped.stderr[-3000:]
    assert "different keys, values, topics or partitions" in swapped.stderr, swapped.stderr[-3000:]
    assert where() == visible and lost.env.open_transactions(prefix) == []
    assert lost.status("topics") is RunStatus.LOST
    done = lost.kafka2pc("repair", "topics", source="two_topic_frame")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["status"] == "REPAIRED"
    expected = {
        (even if i % 2 == 0 else odd, f"{prefix}/{f}/{i}".encode()) for f in range(FILES) for i in range(RECORDS)
    }
    seen = where()
    assert set(seen) == expected and set(seen.values()) == {1}, (len(seen), seen.most_common(1))
    assert lost.env.open_transactions(prefix) == []


def test_a_run_recorded_before_topics_were_hashed_is_repaired_with_the_digest_it_recorded(lost: LostRuns) -> None:
    done = lost.kafka2pc("repair", "old")
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["status"] == "REPAIRED"
    seen = lost.keys("old")
    expected = {f"{lost.prefixes['old']}/{f}/{i}".encode() for f in range(FILES) for i in range(RECORDS)}
    assert set(seen) == expected and set(seen.values()) == {1}, (len(seen), seen.most_common(1))
    assert lost.env.open_transactions(lost.prefixes["old"]) == []


def test_an_avro_valued_run_is_repaired_from_the_cli_and_every_record_decodes(lost: LostRuns) -> None:
    """The run's values were framed for the registry (magic byte, schema id, Avro), and its digests
    hash those bytes: without the export's format the repair is refused, nothing written; with it
    (``--value-format`` and the registry, its credentials in a file) every record is there once and
    confluent-kafka's AvroDeserializer reads each."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    prefix, topic = lost.prefixes["avro"], lost.topics["avro"]
    visible = lost.keys("avro")
    assert sum(visible.values()) == (FILES - LOST) * RECORDS
    bare = lost.kafka2pc("repair", "avro", source="avro_frame")
    assert bare.returncode != 0, bare.stdout[-2000:]
    assert "--value-format" in bare.stderr, bare.stderr[-3000:]
    assert lost.keys("avro") == visible and lost.env.open_transactions(prefix) == []
    assert lost.status("avro") is RunStatus.LOST
    registry = ("--value-format", "tests.helpers.repair_sources:AVRO_VALUE",
                "--schema-registry-url", lost.registry.url,
                "--schema-registry-config-file", str(lost.registry_file))  # fmt: skip
    done = lost.kafka2pc("repair", "avro", source="avro_frame", more=registry)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["status"] == "REPAIRED"
    assert lost.registry.password not in done.stdout + done.stderr
    values = AvroDeserializer(lost.registry.confluent_client())
    records = lost.env.read_committed(topic)
    decoded = {r.key: values(r.value, SerializationContext(topic, MessageField.VALUE)) for r in records}
    texts = {f"{prefix}/{f}/{i}".encode(): f"value-{f * RECORDS + i}" for f in range(FILES) for i in range(RECORDS)}
    expected = {key: {"text": text, "length": len(text)} for key, text in texts.items()}
    assert len(records) == len(expected) and decoded == expected, (len(records), len(decoded))
    assert lost.env.open_transactions(prefix) == []
