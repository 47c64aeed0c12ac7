"""The listener: a thread holding a connection of its own in LISTEN, which
turns each notification about this worker's schema into an event.

It never touches the loop: it is given the function that posts an event
(`post`, which wakes the loop), and posts WAKE (look for jobs), SCHEDULES
(read the schedules again), a CancelNotice (jobs an operator cancelled),
and HEARING or DEAF (whether notifications can be heard now).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from pgqctl import db
from pgqctl.jobs import Held
from pgqctl.sql import query
from pgqctl.worker.config import (
    CANCEL_CHANNEL,
    CHANNEL,
    LIMITS_CHANNEL,
    RECONNECT_CAP,
    RECONNECT_FIRST,
    SCHEDULES_CHANNEL,
    jittered,
)

WAKE = "wake"
DEAF = "deaf"  # the listener cannot hear notifications (now)
HEARING = "hearing"  # the listener hears them
SCHEDULES = "schedules"  # the schedules changed
LIMITS = "limits"  # a limit was set or removed


@dataclass(frozen=True)
class CancelNotice:
    """A notification that an operator cancelled these (job id, attempt)s."""

    held: frozenset[Held]


class Listener:
    def __init__(
        self,
        connect: Callable[[], db.QueueConnection],
        schema: str,
        post: Callable[[object], None],
        *,
        say_deaf: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.connect = connect
        self.schema = schema
        self.post = post
        # Said once, when notifications cannot be heard (a transaction pooler).
        self.say_deaf = say_deaf
        # A failed listen connection (the loop polls meanwhile).
        self.on_error = on_error
        # What each channel means (see _on_notification).
        self._handlers: dict[str, Callable[[str], None]] = {
            CHANNEL: self._on_jobs_notified,
            CANCEL_CHANNEL: self._on_cancel_notified,
            SCHEDULES_CHANNEL: self._on_schedules_notified,
            LIMITS_CHANNEL: self._on_limits_notified,
        }
        self._closing = threading.Event()
        self._closing_r, self._closing_w = os.pipe()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pgqctl-listen", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (its wait on the socket too), within about two seconds."""
        self._closing.set()
        os.write(self._closing_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=2)
        if not self._thread or not self._thread.is_alive():
            os.close(self._closing_r)
            os.close(self._closing_w)

    def _run(self) -> None:
        """Post a wake-up for each notification about our schema; reconnect on failure.

        Through a transaction pooler a LISTEN stays on whichever server
        connection ran it, so the listener first makes sure it can hear (see
        `_can_hear`); if it cannot, it says so once and ends, and the loop
        polls every POLL_DEAF seconds instead.
        """
        delay = RECONNECT_FIRST
        while not self._closing.is_set():
            conn = None
            try:
                conn = self.connect()
                if not self._can_hear(conn):
                    self.post(DEAF)
                    self.say_deaf()
                    return
                # Cancels first: hearing about new jobs is then the sign
                # that both are heard (`pg_stat_activity` shows the last).
                conn.execute(query("worker_listen_schedules"))
                conn.execute(query("worker_listen_limits"))
                conn.execute(query("worker_listen_cancel"))
                conn.execute(query("worker_listen"))
                delay = RECONNECT_FIRST
                self.post(HEARING)
                # Jobs may have come while nobody listened.
                self.post(WAKE)
                self._relay_notifications(conn)
            except Exception as exc:
                self.on_error(exc)
            finally:
                if conn is not None:
                    _close_quietly(conn)
            self.post(DEAF)
            if self._closing.wait(jittered(delay)):
                return
            delay = min(delay * 2, RECONNECT_CAP)

    def _can_hear(self, conn: db.QueueConnection) -> bool:
        """Whether a LISTEN on `conn` hears notifications: on a direct
        connection, and behind a pooler that keeps a server connection for
        each client (session pooling); not behind one that hands it to other
        clients after each transaction, where the LISTEN would stay behind."""
        if not conn.pooled:
            return True
        with self.connect() as other:
            return not db.shares_server_connections(conn, other)

    def _relay_notifications(self, conn: psycopg.Connection[Any]) -> None:
        # poll() on the socket and on the closing pipe, so stopping the
        # worker never waits for a notifies() timeout. (Not select(): with
        # hundreds of jobs running, the socket's fd may be above 1023.)
        poller = select.poll()
        for fd in (conn.fileno(), self._closing_r):
            poller.register(fd, select.POLLIN)
        while not self._closing.is_set():
            ready = [fd for fd, _ in poller.poll()]
            if self._closing_r in ready:
                return
            for note in conn.notifies(timeout=0):
                self._on_notification(note.channel, note.payload)

    def _on_notification(self, channel: str, payload: str) -> None:
        """Hand a notification to its channel's handler (on the listener's thread)."""
        handler = self._handlers.get(channel)
        if handler is not None:
            handler(payload)

    def _on_jobs_notified(self, payload: str) -> None:
        # New jobs, requeued or reaped ones, a resumed queue: look for work,
        # unless it is about another schema of the same database.
        if payload in ("", self.schema):
            self.post(WAKE)

    def _on_schedules_notified(self, payload: str) -> None:
        # A schedule was added, changed or removed: read them again.
        if payload in ("", self.schema):
            self.post(SCHEDULES)

    def _on_limits_notified(self, payload: str) -> None:
        # A limit was set or removed: claim as limits require from now on.
        if payload in ("", self.schema):
            self.post(LIMITS)

    def _on_cancel_notified(self, payload: str) -> None:
        notice = self._cancel_notice(payload)
        if notice is not None:
            self.post(notice)

    def _cancel_notice(self, text: str) -> CancelNotice | None:
        """The jobs a cancel notification names, if it is about our schema."""
        try:
            found = json.loads(text)
            if found["schema"] != self.schema:
                return None
            return CancelNotice(frozenset((int(i), int(a)) for i, a in found["jobs"]))
        except (ValueError, KeyError, TypeError):
            return None  # not one of ours


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    # A broken connection may fail to close; it is gone either way.
    with contextlib.suppress(Exception):
        conn.close()
