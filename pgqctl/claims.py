"""The worker's side of the queue: claim jobs, report how they ended, renew leases.

The worker's hot path is `exchange`: one statement (``worker_exchange`` in
sql/queries/claims.sql) that reports every job that ended since the last one,
renews the leases of those still held, and claims as many jobs as there
are free slots (plus the room left in its local queue, with --prefetch). One
statement is one round trip and one commit, and costs the client about half
of what the same five updates cost pipelined (bench/worker_bench.py measures
the whole path). Batches travel as JSON arrays: serializing them is far
cheaper than adapting Python lists to PostgreSQL arrays. The statement goes
out with its transaction's BEGIN, settings and COMMIT in one pipeline of
libpq's (`db.pipelined`: parameters as text, no cursor): an exchange that
reports and claims nothing cost the client 450 us through psycopg's cursors
in a pipeline, 140 us so. Its claim is the one for the worker's --queue and
--kind (``worker_claim_*``, put in place by `exchange_statement`), so that
each worker's statement holds only the claim it runs. A worker of every
queue walks from a floor (`Floor`, kept by `Floors`): where its claims stood
a second before, so that the entries of jobs already claimed, which vacuum
cannot remove while the xmin horizon is held, are not walked again by every
claim.

A heartbeat (`registry.Beat`, the worker's row in ``workers``) rides in
the pipeline of an exchange when one is due (`exchange(beat=...)`: no
round trip of its own); alone, it is `registry.heartbeat`.

Every transition out of ``running`` is fenced on (id, claimed attempt,
status = 'running'), so a worker that lost its lease changes nothing: the
jobs an exchange does not answer for are the ones it was fenced out of.
Nothing here prints, sleeps or retries: the worker decides what failures mean.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.adapt import Transformer
from psycopg.pq.abc import PGresult

from pgqctl import db, limits
from pgqctl.attempts import Record, record_attempts, record_params
from pgqctl.db import QueueConnection
from pgqctl.jobs import Held, Job
from pgqctl.registry import Beat, Beaten
from pgqctl.rows import Unreadable, claimed_payload
from pgqctl.sql import query

Conn = QueueConnection


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


@dataclass(frozen=True)
class Floor:
    """Where a claim may start its walk of the claim index: the job at this
    priority, run_at and id in claim order (higher priorities and lower ones
    are walked from their start).

    The jobs already claimed lie ahead of every pending job in that index
    until vacuum removes them, and nothing removes them while a transaction
    holds back the xmin horizon; a claim from a floor passes over none of
    those. A job of the floor's priority due before `run_at` is not seen from
    it: the worker walks from the start now and then to find such jobs.
    """

    priority: int
    run_at: datetime
    id: int


# A worker's claims walk from where its claims stood FLOOR_LAG seconds ago,
# not from the last one: a producer's transaction that commits a little late
# has its jobs due from when it began, behind jobs claimed since, and they
# are still seen. Once every FULL_WALK_EVERY seconds a claim walks from the
# start of the claim index, for the jobs due behind the floor.
FLOOR_LAG = 1.0
FULL_WALK_EVERY = 1.0
# The most jobs one claim takes: the constant LIMIT under each walk of the
# claim statements (sql/queries/claims.sql says why it is small). A worker
# with more free slots claims again at once.
MOST_PER_CLAIM = 100


class Floors:
    """Where a worker's next claim starts its walk (see worker_claim_all_from):
    None (from the start) for a worker of some queues or kinds, for the
    first claim and once every FULL_WALK_EVERY seconds; else the last
    claimed position at least FLOOR_LAG seconds old."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.current: Floor | None = None
        self.recent: collections.deque[tuple[float, Floor]] = collections.deque()
        self.next_full_walk = 0.0

    def floor(self, now: float) -> Floor | None:
        """Where a claim sent at `now` (monotonic seconds) starts."""
        while self.recent and self.recent[0][0] <= now - FLOOR_LAG:
            self.current = self.recent.popleft()[1]
        if not self.enabled or self.current is None or now >= self.next_full_walk:
            self.next_full_walk = now + FULL_WALK_EVERY
            return None
        return self.current

    def claimed(self, sent: float, last: Floor | None) -> None:
        """A claim sent at `sent` took jobs up to `last` (None: took nothing)."""
        if self.enabled and last is not None:
            self.recent.append((sent, last))


@dataclass
class Exchanged:
    """What an exchange changed; a reported job missing here was fenced out."""

    claimed: list[Job] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    failed: dict[int, FailResult] = field(default_factory=dict)
    handed_back: set[int] = field(default_factory=set)
    renewed: set[int] = field(default_factory=set)
    # What the heartbeat said, when one went with the exchange.
    beaten: Beaten | None = None
    # Where the last job claimed stands in claim order.
    last_claimed: Floor | None = None
    # Seconds until a rate limit that held jobs back has a token again.
    wake: float | None = None


def exchange(
    conn: Conn,
    *,
    done: Sequence[Held] = (),
    failed: Sequence[Failure] = (),
    handed_back: Sequence[Held] = (),
    hand_back_reason: str = "",
    renew: Sequence[Held] = (),
    started: Mapping[int, int] | None = None,
    claim: int = 0,
    slots: Sequence[int] = (),
    prefetch: int = 0,
    lease: float,
    worker: str,
    queues: Sequence[str] = (),
    kinds: Sequence[str] = (),
    floor: Floor | None = None,
    limited: bool = False,
    beat: Beat | None = None,
    max_payload_bytes: int = limits.MAX_PAYLOAD_BYTES,
    records: Sequence[Record] = (),
    now: float = 0.0,
) -> Exchanged:
    """Report, renew and claim in one statement: in a transaction of its own,
    or in the caller's when one is open. With `beat`, the worker's heartbeat
    goes in the same round trip and transaction.

    done: jobs that exited 0. failed: failed attempts. handed_back: jobs given
    back unfinished, with `hand_back_reason` as last_error. renew: leases to
    extend to `lease` seconds from now; started: of those, the prefetched
    jobs now running, by id, with their slot (locked_by becomes
    ``<worker>:<slot>``). claim: how many due jobs (of these queues and
    kinds, if any) to claim for `worker`, for `lease` seconds. slots: the
    worker's slot of each job it may claim, in claim order; the n-th claimed
    job is held by ``<worker>:<slots[n]>``, and up to `prefetch` more by
    ``<worker>:prefetch`` (by `worker` alone without slots or prefetch).
    floor: where the claim starts its walk (None: from the start); a worker
    of some queues or kinds always walks from the start of each.
    limited: claim as limits require (see worker_claim_limited): a worker
    uses it while any limit exists.
    max_payload_bytes: a claimed job whose payload is longer (or cannot be
    run for what its row holds: see rows.claimed_payload) comes with an
    `Unreadable` payload, for the worker to fail for good; the claim reads no
    more of a payload than that.
    records: the attempts that ended, recorded in the same transaction
    (record_attempts, with `now` the worker's monotonic clock at sending).
    """
    holders = [str(int(n)) for n in slots] + ["prefetch"] * prefetch
    params = {
        "done": _held_json(done),
        "failed": _failed_json(failed),
        "handed_back": _held_json(handed_back),
        "reason": hand_back_reason,
        "renew": _held_json(renew, started),
        "limit": claim,
        "slots": "{" + ",".join(holders) + "}" if holders else None,
        "lease": lease,
        "worker": worker,
        "queues": _names(queues),
        "kinds": _names(kinds),
        "payload_chars": max_payload_bytes + 1,
    }
    from_floor = floor is not None and not queues and not kinds and not limited
    if floor is not None and from_floor:
        params.update(floor_priority=floor.priority, floor_run_at=floor.run_at, floor_id=floor.id)
    statement = exchange_statement(queues, kinds, from_floor=from_floor, limited=limited)
    beaten = None
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        if records:
            record_attempts(conn, records, now)
        rows = conn.execute(statement, params).fetchall()  # the caller's
        if beat is not None:
            beaten = conn.execute(query("worker_beat"), beat.params()).fetchone()
    else:
        # A transaction of its own, sent with its settings in one round trip
        # through libpq (db.pipelined): no cursor, no per-statement Python.
        statements: list[db.Statement] = [
            (query("transaction_begin"), None),
            (query("settings_set_local"), conn.settings_params()),
        ]
        if records:
            # Before the statement: it may claim a job that one of them
            # ended (a retry due at once), which must not make it late.
            statements.append((query("attempt_record"), record_params(records, now)))
        statements.append((statement, params))
        if beat is not None:
            statements.append((query("worker_beat"), beat.params()))
        statements.append((query("transaction_commit"), None))
        results = db.pipelined(conn, statements)
        answer = results[-3] if beat is not None else results[-2]
        rows = _loaded(conn, answer)
        if beat is not None:
            beaten = _loaded(conn, results[-2])[0]
    result = Exchanged(beaten=None if beaten is None else Beaten(*beaten))
    for row in rows:
        part, job_id, queue, kind, payload, attempts, max_attempts, handbacks, status, run_at = row
        if part == "claimed":
            result.claimed.append(
                Job(
                    job_id,
                    queue,
                    kind,
                    _runnable(
                        claimed_payload(
                            payload, kind=kind, queue=queue, max_bytes=max_payload_bytes
                        ),
                        attempts,
                    ),
                    status="running",
                    attempts=attempts,
                    max_attempts=max_attempts,
                    handbacks=handbacks,
                    # The claimed arm carries the schedule and the tick in
                    # the columns of status and run_at (see worker_exchange).
                    schedule=status,
                    tick=run_at,
                )
            )
        elif part == "done":
            result.done.add(job_id)
        elif part == "failed":
            result.failed[job_id] = FailResult(status, run_at)
        elif part == "handed_back":
            result.handed_back.add(job_id)
        elif part == "floor":
            # The floor arm carries the priority in the attempts column.
            result.last_claimed = Floor(attempts, run_at, job_id)
        elif part == "wake":
            # Milliseconds until a rate limit has a token, in attempts.
            result.wake = attempts / 1000
        else:
            result.renewed.add(job_id)
    return result


# PostgreSQL's integer maximum: a job claimed at this count (written so by
# plain SQL) cannot be claimed again with a higher fencing token.
MAX_CLAIMS = 2**31 - 1


def _runnable(payload: dict[str, Any] | Unreadable, attempts: int) -> dict[str, Any] | Unreadable:
    """The claimed payload, or why the job can never run: its attempts
    counter is at the integer maximum (the claim keeps it there)."""
    if attempts >= MAX_CLAIMS:
        return Unreadable(
            f"its attempts counter is at its maximum ({MAX_CLAIMS:,}), so no claim of it can "
            "be told from the last: set attempts to 0 with SQL to run it again"
        )
    return payload


def next_due(conn: Conn, *, queues: Sequence[str] = (), kinds: Sequence[str] = ()) -> float | None:
    """Seconds until the next delayed job of these queues and kinds is due;
    None if none is (a job due at 'infinity' never is)."""
    name = "job_next_due_queues" if queues else "job_next_due_kinds" if kinds else "job_next_due"
    with conn.transaction():
        row = conn.execute(
            query(name), {"queues": _names(queues), "kinds": _names(kinds)}
        ).fetchone()
    if row is None or row[0] is None or row[0] == float("inf"):
        return None
    return float(row[0])


def fence_state(conn: Conn, ids: Sequence[int]) -> dict[int, tuple[str, int]]:
    """(status, attempts) of each job that still exists, to explain a fenced-out report."""
    with conn.transaction():
        rows = conn.execute(query("job_fence_state"), {"ids": list(ids)}).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def ended(conn: Conn, held: Sequence[Held]) -> dict[int, tuple[str, str | None]]:
    """Those of `held` that ended at the attempt held while this worker held
    them: cancelled by an operator or done by the job itself, each with its
    status and last_error (a cancel's reason)."""
    wanted = dict(held)
    with conn.transaction():
        rows = conn.execute(query("job_ended_state"), {"ids": list(wanted)}).fetchall()
    return {row[0]: (row[2], row[3]) for row in rows if wanted.get(row[0]) == row[1]}


def _failed_json(failed: Sequence[Failure]) -> str:
    if not failed:
        return "[]"
    return json.dumps(
        [
            {
                "id": f.job_id,
                "attempt": f.attempt,
                # A text column cannot hold NUL; a child's output can.
                "error": f.error.replace("\0", "\\0"),
                "delay": f.delay,
                "permanent": f.permanent,
            }
            for f in failed
        ]
    )


def exchange_statement(
    queues: Sequence[str] = (),
    kinds: Sequence[str] = (),
    *,
    from_floor: bool = False,
    limited: bool = False,
) -> str:
    """worker_exchange with the claim of a worker of these queues and kinds
    (of all of them: walking from a floor when `from_floor`), or, while
    limits exist (`limited`), the claim that keeps them."""
    if limited:
        return _exchange_with("worker_claim_limited")
    if queues:
        return _exchange_with("worker_claim_queues")
    if kinds:
        return _exchange_with("worker_claim_kinds")
    return _exchange_with("worker_claim_all_from" if from_floor else "worker_claim_all")


@functools.cache
def _exchange_with(claim: str) -> str:
    # Always the same text for the same claim: psycopg prepares it by its text.
    limited = claim == "worker_claim_limited"
    return (
        query("worker_exchange")
        .replace("{claim}", query(claim))
        .replace("{seated}", query("worker_exchange_seated") if limited else "")
        .replace("{wake}", query("worker_exchange_wake") if limited else "")
    )


def _loaded(conn: Conn, result: PGresult) -> list[tuple[Any, ...]]:
    """A result's rows as tuples, loaded as a cursor would (the connection's
    loaders: a time past a datetime is a FarTime)."""
    loader = Transformer(conn)
    loader.set_pgresult(result)
    return loader.load_rows(0, result.ntuples, tuple)


def _names(names: Sequence[str]) -> list[str] | None:
    """Each queue or kind once, in the order given; None (all) for none. The
    claim walks each queue or kind it is given: one given twice would have
    it take the same jobs twice over."""
    return list(dict.fromkeys(names)) or None


def _held_json(held: Sequence[Held], slots: Mapping[int, int] | None = None) -> str:
    # Two integers per job: formatting them directly is several times cheaper
    # than json.dumps of a list of dicts, on the worker's hottest path.
    if not slots:
        return "[" + ",".join(f'{{"id":{int(i)},"attempt":{int(a)}}}' for i, a in held) + "]"
    return (
        "["
        + ",".join(
            f'{{"id":{int(i)},"attempt":{int(a)},"slot":{int(slots[i])}}}'
            if i in slots
            else f'{{"id":{int(i)},"attempt":{int(a)}}}'
            for i, a in held
        )
        + "]"
    )
