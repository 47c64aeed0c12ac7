"""A few connections to the queue, lent to one request at a time.

The pages run in a thread pool, and a connection serves one thread at a
time: each request borrows one and gives it back. A connection that broke
is closed and replaced by a new one on the next borrow; nothing is kept in
a session between requests (every read is its own transaction, with the
schema and timeouts set inside it), so a pooler in transaction mode
behind us changes nothing.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pgqctl.errors import DatabaseUnavailable


class Busy(DatabaseUnavailable):
    """Every connection stayed lent for as long as a request may wait."""


class Pool:
    def __init__(self, connect: Callable[[], Any], size: int = 4, wait: float = 10.0) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._wait = wait
        self._closed = False

    @contextmanager
    def borrow(self) -> Iterator[Any]:
        """A connection for the length of the block."""
        if not self._slots.acquire(timeout=self._wait):
            raise Busy(f"every database connection stayed busy for {self._wait:g} s")
        conn = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = self._connect()
            yield conn
        finally:
            if conn is not None:
                if self._closed or not _reusable(conn):
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()

    def clear(self) -> None:
        """Close the idle connections (the server dropped them: a restart)."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def close(self) -> None:
        self._closed = True
        self.clear()


def _reusable(conn: Any) -> bool:
    # A request that failed mid-transaction, or a connection the server
    # dropped, is not handed to the next request.
    return not (conn.closed or conn.broken) and (
        conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )
