"""The native producer: Arrow columns straight into librdkafka's batch API, no Python object per record.

``message_arrays.message_array`` turns Arrow string/binary columns into an array of
``rd_kafka_message_t`` (payload = data buffer address + offsets[i], length = offsets[i+1] -
offsets[i], NULL/0 for a null). ``NativeProducer`` hands such arrays to ``rd_kafka_produce_batch``
on a librdkafka handle of its own and otherwise offers the few ``confluent_kafka.Producer`` methods
the writers call, so ``native_writer.NativeTransactionalWriter`` is the Python
``TransactionalWriter`` (same life cycle, same proof, same errors) with another producer.

Records are copied by librdkafka (``RD_KAFKA_MSG_F_COPY``, as confluent-kafka's ``produce()``
does): the copy lands in the one allocation librdkafka makes per message anyway, the Arrow batch
may be freed as soon as the call returns, and memory stays bounded by
``queue.buffering.max.kbytes`` instead of by the Spark partition.

Delivery reports, statistics, errors and librdkafka's log lines come as events on the main queue
(``rd_kafka_conf_set_events``, ``log.queue``), served by ``poll()``/``flush()`` on the writer's own
thread. With ``delivery.report.only.error`` (set by ``DeliveryWriter``) a success produces no event
at all: a flush that ends with nothing outstanding and no error event proves every record.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_kafka2pc.txn.kafka import librdkafka as rd
from airflow_provider_kafka2pc.txn.kafka.config import is_secret_key
from airflow_provider_kafka2pc.txn.kafka.errors import LibraryUnavailableError
from airflow_provider_kafka2pc.txn.kafka.message_arrays import bytes_at, pyarrow_unsupported
from airflow_provider_kafka2pc.txn.kafka.writer import RefusedRecord
from airflow_provider_kafka2pc.txn.protocol.errors import Kafka2PCError, NativeUnsupportedError

log = logging.getLogger(__name__)

# confluent-kafka's Python-level settings: served here from events, never given to librdkafka.
_CALLBACKS = frozenset({"on_delivery", "error_cb", "stats_cb", "logger"})
_ERR_INVALID_ARG = -186
# A topic being created is unknown, then its partitions have no leader, for a moment.
_NOT_YET = frozenset({0, 3, 5})  # no error but no leaders, UNKNOWN_TOPIC_OR_PART, LEADER_NOT_AVAILABLE
_TOPIC_CREATION_WAIT_S = 5.0
ERR_UNKNOWN_PARTITION = -190
_EVENTS = rd.RD_KAFKA_EVENT_DR | rd.RD_KAFKA_EVENT_LOG | rd.RD_KAFKA_EVENT_ERROR | rd.RD_KAFKA_EVENT_STATS
_SYSLOG_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING}


def unavailable_reason() -> str | None:
    """Why the native path cannot run in this process, or None when it can."""
    try:
        import numpy  # noqa: F401

        rd.load()
    except ImportError as e:
        return f"numpy is not installed ({e})"
    except LibraryUnavailableError as e:
        return str(e)
    # An executor's pyarrow may be older than the driver's: its tasks take the Python loop then.
    return pyarrow_unsupported()


def unsupported_setting(config: Mapping[str, Any]) -> str | None:
    """A producer setting only confluent-kafka's Python layer understands (e.g. ``oauth_cb``), or None."""
    for key, value in config.items():
        if key in _CALLBACKS:
            continue
        if callable(value):
            return f"producer setting {key!r} is a Python callable, which librdkafka's C API cannot take"
        if not isinstance(value, str | int | float | bool):
            return f"producer setting {key!r} is a {type(value).__name__}; librdkafka's C API takes text and numbers"
    return None


class NativeProducer:
    """The ``confluent_kafka.Producer`` methods the writers call, on a librdkafka handle of its own,
    plus ``produce_messages`` for a whole ``rd_kafka_message_t`` array."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self._lib = rd.load()
        self._on_delivery: Callable[[Any, Any], None] | None = config.get("on_delivery")
        self._on_error: Callable[[Any], None] | None = config.get("error_cb")
        self._on_stats: Callable[[str], None] | None = config.get("stats_cb")
        self._logger: logging.Logger | None = config.get("logger")
        self._secrets = sorted(
            (str(v) for k, v in config.items() if is_secret_key(str(k)) and v), key=len, reverse=True
        )
        self._topics: dict[str, int] = {}
        self._partition_counts: dict[str, int] = {}  # topic -> partitions, from metadata, once known
        self._rk: int | None = None
        self._queue: int | None = None
        self._log_queue: int | None = None
        lib = self._lib
        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        try:
            for key, value in {**config, "log.queue": True}.items():
                if key in _CALLBACKS:
                    continue
                why_not = unsupported_setting({key: value})
                if why_not is not None:
                    raise NativeUnsupportedError(why_not)
                text = ("true" if value else "false") if isinstance(value, bool) else str(value)
                if lib.rd_kafka_conf_set(conf, key.encode(), text.encode(), errstr, len(errstr)) != rd.RD_KAFKA_CONF_OK:
                    reason = self._scrub(errstr.value.decode(errors="replace"))
                    raise KafkaException(KafkaError(_ERR_INVALID_ARG, f"producer setting {key!r}: {reason}"))
            lib.rd_kafka_conf_set_events(conf, _EVENTS)
            rk = lib.rd_kafka_new(rd.RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        except BaseException:
            lib.rd_kafka_conf_destroy(conf)
            raise
        if not rk:  # rd_kafka_new keeps the conf on failure
            lib.rd_kafka_conf_destroy(conf)
            reason = self._scrub(errstr.value.decode(errors="replace"))
            raise KafkaException(KafkaError(_ERR_INVALID_ARG, f"cannot create the producer: {reason}"))
        self._rk = rk
        self._queue = lib.rd_kafka_queue_get_main(rk)
        # Log lines on a queue of their own: rd_kafka_outq_len counts the main queue's events, and
        # with debug= set a steady stream of them there would keep flush() from ever seeing 0.
        self._log_queue = lib.rd_kafka_queue_new(rk)
        lib.rd_kafka_set_log_queue(rk, self._log_queue)

    # -- confluent_kafka.Producer's surface, as the writers use it ------------------------------

    def list_topics(self, timeout: float = -1) -> None:
        """Connect (metadata of the cluster, no topics); raises like confluent-kafka on failure."""
        md = ctypes.POINTER(rd.RdKafkaMetadata)()
        err = self._lib.rd_kafka_metadata(self._handle(), 0, None, ctypes.byref(md), _ms(timeout))
        self._raise_for_code(err)
        self._lib.rd_kafka_metadata_destroy(md)

    def partition_count(self, topic: str, wait_s: float = _TOPIC_CREATION_WAIT_S) -> int | None:
        """The topic's partition count from the cluster's metadata, once every partition has a
        leader (then kept).

        A topic the broker is creating (auto-created on the first request naming it) is unknown,
        then leaderless, for a moment: asked again for up to ``wait_s``. None if it still is, or
        the metadata names another error (not authorized): librdkafka does not know its
        partitions either, and producing meets the error."""
        known = self._partition_counts.get(topic)
        if known is not None:
            return known
        deadline = time.monotonic() + wait_s
        while True:
            md = ctypes.POINTER(rd.RdKafkaMetadata)()
            err = self._lib.rd_kafka_metadata(self._handle(), 0, self._topic(topic), ctypes.byref(md), 30_000)
            self._raise_for_code(err)
            try:
                error, count = _topic_state(md.contents, topic)
            finally:
                self._lib.rd_kafka_metadata_destroy(md)
            if count:
                self._partition_counts[topic] = count
                return count
            if error not in _NOT_YET or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def init_transactions(self, timeout: float = -1) -> None:
        self._raise_for_error(self._serving(lambda: self._lib.rd_kafka_init_transactions(self._handle(), _ms(timeout))))

    def begin_transaction(self) -> None:
        self._raise_for_error(self._lib.rd_kafka_begin_transaction(self._handle()))

    def abort_transaction(self, timeout: float = -1) -> None:
        # The abort purges the queued records and waits until their reports are served: another
        # thread serves them while this one waits inside librdkafka.
        self._raise_for_error(self._serving(lambda: self._lib.rd_kafka_abort_transaction(self._handle(), _ms(timeout))))

    def poll(self, timeout: float = 0) -> int:
        """Serve the events ready (waiting up to ``timeout`` s for the first); how many were served."""
        served = self._serve_queue(self._queue, timeout)
        return served + self._serve_queue(self._log_queue, 0)

    def _serve_queue(self, queue: int | None, timeout: float) -> int:
        lib = self._lib
        served = 0
        ev = lib.rd_kafka_queue_poll(queue, _ms(timeout))
        while ev:
            try:
                self._serve(ev)
            finally:
                lib.rd_kafka_event_destroy(ev)
            served += 1
            ev = lib.rd_kafka_queue_poll(queue, 0)
        return served

    def flush(self, timeout: float = -1) -> int:
        """Serve events until nothing is outstanding; returns what still is after ``timeout`` s.

        (``rd_kafka_flush`` would wait for reports nobody serves: with delivery reports as events
        it only waits, so this loop is the flush.)"""
        deadline = time.monotonic() + (timeout if timeout >= 0 else 1e9)
        while True:
            self.poll(0)
            outstanding = int(self._lib.rd_kafka_outq_len(self._handle()))
            left = deadline - time.monotonic()
            if outstanding == 0 or left <= 0:
                return outstanding
            self.poll(min(left, 0.005))  # a success makes no event: short waits, or each flush overshoots

    # -- the batch -------------------------------------------------------------------------------

    def produce_messages(self, topic: str, messages: Any, refused: Callable[[int, Any], None]) -> None:
        """Enqueue every message of the array (``message_array``) to ``topic``, in order.

        When every message has its partition, each run of messages to one partition (all of a
        partition's, after ``partition_order``) goes in one call to that partition: librdkafka then
        neither runs its partitioner nor adds the partition to the transaction per message, which
        halves its CPU per record. Otherwise the messages go in one call with their own partitions,
        ``RD_KAFKA_PARTITION_UA`` ones through librdkafka's partitioner. A refusal other than a full
        queue is handed to ``refused(index, error)`` and stops the call."""
        import numpy as np

        chosen = messages["partition"]
        if len(messages) and int(chosen.min()) >= 0:
            ends = [*(np.flatnonzero(np.diff(chosen)) + 1).tolist(), len(messages)]
            first = 0
            for end in ends:
                bad = self._produce_batch(topic, int(chosen[first]), messages, first, end)
                if bad is not None:
                    refused(*bad)
                    return
                first = end
            return
        bad = self._produce_batch(topic, rd.RD_KAFKA_PARTITION_UA, messages, 0, len(messages))
        if bad is not None:
            refused(*bad)

    def _produce_batch(self, topic: str, partition: int, messages: Any, start: int, end: int) -> tuple[int, Any] | None:
        """``rd_kafka_produce_batch`` of ``messages[start:end]`` to one partition, or each to its own
        (``RD_KAFKA_PARTITION_UA``); (index, error) of the first message refused for good, else None.

        A full local queue is waited out (serving events) and the rest retried from the first
        message refused: librdkafka refuses every message after it, so the order is kept."""
        import numpy as np
        from confluent_kafka import KafkaError

        lib, rkt = self._lib, self._topic(topic)
        flags = rd.RD_KAFKA_MSG_F_COPY
        if partition == rd.RD_KAFKA_PARTITION_UA:
            flags |= rd.RD_KAFKA_MSG_F_PARTITION
        size, base = messages.dtype.itemsize, messages.ctypes.data
        while start < end:
            good = lib.rd_kafka_produce_batch(rkt, partition, flags, base + start * size, end - start)
            if good == end - start:
                return None
            errors = messages["err"][start:end]
            bad = np.flatnonzero(errors)
            hard = bad[errors[bad] != rd.RD_KAFKA_RESP_ERR__QUEUE_FULL]
            if len(hard):
                return start + int(hard[0]), KafkaError(int(errors[hard[0]]))
            start += int(bad[0])
            self.poll(0.005)  # no event comes for a success: a short wait, then retry
        return None

    def destroy(self) -> None:
        """Destroy the handle; like confluent-kafka's on dropping its Producer, this leaves an open
        transaction open (close() would abort it; the native path has no close)."""
        rk, self._rk = self._rk, None
        if rk is None:
            return
        for rkt in self._topics.values():
            self._lib.rd_kafka_topic_destroy(rkt)
        self._topics.clear()
        for queue in (self._queue, self._log_queue):
            if queue:
                self._lib.rd_kafka_queue_destroy(queue)
        self._queue = self._log_queue = None
        self._lib.rd_kafka_destroy(rk)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.destroy()

    # -- internals -------------------------------------------------------------------------------

    def _handle(self) -> int:
        if self._rk is None:
            raise Kafka2PCError("the native producer has been destroyed")
        return self._rk

    def _topic(self, topic: str) -> int:
        rkt = self._topics.get(topic)
        if rkt is None:
            rkt = self._lib.rd_kafka_topic_new(self._handle(), topic.encode(), None)
            if not rkt:
                raise Kafka2PCError(f"librdkafka refused the topic name {topic!r}")
            self._topics[topic] = rkt
        return rkt

    def _serving(self, call: Callable[[], Any]) -> Any:
        """Run a blocking librdkafka call while another thread serves the event queue."""
        self._handle()  # a destroyed producer raises here, not in librdkafka on a NULL queue
        stop = threading.Event()
        failures: list[BaseException] = []

        def serve() -> None:
            while not stop.is_set():
                try:
                    self.poll(0.05)
                except BaseException as e:  # keep serving (the call waits for it); raised below
                    failures.append(e)

        server = threading.Thread(target=serve, name="kafka2pc-native-events", daemon=True)
        server.start()
        try:
            try:
                result = call()
            finally:
                stop.set()
                # Wake the server from its wait now rather than when the wait ends: each init or
                # abort took ~45 ms longer otherwise. A yield that finds no poll waiting returns
                # the next one at once (a poll that serves nothing, harmless to its callers).
                self._lib.rd_kafka_queue_yield(self._queue)
                server.join()
        except BaseException as e:
            for failure in failures:
                e.add_note(f"while serving librdkafka's events meanwhile: {failure!r}")
            raise
        if failures:
            raise failures[0]
        return result

    def _serve(self, ev: int) -> None:
        lib = self._lib
        kind = lib.rd_kafka_event_type(ev)
        if kind == rd.RD_KAFKA_EVENT_DR:
            self._serve_failed_deliveries(ev)
        elif kind == rd.RD_KAFKA_EVENT_STATS:
            if self._on_stats is not None:
                self._on_stats(lib.rd_kafka_event_stats(ev).decode())
        elif kind == rd.RD_KAFKA_EVENT_ERROR:
            if self._on_error is not None:
                from confluent_kafka import KafkaError

                reason = self._scrub((lib.rd_kafka_event_error_string(ev) or b"").decode(errors="replace"))
                fatal = bool(lib.rd_kafka_event_error_is_fatal(ev))
                self._on_error(KafkaError(lib.rd_kafka_event_error(ev), reason, fatal))
        elif kind == rd.RD_KAFKA_EVENT_LOG:
            fac, text, level = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
            if lib.rd_kafka_event_log(ev, ctypes.byref(fac), ctypes.byref(text), ctypes.byref(level)) == 0:
                facility = (fac.value or b"").decode(errors="replace")
                self._log(level.value, facility, (text.value or b"").decode(errors="replace"))

    def _serve_failed_deliveries(self, ev: int) -> None:
        """Delivery reports: failures only (``delivery.report.only.error``), one Python call each."""
        from confluent_kafka import KafkaError

        lib = self._lib
        count = int(lib.rd_kafka_event_message_count(ev))
        if count == 0:
            return
        array = (ctypes.POINTER(rd.RdKafkaMessage) * count)()
        got = int(lib.rd_kafka_event_message_array(ev, array, count))
        for i in range(got):
            m = array[i].contents
            if m.err == 0 or self._on_delivery is None:
                continue
            topic = (lib.rd_kafka_topic_name(m.rkt) or b"").decode()
            message = RefusedRecord(topic, m.partition, bytes_at(m.key, m.key_len), bytes_at(m.payload, m.len))
            self._on_delivery(KafkaError(m.err), message)

    def _log(self, level: int, facility: str, text: str) -> None:
        """librdkafka's line to the client's ``logger`` (``with_log``) or, like the Python writer
        without one, to stderr in librdkafka's own format (which ``spark/jvm_logs.py`` levels)."""
        text = self._scrub(text)
        if self._logger is not None:
            python_level = _SYSLOG_LEVELS.get(level, logging.INFO if level <= 6 else logging.DEBUG)
            self._logger.log(python_level, "%s [%s] %s", facility, "native", text)
            return
        now = time.time()
        sys.stderr.write(f"%{level}|{int(now)}.{int(now * 1000) % 1000:03d}|{facility}|kafka2pc-native| {text}\n")

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _raise_for_code(self, err: int) -> None:
        if err:
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(KafkaError(err))

    def _raise_for_error(self, error: int | None) -> None:
        """A ``rd_kafka_error_t*`` of the transactional API as confluent-kafka raises it."""
        if not error:
            return
        from confluent_kafka import KafkaError, KafkaException

        lib = self._lib
        try:
            code = lib.rd_kafka_error_code(error)
            reason = self._scrub((lib.rd_kafka_error_string(error) or b"").decode(errors="replace"))
            fatal = bool(lib.rd_kafka_error_is_fatal(error))
        finally:
            lib.rd_kafka_error_destroy(error)
        raise KafkaException(KafkaError(code, reason, fatal))


def _topic_state(md: Any, topic: str) -> tuple[int, int]:
    """(the topic's error, its partition count if every partition has a leader, else 0) in a metadata reply."""
    for i in range(md.topic_cnt):
        t = md.topics[i]
        if t.topic != topic.encode():
            continue
        if t.err:
            return t.err, 0
        partitions = [t.partitions[j] for j in range(t.partition_cnt)]
        led = bool(partitions) and all(not p.err and p.leader >= 0 for p in partitions)
        return (0, len(partitions)) if led else (next((p.err for p in partitions if p.err), 0), 0)
    return 3, 0  # not in the reply: unknown


def _ms(timeout_s: float) -> int:
    return -1 if timeout_s < 0 else int(timeout_s * 1000)


__all__ = [
    "ERR_UNKNOWN_PARTITION",
    "NativeProducer",
    "NativeUnsupportedError",
    "unavailable_reason",
    "unsupported_setting",
]
