"""The worker's side of the queue: claim jobs, report how they ended, renew leases.

One function per named query of the Worker section of sql/queries.sql, each
taking a whole batch (parallel arrays that the SQL reads with ``unnest``).
Every transition out of ``running`` is fenced on (id, claimed attempt,
status = 'running'), so a worker that lost its lease changes nothing: the
ids a statement did not return are the ones it was fenced out of.

The statement functions do not wait for their rows: each sends its statement
and returns a `Pending` whose `result()` reads them. Inside `round_trip(conn)`
(psycopg pipeline mode on an autocommit connection) everything sent is one
implicit transaction, one commit and one network round trip, and results are
read after the block; outside it each statement runs on its own. Nothing here
prints, sleeps or retries: the worker decides what failures mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import psycopg

from pgqctl.sql import query

T = TypeVar("T")
Conn = psycopg.Connection[Any]
# (job id, the attempt the worker claimed): what every fence checks.
Held = tuple[int, int]


@dataclass(frozen=True)
class Job:
    """A claimed job; `attempt` is the fencing token of this claim."""

    id: int
    queue: str
    kind: str
    payload: Any
    attempt: int
    max_attempts: int

    @property
    def held(self) -> Held:
        return (self.id, self.attempt)


@dataclass(frozen=True)
class Failure:
    """A failed attempt to report: retried after `delay` seconds unless out of
    attempts or `permanent` (a job that can never run)."""

    job_id: int
    attempt: int
    error: str
    delay: float
    permanent: bool = False


@dataclass(frozen=True)
class FailResult:
    """Where a reported failure left the job: 'pending' (runs again at
    `run_at`) or 'failed' (for good)."""

    status: str
    run_at: datetime


class Pending(Generic[T]):
    """The rows of a statement already sent, read on demand."""

    __slots__ = ("_cursor", "_parse")

    def __init__(self, cursor: psycopg.Cursor[Any] | None, parse: Callable[[list[Any]], T]) -> None:
        self._cursor = cursor
        self._parse = parse

    def result(self) -> T:
        return self._parse(self._cursor.fetchall() if self._cursor is not None else [])


@contextmanager
def round_trip(conn: Conn) -> Iterator[None]:
    """Send every statement of the block at once; they commit together at the end.

    If one fails, none applies and the block raises.
    """
    with conn.pipeline():
        yield


def claim(
    conn: Conn,
    *,
    limit: int,
    lease: float,
    worker: str,
    queues: Sequence[str] = (),
    kinds: Sequence[str] = (),
) -> Pending[list[Job]]:
    """Claim up to `limit` due jobs (of these queues and kinds, if any) for `lease` seconds."""
    if limit <= 0:
        return Pending(None, _jobs)
    cursor = conn.execute(
        query("job_claim"),
        {
            "limit": limit,
            "lease": lease,
            "worker": worker,
            "queues": list(queues) or None,
            "kinds": list(kinds) or None,
        },
    )
    return Pending(cursor, _jobs)


def complete(conn: Conn, held: Sequence[Held]) -> Pending[set[int]]:
    """Mark jobs done; the ids that were still held."""
    return _fenced(conn, "job_complete", held, {})


def fail(conn: Conn, failures: Sequence[Failure]) -> Pending[dict[int, FailResult]]:
    """Record failed attempts: back to pending after each delay, or failed for good."""
    if not failures:
        return Pending(None, _fail_results)
    cursor = conn.execute(
        query("job_fail"),
        {
            "ids": [f.job_id for f in failures],
            "attempts": [f.attempt for f in failures],
            "errors": [_text(f.error) for f in failures],
            "delays": [f.delay for f in failures],
            "permanent": [f.permanent for f in failures],
        },
    )
    return Pending(cursor, _fail_results)


def hand_back(conn: Conn, held: Sequence[Held], reason: str) -> Pending[set[int]]:
    """Return unfinished jobs to pending without using up an attempt."""
    return _fenced(conn, "job_hand_back", held, {"reason": _text(reason)})


def renew(conn: Conn, held: Sequence[Held], lease: float) -> Pending[set[int]]:
    """Extend leases to `lease` seconds from now; the ids still held."""
    return _fenced(conn, "lease_renew", held, {"lease": lease})


def next_due(conn: Conn, *, queues: Sequence[str] = (), kinds: Sequence[str] = ()) -> float | None:
    """Seconds until the next delayed job of these queues and kinds is due; None if none."""
    row = conn.execute(
        query("job_next_due"), {"queues": list(queues) or None, "kinds": list(kinds) or None}
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def fence_state(conn: Conn, ids: Sequence[int]) -> dict[int, tuple[str, int]]:
    """(status, attempts) of each job that still exists, to explain a fenced-out report."""
    rows = conn.execute(query("job_fence_state"), {"ids": list(ids)}).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def _fenced(
    conn: Conn, name: str, held: Sequence[Held], params: dict[str, Any]
) -> Pending[set[int]]:
    if not held:
        return Pending(None, _ids)
    params["ids"] = [job_id for job_id, _ in held]
    params["attempts"] = [attempt for _, attempt in held]
    return Pending(conn.execute(query(name), params), _ids)


def _jobs(rows: list[Any]) -> list[Job]:
    return [Job(*row) for row in rows]


def _ids(rows: list[Any]) -> set[int]:
    return {row[0] for row in rows}


def _fail_results(rows: list[Any]) -> dict[int, FailResult]:
    return {row[0]: FailResult(row[1], row[2]) for row in rows}


def _text(value: str) -> str:
    # A text column cannot hold NUL; a child's output can.
    return value.replace("\0", "\\0")
