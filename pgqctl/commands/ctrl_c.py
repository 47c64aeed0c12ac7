"""Ctrl-C ends a watch (`stats --watch`, `top`) between two snapshots, not
in the middle of one.

Interrupted while a snapshot's query is out, the connection is left busy:
the snapshot's transaction cannot roll back, psycopg warns about it, and the
connection cannot be committed or closed cleanly, so a watch that Ctrl-C
should end with 0 ended with an error (seen through PgBouncer, whose
snapshots take longer). The first Ctrl-C during a snapshot lets it finish
(it is bounded by --statement-timeout) and ends the watch right after; a
second one interrupts at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


class CtrlC:
    def __init__(self) -> None:
        self.pressed = 0
        self._querying = False
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        # Only the main thread may set a handler (a test's runner may not be
        # it); and a Ctrl-C ignored (a job started in the background) stays so.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        ):
            self._previous = signal.signal(signal.SIGINT, self._on_ctrl_c)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Around one snapshot's queries: a Ctrl-C meanwhile ends the watch
        once they are done (KeyboardInterrupt, as Ctrl-C raises elsewhere)."""
        self._querying = True
        try:
            yield
        finally:
            self._querying = False
        if self.pressed:
            raise KeyboardInterrupt

    def _on_ctrl_c(self, signum: int, frame: FrameType | None) -> None:
        self.pressed += 1
        if not self._querying or self.pressed > 1:
            raise KeyboardInterrupt
