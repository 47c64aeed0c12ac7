"""`pgqctl why ID`: what stands between a job and a worker, read from what
the database holds, each reason with the command that would change it.

A pending job may be not due yet (delayed, or waiting to retry), in a
paused queue, held back by a full limit (`pgqctl limit`), of a queue or
kind no active worker takes, behind other due
jobs of its queue, or waiting for a slot on the workers that take it; or
nothing holds it and the next claim takes it. A running job is held by a
worker: live, or one that stopped heartbeating (its lease, or a reap, ends
it). A finished job says how it ended. One statement reads it all, in one
snapshot (sql/queries/why.sql). Nothing here prints: the words are
output/why.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pgqctl import flow
from pgqctl.jobs import Job
from pgqctl.rows import named_rows
from pgqctl.text import shell_word

# Due jobs ahead are counted up to this many, in each of two walks of the
# queue's claim index: past it, "at least" is all an operator needs.
AHEAD_BOUND = 10_000


@dataclass(frozen=True)
class Reason:
    """One thing that keeps the job from running (or, for a running or
    finished job, where it stands): `code` says which, `facts` its values,
    `command` what would change it (None: no command does)."""

    code: str
    facts: dict[str, Any] = field(default_factory=dict)
    command: str | None = None


@dataclass(frozen=True)
class Why:
    job: Job
    reasons: tuple[Reason, ...]


def why(conn: Any, job_id: int) -> Why | None:
    """Why job `job_id` is not running (or how it runs, or ended); None if
    there is no such job."""
    rows = named_rows(conn, "job_why", {"id": job_id, "ahead_bound": AHEAD_BOUND})
    if not rows:
        return None
    row = rows[0]
    job = Job.from_row(row)
    if job.status == "pending":
        reasons = _pending(job, row, flow.holding(conn, job_id) if row["due_in"] <= 0 else [])
    elif job.status == "running":
        reasons = _running(job, row)
    else:
        reasons = [_finished(job)]
    return Why(job, tuple(reasons))


def _finished(job: Job) -> Reason:
    facts: dict[str, Any] = {"finished_at": job.finished_at}
    if job.status == "done":
        return Reason("done", facts)
    facts["error"] = job.last_error
    facts["tries"] = job.attempts - job.handbacks
    facts["max_attempts"] = job.max_attempts
    return Reason(job.status, facts, f"pgqctl requeue --id {job.id}")


def _running(job: Job, row: dict[str, Any]) -> list[Reason]:
    holder = row["holder"]
    worker, _, slot = (job.locked_by or "").rpartition(":")
    lease_left = row["lease_left"]
    facts: dict[str, Any] = {
        "worker": worker or job.locked_by,
        "slot": slot,
        "locked_until": job.locked_until,
        "lease_left": lease_left,
        "claimed_at": job.claimed_at,
        "claimed_ago": row["claimed_ago"],
    }
    reasons: list[Reason] = []
    if holder is None or row["holder_state"] != "active":
        # Killed, cut off, or suspended: its lease (or a reap) ends the job's hold.
        state = row["holder_state"] or "unregistered"
        gone = {**facts, "state": state, "seen_ago": row["holder_seen_ago"]}
        can_reap = holder is not None and state in ("stale", "dead")
        command = f"pgqctl reap --worker {shell_word(holder)}" if can_reap else None
        reasons.append(Reason("holder_gone", gone, command))
    elif slot == "prefetch":
        reasons.append(Reason("prefetched", facts))
    else:
        reasons.append(Reason("running", facts))
    if lease_left is None or lease_left <= 0:
        reasons.append(Reason("lease_expired", facts, "pgqctl reap"))
    return reasons


def _pending(job: Job, row: dict[str, Any], held: list[flow.Holding]) -> list[Reason]:
    reasons: list[Reason] = []
    due_in = row["due_in"]
    due = due_in <= 0
    if not due:
        retrying = job.last_error is not None and job.attempts > job.handbacks
        facts = {"run_at": job.run_at, "due_in": due_in, "retry": retrying}
        if retrying:
            facts.update(
                error=job.last_error,
                tries=job.attempts - job.handbacks,
                max_attempts=job.max_attempts,
            )
        reasons.append(Reason("not_due", facts, f"pgqctl requeue --id {job.id}"))
    if row["paused"]:
        facts = {
            "queue": job.queue,
            "reason": row["pause_reason"],
            "paused_at": row["paused_at"],
            "until": row["paused_until"],
        }
        reasons.append(Reason("paused", facts, f"pgqctl resume {shell_word(job.queue)}"))
    for limit in held:
        facts = {
            "limit": f"{limit.scope} {limit.name}",
            "how": limit.how,
            "rule": limit.rule,
            "limit_key": limit.limit_key,
        }
        reasons.append(Reason("limited", facts, "pgqctl limit list"))
    serving = int(row["serving_workers"])
    if not serving:
        facts = {"queue": job.queue, "kind": job.kind, "active_workers": row["active_workers"]}
        command = f"pgqctl worker --queue {shell_word(job.queue)}"
        reasons.append(Reason("no_worker", facts, command))
    walks = (int(row["ahead_higher"] or 0), int(row["ahead_same"] or 0))
    ahead = sum(walks)
    if due and ahead:
        facts = {"queue": job.queue, "ahead": ahead, "at_least": AHEAD_BOUND in walks}
        reasons.append(Reason("behind", facts))
    slots, busy = int(row["serving_slots"]), int(row["serving_running"])
    if due and serving and busy >= slots:
        facts = {"workers": serving, "slots": slots, "running": busy}
        reasons.append(Reason("slots_busy", facts))
    if not reasons:
        facts = {"due_for": -due_in, "workers": serving, "slots": slots, "running": busy}
        reasons.append(Reason("claimable", facts))
    return reasons


def as_record(found: Why) -> dict[str, Any]:
    """The explanation as JSON-ready data (messages are added by the view)."""
    return {
        "id": found.job.id,
        "status": found.job.status,
        "queue": found.job.queue,
        "kind": found.job.kind,
        "reasons": [{"code": r.code, **r.facts, "command": r.command} for r in found.reasons],
    }
