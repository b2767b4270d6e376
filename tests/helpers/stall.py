"""How long an open transaction hides other producers' records from read_committed readers.

A plain (non-transactional) producer writes one record every ``interval_s`` to the exported topic,
each carrying its send time; a read_committed consumer of every partition notes when it sees each
one. A record waits behind the first open transaction of its partition (the last stable offset), so
its delay is what every read_committed reader of the topic waits while an export's window is open.
Used by the window tests and the benchmark's window row.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MARK = b"kafka2pc-stall-probe"


@dataclass
class StallProbe:
    config: Mapping[str, Any]
    topic: str
    interval_s: float = 0.1
    sent: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> StallProbe:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

        self._producer = Producer({**self.config, "acks": "all", "linger.ms": 0})
        self._consumer = Consumer(
            {
                **self.config,
                "group.id": f"stall-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        partitions = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        # From the beginning: only the probe's own records count (its key and mark), so nothing is
        # asked of a just-created topic's leader (a watermark request right after creation met
        # NOT_LEADER_FOR_PARTITION in CI).
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._read, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def _send(self) -> None:
        n = 0
        while not self._stop.wait(self.interval_s):
            key = f"probe-{n}"
            self.sent[key] = time.monotonic()
            self._producer.produce(self.topic, key=key.encode(), value=MARK)
            self._producer.poll(0)
            n += 1
        self._producer.flush(30)

    def _read(self) -> None:
        while not self._stop.is_set() or len(self.seen) < len(self.sent):
            msg = self._consumer.poll(0.05)
            if msg is None or msg.error() is not None or msg.value() != MARK:
                if self._stop.is_set() and time.monotonic() > self._drain_until:
                    return
                continue
            key = msg.key().decode()
            if key in self.sent:
                self.seen.setdefault(key, time.monotonic())

    def stop(self, drain_s: float = 30.0) -> None:
        self._drain_until = time.monotonic() + drain_s
        self._stop.set()
        for t in self._threads:
            t.join(drain_s + 5)
        self._consumer.close()

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self.stop()

    def delays(self) -> list[float]:
        """Seconds from send to read_committed visibility, per probe record sent (unseen: infinite)."""
        return [self.seen.get(k, float("inf")) - t for k, t in self.sent.items()]

    _drain_until: float = float("inf")
