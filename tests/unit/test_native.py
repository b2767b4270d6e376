"""The native path without a broker: the ctypes surface it relies on, and Arrow -> rd_kafka_message_t."""

from __future__ import annotations

import ctypes
import logging
import socket
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_kafka2pc.txn.kafka import java_partitioner, message_arrays, native
from airflow_provider_kafka2pc.txn.kafka import librdkafka as rd
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError


def _read(pointer: int, length: int) -> bytes | None:
    return None if pointer == 0 else ctypes.string_at(pointer, length)


def _rows(messages: Any) -> list[tuple[bytes | None, bytes | None, int]]:
    return [
        (_read(int(m["key"]), int(m["key_len"])), _read(int(m["payload"]), int(m["len"])), int(m["partition"]))
        for m in messages
    ]


# -- the surface -------------------------------------------------------------------------------


def test_every_declared_symbol_is_in_the_wheels_librdkafka() -> None:
    assert native.unavailable_reason() is None
    lib = rd.load()
    assert lib.rd_kafka_version() >= 0x02000000
    assert "confluent_kafka.libs" in rd.library_path()


def test_rd_kafka_message_t_layout_is_the_64_bit_abi() -> None:
    assert ctypes.sizeof(rd.RdKafkaMessage) == rd.MESSAGE_SIZE == 72
    assert rd.field_offsets() == {
        "err": 0,
        "rkt": 8,
        "partition": 16,
        "payload": 24,
        "len": 32,
        "key": 40,
        "key_len": 48,
        "offset": 56,
        "_private": 64,
    }
    dtype = message_arrays.message_dtype()
    assert dtype.itemsize == 72
    assert {name: dtype.fields[name][1] for name in dtype.names} == rd.field_offsets()


def test_metadata_structs_layout_is_the_64_bit_abi() -> None:
    """``rd_kafka_metadata_t``, ``rd_kafka_metadata_topic_t`` and ``rd_kafka_metadata_partition_t`` as
    rdkafka.h lays them out on 64-bit."""
    topic = {f[0]: getattr(rd.RdKafkaMetadataTopic, f[0]).offset for f in rd.RdKafkaMetadataTopic._fields_}
    partition = {f[0]: getattr(rd.RdKafkaMetadataPartition, f[0]).offset for f in rd.RdKafkaMetadataPartition._fields_}
    assert partition == {"id": 0, "err": 4, "leader": 8, "replica_cnt": 12, "replicas": 16, "isr_cnt": 24, "isrs": 32}
    assert ctypes.sizeof(rd.RdKafkaMetadataPartition) == 40
    assert topic == {"topic": 0, "partition_cnt": 8, "partitions": 16, "err": 24}
    assert ctypes.sizeof(rd.RdKafkaMetadataTopic) == 32
    metadata = {f[0]: getattr(rd.RdKafkaMetadata, f[0]).offset for f in rd.RdKafkaMetadata._fields_}
    assert metadata == {
        "broker_cnt": 0,
        "brokers": 8,
        "topic_cnt": 16,
        "topics": 24,
        "orig_broker_id": 32,
        "orig_broker_name": 40,
    }


def test_messages_round_trip_through_librdkafka(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """librdkafka reads our array (payload, len, key, key_len, partition, flags) and writes err back into
    it; its delivery reports come back through the same struct: every offset is used both ways."""
    failed: list[tuple[str, str, int, bytes | None, bytes | None]] = []
    config = {
        "bootstrap.servers": "127.0.0.1:1",  # nothing listens: every record times out
        "message.timeout.ms": 200,
        "message.max.bytes": 1000,
        "delivery.report.only.error": True,
        "on_delivery": lambda err, m: failed.append((err.name(), m.topic(), m.partition(), m.key(), m.value())),
        "logger": logging.getLogger("test-native"),
    }
    caplog.set_level(logging.DEBUG, logger="test-native")
    p = native.NativeProducer(config)
    try:
        values = pa.array(["v0", None, "", "v3"])
        keys = pa.array([b"k0", b"k1", None, b""], pa.binary())
        refused: list[tuple[int, str]] = []
        messages = message_arrays.message_array(values, keys)
        p.produce_messages("t_roundtrip", messages, lambda i, e: refused.append((i, e.name())))
        assert refused == []
        assert p.flush(10) == 0
        assert sorted(failed, key=lambda f: f[3] or b"") == sorted(
            [
                ("_MSG_TIMED_OUT", "t_roundtrip", -1, b"k0", b"v0"),
                ("_MSG_TIMED_OUT", "t_roundtrip", -1, b"k1", None),
                ("_MSG_TIMED_OUT", "t_roundtrip", -1, None, b""),
                ("_MSG_TIMED_OUT", "t_roundtrip", -1, b"", b"v3"),
            ],
            key=lambda f: f[3] or b"",
        )
        big = message_arrays.message_array(pa.array([b"x", b"y" * 5000, b"z"]))
        p.produce_messages("t_roundtrip", big, lambda i, e: refused.append((i, e.name())))
        assert refused == [(1, "MSG_SIZE_TOO_LARGE")]
        assert int(big["err"][1]) == 10 and int(big["err"][0]) == 0  # written back at offset 0
    finally:
        p.destroy()
    # librdkafka's lines (connection refused) went through the logger, none to stderr raw.
    assert any("127.0.0.1:1" in r.getMessage() and r.levelno >= logging.WARNING for r in caplog.records)
    assert "127.0.0.1:1" not in capfd.readouterr().err


def test_a_bad_setting_is_named_and_a_secret_is_not_shown() -> None:
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match=r"producer setting 'no\.such\.setting'"):
        native.NativeProducer({"bootstrap.servers": "127.0.0.1:1", "no.such.setting": "1"})
    with pytest.raises(KafkaException) as e:  # librdkafka quotes the refused value: it is a secret's here
        native.NativeProducer(
            {"bootstrap.servers": "127.0.0.1:1", "sasl.password": "hunter2secret", "compression.type": "hunter2secret"}
        )
    assert "compression.type" in str(e.value) and "hunter2secret" not in str(e.value)
    assert native.unsupported_setting({"oauth_cb": lambda _c: ("t", time.time() + 60)}) is not None
    assert native.unsupported_setting({"stats_cb": print, "acks": "all"}) is None


# -- Arrow -> messages -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [pa.string(), pa.binary(), pa.large_string(), pa.large_binary()])
def test_keys_values_and_nulls_of_every_string_and_binary_type(kind: pa.DataType) -> None:
    raw = ["alpha", None, "", "δέλτα", "e" * 300]
    values = pa.array(raw, kind)
    keys = pa.array(list(reversed(raw)), kind)
    got = _rows(message_arrays.message_array(values, keys))
    enc = [None if s is None else s.encode() for s in raw]
    assert got == [(k, v, -1) for k, v in zip(reversed(enc), enc, strict=True)]


def test_slices_with_a_non_zero_offset_point_into_the_parents_buffers() -> None:
    values = pa.array([f"value-{i}" if i % 7 else None for i in range(100)])
    keys = pa.array([f"key-{i}".encode() if i % 5 else None for i in range(100)], pa.binary())
    batch = pa.record_batch([keys, values], names=["key", "value"])
    for start, length in ((0, 100), (13, 40), (99, 1), (50, 0)):
        part = batch.slice(start, length)
        assert part.column(1).offset == start
        got = _rows(message_arrays.message_array(part.column(1), part.column(0)))
        want = [
            (None if i % 5 == 0 else f"key-{i}".encode(), None if i % 7 == 0 else f"value-{i}".encode(), -1)
            for i in range(start, start + length)
        ]
        assert got == want


def test_explicit_partitions_and_unassigned_ones() -> None:
    values = pa.array([b"a", b"b", b"c", b"d"])
    got = message_arrays.message_array(
        values, None, message_arrays.explicit_partitions(pa.array([3, None, -5, 0], pa.int64()), 4)
    )
    assert [int(p) for p in got["partition"]] == [3, -1, -1, 0]
    assert [int(p) for p in message_arrays.message_array(values)["partition"]] == [-1, -1, -1, -1]
    assert [int(k) for k in got["key"]] == [0, 0, 0, 0]  # no key column: NULL keys


def test_a_partition_above_int32_is_refused_not_wrapped_onto_another() -> None:
    with pytest.raises(Kafka2PCError, match=r"row 1 is 4294967297, above the largest partition number"):
        message_arrays.explicit_partitions(pa.array([0, 2**32 + 1], pa.int64()), 2)


def test_an_all_empty_column_still_gives_non_null_pointers() -> None:
    got = _rows(message_arrays.message_array(pa.array(["", "", None]), pa.array([b"", None, b""])))
    assert got == [(b"", b"", -1), (None, b"", -1), (b"", None, -1)]


def test_other_column_types_are_refused() -> None:
    with pytest.raises(native.NativeUnsupportedError, match="int64"):
        message_arrays.message_array(pa.array([1, 2]))


# -- Java's partitioner -------------------------------------------------------------------------

# Kafka's own reference values (clients' UtilsTest.testMurmur2), as Java's signed int.
_KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("kind", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_murmur2_gives_kafkas_reference_values(kind: pa.DataType) -> None:
    keys = list(_KAFKA_MURMUR2)
    column = pa.array([k if kind in (pa.binary(), pa.large_binary()) else k.decode() for k in keys], kind)
    got = java_partitioner.java_murmur2(column)
    assert [int(h) - (1 << 32) if h >= 1 << 31 else int(h) for h in got] == list(_KAFKA_MURMUR2.values())


def test_murmur2_partitions_agree_with_librdkafkas_own_partitioner() -> None:
    """librdkafka's ``rd_kafka_msg_partitioner_murmur2`` (Java-compatible, C) is the oracle, over keys
    of every length from 0 to 40 bytes, in a slice of a bigger array."""
    import random

    rng = random.Random(7)
    keys = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    column = pa.array([b"skipped", *keys, b"after"], pa.binary()).slice(1, len(keys))
    partitioner = rd.load().rd_kafka_msg_partitioner_murmur2
    want = [partitioner(None, k, len(k), 7919, None, None) for k in keys]
    got = (java_partitioner.java_murmur2(column) & 0x7FFFFFFF) % 7919
    assert [int(p) for p in got] == want
    # Keys longer than numpy hashes (one by one through librdkafka), among short ones and nulls.
    mixed = [b"short", bytes(range(256)) * 2, None, b"x" * 257, b"", b"y" * 5000, b"abc"]
    column = pa.array(mixed, pa.binary())
    got = java_partitioner.java_partitions(
        column, message_arrays.explicit_partitions(None, len(mixed)), 7919, keyless_partition=3
    )
    want = [3 if k is None else partitioner(None, k, len(k), 7919, None, None) for k in mixed]
    assert got.tolist() == want
    # numpy alone, no length limit: each word round on the keys still that long.
    hashed = (java_partitioner.java_murmur2(column) & 0x7FFFFFFF) % 7919
    keyed = [(int(h), partitioner(None, k, len(k), 7919, None, None)) for h, k in zip(hashed, mixed, strict=True) if k]
    assert all(h == w for h, w in keyed) and len(keyed) == 5


def test_java_partitions_keep_explicit_ones_and_group_the_keyless() -> None:
    keys = pa.array([b"foobar", None, b"abc", None, b"21"])
    explicit = message_arrays.explicit_partitions(pa.array([None, None, 2, 1, -1], pa.int32()), 5)
    # foobar: (-790332482 & 0x7fffffff) % 50 = 16; 21: (-973932308 & 0x7fffffff) % 50 = 40
    assert java_partitioner.java_partitions(keys, explicit, 50, keyless_partition=9).tolist() == [16, 9, 2, 1, 40]
    no_keys = message_arrays.explicit_partitions(None, 3)
    assert java_partitioner.java_partitions(None, no_keys, 4, keyless_partition=3).tolist() == [3, 3, 3]


def test_records_are_laid_out_by_partition_each_in_the_frames_order() -> None:
    partitions = message_arrays.explicit_partitions(pa.array([2, 0, 2, 1, 0, 2], pa.int32()), 6)
    order = message_arrays.partition_order(partitions)
    assert order is not None and order.tolist() == [1, 4, 3, 0, 2, 5]
    values = pa.array([b"a", b"b", b"c", b"d", b"e", b"f"])
    keys = pa.array(["k0", None, "k2", "k3", "k4", "k5"]).slice(0)
    got = _rows(message_arrays.message_array(values, keys, partitions, order))
    assert got == [
        (None, b"b", 0),
        (b"k4", b"e", 0),
        (b"k3", b"d", 1),
        (b"k0", b"a", 2),
        (b"k2", b"c", 2),
        (b"k5", b"f", 2),
    ]
    assert (
        message_arrays.partition_order(message_arrays.explicit_partitions(pa.array([0, 0, 1, 3], pa.int32()), 4))
        is None
    )
    wide = message_arrays.explicit_partitions(pa.array([70_000, 3, 70_000, 2], pa.int32()), 4)  # above 16 bits
    assert message_arrays.partition_order(wide).tolist() == [3, 1, 0, 2]


# -- what the native path takes, and how it serves librdkafka -----------------------------------


def test_the_library_is_the_one_confluent_kafka_has_loaded() -> None:
    import confluent_kafka  # noqa: F401  (loads its librdkafka)

    assert rd.library_path() == rd._mapped_librdkafka()


def test_a_setting_that_is_not_text_or_a_number_is_unsupported_not_an_error() -> None:
    assert native.unsupported_setting({"acks": "all", "linger.ms": 5, "enable.idempotence": True}) is None
    assert "is a dict" in str(native.unsupported_setting({"default.topic.config": {"acks": "all"}}))
    assert "callable" in str(native.unsupported_setting({"oauth_cb": lambda _: ("t", 0.0)}))
    with pytest.raises(native.NativeUnsupportedError, match=r"'default\.topic\.config' is a dict"):
        native.NativeProducer({"bootstrap.servers": "127.0.0.1:1", "default.topic.config": {"acks": "all"}})


@pytest.mark.parametrize(
    "encode",
    [
        lambda a: a.dictionary_encode(),
        lambda a: a.cast(pa.string_view()),
        lambda a: a.cast(pa.binary()).cast(pa.binary_view()),
    ],
    ids=["dictionary", "string_view", "binary_view"],
)
def test_dictionary_and_view_columns_are_made_plain_first_and_give_the_same_records(encode: Any) -> None:
    values, keys = pa.array(["v0", None, "", "v0", "v4"]), pa.array(["k0", "k1", None, "k0", ""])
    want = _rows(message_arrays.message_array(values, keys))
    with pytest.raises(native.NativeUnsupportedError, match="see binary_column"):
        message_arrays.message_array(encode(values), encode(keys))
    plain_values, plain_keys = message_arrays.binary_column(encode(values)), message_arrays.binary_column(encode(keys))
    assert _rows(message_arrays.message_array(plain_values, plain_keys)) == want
    assert java_partitioner.java_murmur2(plain_keys).tolist() == java_partitioner.java_murmur2(keys).tolist()


def test_a_failure_while_serving_events_during_a_blocking_call_is_raised_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = native.NativeProducer({"bootstrap.servers": "127.0.0.1:1"})
    try:
        calls = iter(range(1000))

        def failing_poll(timeout: float = 0) -> int:
            if next(calls) == 0:
                raise RuntimeError("a delivery callback failed")
            time.sleep(timeout)
            return 0

        monkeypatch.setattr(p, "poll", failing_poll)

        def blocking_call() -> int:
            time.sleep(0.3)  # the server polls (and fails once) meanwhile
            return 7

        with pytest.raises(RuntimeError, match="a delivery callback failed"):
            p._serving(blocking_call)
        calls = iter(range(1000))

        def failing_call() -> None:
            time.sleep(0.3)
            raise ValueError("the abort failed")

        with pytest.raises(ValueError, match="the abort failed") as raised:
            p._serving(failing_call)
        assert any("a delivery callback failed" in note for note in raised.value.__notes__)
        monkeypatch.undo()
        assert p._serving(lambda: 7) == 7
    finally:
        p.destroy()


def test_the_event_server_of_a_blocking_call_is_woken_when_the_call_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving thread waits inside ``rd_kafka_queue_poll``; once the call is done it is woken
    (``rd_kafka_queue_yield``), not left to the end of its wait: here a 60 s wait on a queue no
    event reaches (the "broker" accepts the connection and never answers), so without the
    wake-up ``_serving`` would not return within the 10 s allowed."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        p = native.NativeProducer(
            {"bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}", "api.version.request.timeout.ms": 120_000}
        )
        monkeypatch.setattr(p, "poll", lambda timeout=0: p._serve_queue(p._queue, 60))
        results: list[int] = []
        caller = threading.Thread(target=lambda: results.append(p._serving(lambda: time.sleep(0.2) or 7)), daemon=True)
        caller.start()
        try:
            caller.join(10)
            assert results == [7], "the event server kept waiting after the blocking call had returned"
        finally:
            p._lib.rd_kafka_queue_yield(p._queue)  # on failure too: no poll may wait on a destroyed handle
            caller.join()
            monkeypatch.undo()
            p.destroy()


def test_debug_log_lines_do_not_hold_a_flush_back() -> None:
    """With ``debug=all`` librdkafka logs without pause (here: reconnecting to a closed port). The
    lines wait on a queue of their own, so ``rd_kafka_outq_len``, which the flush waits to reach 0,
    does not count them: a flush is never held back, or failed at its deadline, by log lines."""
    lines: list[str] = []
    logger = logging.getLogger("test-native-debug")
    logger.addHandler(handler := logging.Handler())
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    p = native.NativeProducer(
        {"bootstrap.servers": "127.0.0.1:1", "debug": "all", "reconnect.backoff.ms": 1, "logger": logger}
    )
    try:
        time.sleep(0.5)  # lines pile up, unserved
        lib, kinds = p._lib, []
        ev = lib.rd_kafka_queue_poll(p._queue, 0)  # what rd_kafka_outq_len counts: the main queue
        while ev:
            kinds.append(lib.rd_kafka_event_type(ev))
            lib.rd_kafka_event_destroy(ev)
            ev = lib.rd_kafka_queue_poll(p._queue, 0)
        assert rd.RD_KAFKA_EVENT_LOG not in kinds
        assert p.flush(1.0) == 0
        assert len(lines) > 10  # served all the same, from their own queue
    finally:
        p.destroy()
        logger.removeHandler(handler)
