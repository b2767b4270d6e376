"""A local server a test starts and stops: ``with`` starts it and always stops it."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Service:
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
