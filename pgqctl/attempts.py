"""Every attempt of a job: what a worker records of each one that ended, and
what `show` and `logs` read back.

A row per claim (the fencing token), written by the worker that ran it (in
its exchange's pipeline: no round trip of its own), by a reap that took it
back, or by a cancel of a running job; see sql/migrations/0012_attempts.sql
for who wins when two write the same claim. The SQL is sql/queries/attempts.sql.
Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pgqctl.db import batch_across, in_batches
from pgqctl.rows import named_rows
from pgqctl.sql import query

# Characters of an attempt's error that `show` reads (`logs` reads it whole).
SHOWN_ERROR_CHARS = 2000


@dataclass(frozen=True)
class Record:
    """What a worker knows of an attempt that ended. Instants are on the
    worker's monotonic clock; they are sent as seconds before the exchange."""

    job_id: int
    claim: int  # the job's attempts as the claim left it: the fencing token
    attempt: int  # the try's number, as the job saw it
    worker: str  # host:pid:slot
    outcome: str  # as the CHECK of attempts.outcome allows (sql/migrations/0012)
    claimed: float | None  # monotonic instants
    started: float | None  # None: it never started
    ended: float
    exit_status: int | None = None
    signal: int | None = None
    error: str | None = None
    user_cpu: float | None = None
    system_cpu: float | None = None
    max_rss_bytes: int | None = None
    stdout_head: str | None = None
    stdout_tail: str | None = None
    stdout_bytes: int | None = None
    stderr_head: str | None = None
    stderr_tail: str | None = None
    stderr_bytes: int | None = None


def _ago(at: float | None, now: float) -> float | None:
    return None if at is None else max(now - at, 0.0)


def _text(value: str | None) -> str | None:
    # PostgreSQL's text holds no NUL: a program's stray NUL shows as U+FFFD.
    if value is not None and "\0" in value:
        return value.replace("\0", "\ufffd")
    return value


def record_params(records: Sequence[Record], now: float) -> dict[str, str]:
    """The parameters of attempt_record for `records`, sent at monotonic `now`.
    Written out field by field: this runs in the worker's hot path."""
    rows = [
        {
            "job_id": r.job_id,
            "claim": r.claim,
            "attempt": r.attempt,
            "worker": r.worker,
            "outcome": r.outcome,
            "claimed_ago": _ago(r.claimed, now),
            "started_ago": _ago(r.started, now),
            "ended_ago": _ago(r.ended, now),
            "exit_status": r.exit_status,
            "signal": r.signal,
            "error": _text(r.error),
            "user_cpu": r.user_cpu,
            "system_cpu": r.system_cpu,
            "max_rss_bytes": r.max_rss_bytes,
            "stdout_head": _text(r.stdout_head),
            "stdout_tail": _text(r.stdout_tail),
            "stdout_bytes": r.stdout_bytes,
            "stderr_head": _text(r.stderr_head),
            "stderr_tail": _text(r.stderr_tail),
            "stderr_bytes": r.stderr_bytes,
        }
        for r in records
    ]
    return {"attempts": json.dumps(rows, ensure_ascii=False)}


def record_attempts(conn: Any, records: Sequence[Record], now: float) -> None:
    """Send the records: in the caller's pipeline and transaction (the
    exchange's), before its statement."""
    conn.execute(query("attempt_record"), record_params(records, now))


@dataclass(frozen=True)
class Attempt:
    """One attempt as `show` lists it: no output but its last line."""

    job_id: int
    claim: int
    attempt: int
    worker: str | None
    outcome: str
    due_at: dt.datetime | None  # the job's run_at when it was claimed
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime
    exit_status: int | None
    signal: int | None
    error: str | None
    user_cpu: float | None
    system_cpu: float | None
    max_rss_bytes: int | None
    stdout_bytes: int | None
    stderr_bytes: int | None
    late: bool
    recorded_by: str
    output_end: str | None

    @property
    def seconds(self) -> float | None:
        """How long it ran (None if it never started)."""
        if self.started_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    def as_record(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


def list_attempts(conn: Any, job_id: int) -> list[Attempt]:
    """The attempts of job `job_id`, in claim order."""
    rows = named_rows(conn, "attempt_list", {"id": job_id, "error_chars": SHOWN_ERROR_CHARS})
    return [Attempt(**row) for row in rows]


def get_attempt(conn: Any, job_id: int, attempt: int | None = None) -> dict[str, Any] | None:
    """One attempt whole, its output included: try number `attempt` (its
    latest claim), or the latest; None if there is none."""
    rows = named_rows(conn, "attempt_get", {"id": job_id, "attempt": attempt})
    return rows[0] if rows else None


def purge_count(conn: Any, cutoff: dt.datetime) -> int:
    """How many attempts finished before `cutoff`."""
    (row,) = named_rows(conn, "attempt_purge_count", {"cutoff": cutoff})
    return int(row["count"])


def purge_batch(conn: Any, cutoff: dt.datetime, batch_size: int) -> int:
    """Delete up to `batch_size` attempts finished before `cutoff`, of live
    jobs and of the history's, in one short transaction; how many went."""
    return batch_across(
        conn,
        query("attempt_purge_batch"),
        ("attempts", "attempts_history"),
        {"cutoff": cutoff},
        batch_size,
    )


def purge(
    conn: Any,
    cutoff: dt.datetime,
    *,
    batch_size: int = 10_000,
    on_batch: Callable[[int], None] | None = None,
    pause: float | None = 0.0,
) -> int:
    """Delete the attempts that finished before `cutoff`, whatever their job
    (their own retention), batch by batch; how many went."""
    return in_batches(
        lambda size: purge_batch(conn, cutoff, size), batch_size, on_batch, pause=pause
    )
