"""What open pages are sent as they stay open: made at most once a second,
however many pages are open, and shared by all of them.

Each open overview asks for the latest fragment every second; the first to
ask after it went stale makes a new one (one read of the database) while the
others wait for it and take the same. Fifty open tabs cost the database what
one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Shared(Generic[T]):
    def __init__(self, make: Callable[[], T], every: float = 1.0) -> None:
        self._make = make
        self._every = every
        self._lock = threading.Lock()
        self._value: T | None = None
        self._made = float("-inf")

    def latest(self) -> T:
        """The value made within the last `every` seconds, else a new one."""
        with self._lock:
            if self._value is None or time.monotonic() - self._made >= self._every:
                self._value = self._make()
                self._made = time.monotonic()
            return self._value

    def expire(self) -> None:
        """The next `latest` makes a new value (something changed it)."""
        with self._lock:
            self._made = float("-inf")
