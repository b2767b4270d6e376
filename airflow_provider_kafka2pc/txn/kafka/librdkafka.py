"""Every ctypes declaration kafka2pc relies on, in one place: librdkafka as shipped in confluent-kafka's wheel.

The native writer (``txn/kafka/native.py``) calls the same librdkafka the Python writer uses through
confluent-kafka, so its SASL/SSL support is the same and no compiler is needed. What it relies on
is the public C API of ``rdkafka.h``: the functions declared below and the layouts of
``rd_kafka_message_t`` (72 bytes on 64-bit) and of the three metadata structs read.
``tests/unit/test_native.py`` checks them against the loaded library. Nothing here imports numpy or pyarrow.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_size_t, c_void_p
from functools import lru_cache
from typing import Any

from airflow_provider_kafka2pc.txn.kafka.errors import LibraryUnavailableError


class RdKafkaMessage(ctypes.Structure):
    """``rd_kafka_message_t`` (rdkafka.h); the message array's element, also in delivery reports."""

    _fields_ = [
        ("err", c_int),  # rd_kafka_resp_err_t
        ("rkt", c_void_p),
        ("partition", c_int32),
        ("payload", c_void_p),
        ("len", c_size_t),
        ("key", c_void_p),
        ("key_len", c_size_t),
        ("offset", c_int64),
        ("_private", c_void_p),
    ]


MESSAGE_SIZE = 72  # sizeof(rd_kafka_message_t) on the 64-bit platforms the wheels are built for


class RdKafkaMetadataPartition(ctypes.Structure):
    """``rd_kafka_metadata_partition_t``: a partition's id, error and leader."""

    _fields_ = [
        ("id", c_int32),
        ("err", c_int),  # rd_kafka_resp_err_t
        ("leader", c_int32),
        ("replica_cnt", c_int),
        ("replicas", c_void_p),  # int32_t*, not read
        ("isr_cnt", c_int),
        ("isrs", c_void_p),  # int32_t*, not read
    ]


class RdKafkaMetadataTopic(ctypes.Structure):
    """``rd_kafka_metadata_topic_t``: a topic's name, partition count and error, as ``rd_kafka_metadata`` gives them."""

    _fields_ = [
        ("topic", c_char_p),
        ("partition_cnt", c_int),
        ("partitions", POINTER(RdKafkaMetadataPartition)),
        ("err", c_int),  # rd_kafka_resp_err_t
    ]


class RdKafkaMetadata(ctypes.Structure):
    """``rd_kafka_metadata_t``: only the topics are read."""

    _fields_ = [
        ("broker_cnt", c_int),
        ("brokers", c_void_p),  # rd_kafka_metadata_broker_t*, not read
        ("topic_cnt", c_int),
        ("topics", POINTER(RdKafkaMetadataTopic)),
        ("orig_broker_id", c_int32),
        ("orig_broker_name", c_char_p),
    ]


RD_KAFKA_PRODUCER = 0
RD_KAFKA_CONF_OK = 0
RD_KAFKA_PARTITION_UA = -1
RD_KAFKA_MSG_F_COPY = 0x2
RD_KAFKA_MSG_F_PARTITION = 0x8
RD_KAFKA_RESP_ERR__QUEUE_FULL = -184
RD_KAFKA_RESP_ERR__TIMED_OUT = -185
RD_KAFKA_EVENT_DR = 0x1
RD_KAFKA_EVENT_LOG = 0x4
RD_KAFKA_EVENT_ERROR = 0x8
RD_KAFKA_EVENT_STATS = 0x40

# name: (restype, argtypes)
_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_version": (c_int, []),
    "rd_kafka_conf_new": (c_void_p, []),
    "rd_kafka_conf_destroy": (None, [c_void_p]),
    "rd_kafka_conf_set": (c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_size_t]),
    "rd_kafka_conf_set_events": (None, [c_void_p, c_int]),
    "rd_kafka_new": (c_void_p, [c_int, c_void_p, c_char_p, c_size_t]),
    "rd_kafka_destroy": (None, [c_void_p]),
    "rd_kafka_outq_len": (c_int, [c_void_p]),
    "rd_kafka_metadata": (c_int, [c_void_p, c_int, c_void_p, POINTER(POINTER(RdKafkaMetadata)), c_int]),
    "rd_kafka_metadata_destroy": (None, [POINTER(RdKafkaMetadata)]),
    "rd_kafka_queue_get_main": (c_void_p, [c_void_p]),
    "rd_kafka_queue_new": (c_void_p, [c_void_p]),
    "rd_kafka_queue_destroy": (None, [c_void_p]),
    "rd_kafka_set_log_queue": (c_int, [c_void_p, c_void_p]),
    "rd_kafka_queue_poll": (c_void_p, [c_void_p, c_int]),
    "rd_kafka_queue_yield": (None, [c_void_p]),
    "rd_kafka_event_type": (c_int, [c_void_p]),
    "rd_kafka_event_destroy": (None, [c_void_p]),
    "rd_kafka_event_message_array": (c_size_t, [c_void_p, POINTER(POINTER(RdKafkaMessage)), c_size_t]),
    "rd_kafka_event_message_count": (c_size_t, [c_void_p]),
    "rd_kafka_event_stats": (c_char_p, [c_void_p]),
    "rd_kafka_event_log": (c_int, [c_void_p, POINTER(c_char_p), POINTER(c_char_p), POINTER(c_int)]),
    "rd_kafka_event_error": (c_int, [c_void_p]),
    "rd_kafka_event_error_string": (c_char_p, [c_void_p]),
    "rd_kafka_event_error_is_fatal": (c_int, [c_void_p]),
    "rd_kafka_topic_new": (c_void_p, [c_void_p, c_char_p, c_void_p]),
    "rd_kafka_topic_destroy": (None, [c_void_p]),
    "rd_kafka_topic_name": (c_char_p, [c_void_p]),
    "rd_kafka_produce_batch": (c_int, [c_void_p, c_int32, c_int, c_void_p, c_int]),
    "rd_kafka_msg_partitioner_murmur2": (c_int32, [c_void_p, c_char_p, c_size_t, c_int32, c_void_p, c_void_p]),
    "rd_kafka_init_transactions": (c_void_p, [c_void_p, c_int]),
    "rd_kafka_begin_transaction": (c_void_p, [c_void_p]),
    "rd_kafka_abort_transaction": (c_void_p, [c_void_p, c_int]),
    "rd_kafka_error_code": (c_int, [c_void_p]),
    "rd_kafka_error_string": (c_char_p, [c_void_p]),
    "rd_kafka_error_is_fatal": (c_int, [c_void_p]),
    "rd_kafka_error_destroy": (None, [c_void_p]),
    "rd_kafka_err2str": (c_char_p, [c_int]),
}


def library_path() -> str:
    """The librdkafka confluent-kafka's extension has loaded into this process: the very library,
    not one beside it (``/proc/self/maps``); else the one in the wheel's ``confluent_kafka.libs/``."""
    import confluent_kafka

    mapped = _mapped_librdkafka()
    if mapped is not None:
        return mapped
    site = os.path.dirname(os.path.dirname(os.path.abspath(confluent_kafka.__file__)))
    found = sorted(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*")))
    if len(found) != 1:
        raise LibraryUnavailableError(
            f"{len(found)} librdkafka*.so in {os.path.join(site, 'confluent_kafka.libs')}, not one "
            "(confluent-kafka not installed from a manylinux wheel?)"
        )
    return found[0]


def _mapped_librdkafka() -> str | None:
    """The path of the librdkafka mapped into this process, if exactly one is (Linux only)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if "librdkafka" in line and line.count(" ") >= 5}
    except OSError:
        return None
    paths = {p for p in paths if os.path.basename(p).startswith("librdkafka") and os.path.exists(p)}
    return paths.pop() if len(paths) == 1 else None


@lru_cache(maxsize=1)
def load() -> Any:
    """The library with every function above declared; raises ``LibraryUnavailableError``."""
    if sys.byteorder != "little" or ctypes.sizeof(c_void_p) != 8:
        raise LibraryUnavailableError("the native writer supports 64-bit little-endian platforms only")
    if ctypes.sizeof(RdKafkaMessage) != MESSAGE_SIZE:
        raise LibraryUnavailableError(f"rd_kafka_message_t is {ctypes.sizeof(RdKafkaMessage)} bytes, not 72")
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryUnavailableError(f"cannot load {path}: {e}") from e
    for name, (restype, argtypes) in _FUNCTIONS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise LibraryUnavailableError(f"{path} has no {name}") from e
        fn.restype, fn.argtypes = restype, argtypes
    if lib.rd_kafka_version() < 0x02000000:
        raise LibraryUnavailableError(f"{path} is librdkafka {lib.rd_kafka_version():#x}, older than 2.0")
    return lib


def field_offsets() -> dict[str, int]:
    """``rd_kafka_message_t`` field name -> byte offset, as ctypes lays the struct out."""
    return {field[0]: getattr(RdKafkaMessage, field[0]).offset for field in RdKafkaMessage._fields_}
