"""Steering the queue: pause and resume queues.

The library behind `pause` and `resume`: its SQL is
sql/queries/control.sql. A pause is a row of `paused_queues`, which the workers'
claims read in every statement (see worker_claim_all in sql/queries/claims.sql): a
committed pause stops every worker's next claim from that queue, however
many workers run and wherever, and holds for workers started later. A pause
with an end needs nobody to lift it: the claims compare `until` with now().
Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgqctl.db import atomic
from pgqctl.errors import BadInput
from pgqctl.limits import check_name
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

PAUSE_FIELDS = ("queue", "reason", "paused_at", "until")


@dataclass(frozen=True)
class Pause:
    """A queue's pause: since when, why, and until when (None: until resumed)."""

    queue: str
    reason: str | None
    paused_at: dt.datetime
    until: dt.datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Pause:
        return cls(row["queue"], row["reason"], row["paused_at"], row["until"])

    def as_record(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "reason": self.reason,
            "paused_at": self.paused_at,
            "until": self.until,
        }


@dataclass(frozen=True)
class Paused:
    """A pause as `pause` left it; `updated`: the queue was paused already."""

    pause: Pause
    updated: bool

    def as_record(self) -> dict[str, Any]:
        return {**self.pause.as_record(), "updated": self.updated}


@dataclass(frozen=True)
class UnknownQueue:
    """A queue pgqctl knows nothing of, and the known name closest to it."""

    queue: str
    close: str | None

    def message(self) -> str:
        hint = f": did you mean {self.close}?" if self.close else ""
        return f"no queue named {self.queue}{hint}"


@dataclass(frozen=True)
class Resumed:
    resumed: list[Pause]  # the pauses that ended, by queue
    not_paused: list[str]  # queues named that were not paused


def _queues(queues: Sequence[str]) -> list[str]:
    """Each queue once, in the order given; BadInput for a name no job can have."""
    names = list(dict.fromkeys(queues))
    if not names:
        raise BadInput("name at least one queue, e.g. `pgqctl pause emails`")
    for name in names:
        if not name or name.isspace() or "\0" in name:
            raise BadInput(f"{name!r} is not a queue name: give the name jobs are enqueued with")
    return names


def _run(conn: Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), params)
        return cur.fetchall() if cur.description else []


def pause(
    conn: Connection,
    queues: Sequence[str],
    *,
    seconds: float | None = None,
    reason: str | None = None,
    force: bool = False,
) -> list[Paused]:
    """Pause these queues for `seconds` (None: until resumed), by queue.

    A queue that has never had a job nor a pause (see `unknown_queues`) is
    most likely a typo, whose pause would leave the meant queue running:
    BadInput unless `force`, which pauses a queue before its first job.

    A queue paused already gets the new end (and the new reason, when one is
    given) and keeps when it was paused. Workers are notified in the same
    transaction (they stop claiming from these queues with their next
    statement anyway; the notification makes them look again for when the
    pause ends).
    """
    names = _queues(queues)
    for name in names:
        # A queue no job could be enqueued in. `resume` takes any name: a
        # pause made with plain SQL can be ended whatever its name.
        check_name("queue", name)
    if seconds is not None and seconds <= 0:
        raise BadInput(
            "--for must be longer than 0s, e.g. --for 30m; leave it out to pause until resumed"
        )
    if reason is not None and "\0" in reason:
        raise BadInput("--reason cannot hold a NUL character")
    with conn.transaction():
        unknown = [] if force else unknown_queues(conn, names)
        if unknown:
            raise BadInput(
                f"{'; '.join(u.message() for u in unknown)} "
                "(--force pauses a queue that has had no job yet)"
            )
        _run(conn, "paused_expired_delete", {})
        rows = _run(conn, "paused_upsert", {"queues": names, "seconds": seconds, "reason": reason})
        _notify_workers(conn)
    return sorted(
        (Paused(Pause.from_row(row), row["updated"]) for row in rows), key=lambda p: p.pause.queue
    )


def resume(conn: Connection, queues: Sequence[str]) -> Resumed:
    """End the pauses of these queues; workers are woken to claim from them at once."""
    names = _queues(queues)
    with conn.transaction():
        _run(conn, "paused_expired_delete", {})
        rows = _run(conn, "paused_delete", {"queues": names})
        if rows:
            _notify_workers(conn)
    resumed = sorted((Pause.from_row(row) for row in rows), key=lambda p: p.queue)
    ended = {p.queue for p in resumed}
    return Resumed(resumed, [q for q in names if q not in ended])


def paused(conn: Connection) -> list[Pause]:
    """The pauses in effect now, by queue."""
    with atomic(conn):
        return [Pause.from_row(row) for row in _run(conn, "paused_list", {})]


def unknown_queues(conn: Connection, queues: Sequence[str]) -> list[UnknownQueue]:
    """The queues among `queues` that have never had a job nor a pause, as
    far as can be told cheaply (see queues_known), each with the known name
    most like it: `imagse` is most likely `images` mistyped."""
    names = list(dict.fromkeys(queues))
    if not names:
        return []
    with atomic(conn):
        known = {row["queue"] for row in _run(conn, "queues_known", {"queues": names})}
        unknown = [name for name in names if name not in known]
        if not unknown:
            return []
        candidates = [row["queue"] for row in _run(conn, "queue_names", {})]
    return [
        UnknownQueue(name, next(iter(difflib.get_close_matches(name, candidates, n=1)), None))
        for name in unknown
    ]


def _notify_workers(conn: Connection) -> None:
    # The wake-up of new jobs (admin.notify_workers'), sent at commit.
    _run(conn, "workers_notify", {})
