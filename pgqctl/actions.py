"""What an operator does to the queue from the web page, and its record.

Each action goes through the library calls the commands use (`admin.requeue`,
`admin.cancel`, `control.pause`, `control.resume`) and is recorded in the
`actions` table (migration 0014) in the same transaction: who, what, on
which jobs or queue, how many jobs it changed. An action on the jobs a
filter matches (`act_on_matching`) works through them in batches of short
transactions, pausing between batches so that workers' claims and reports
are not held up, and never on more jobs than the operator confirmed.
`pgqctl actions` lists the record. The SQL is sql/queries/actions.sql.
Nothing here prints.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from pgqctl import admin, control
from pgqctl.db import atomic
from pgqctl.errors import BadInput
from pgqctl.rows import named_rows
from pgqctl.sql import query

Connection = psycopg.Connection[Any]

# The actions the page offers, as recorded.
ACTIONS = (
    "retry",
    "run_now",
    "cancel",
    "pause",
    "resume",
    "requeue_matching",
    "cancel_matching",
)
# An action on matching jobs takes at most this many (the newest first): a
# page's confirmation names a number a person can check; run it again for more.
MOST_MATCHING = 10_000
# Jobs per transaction of an action on matching jobs, and the pause between two.
BATCH = 500
BATCH_PAUSE_SECONDS = 0.1
# Which statuses each action on matching jobs takes, of those the filter names.
MATCHING_STATUSES = {
    "requeue_matching": ("failed", "cancelled"),
    "cancel_matching": ("pending", "running"),
}
# And which it takes when the filter names none.
MATCHING_DEFAULT = {
    "requeue_matching": ("failed",),
    "cancel_matching": ("pending", "running"),
}

FIELDS = ("id", "at", "actor", "action", "target", "jobs", "finished")


@dataclass(frozen=True)
class Action:
    id: int
    at: dt.datetime
    actor: str
    action: str
    target: dict[str, Any]
    jobs: int
    finished: bool

    def as_record(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}


def record(
    conn: Connection,
    actor: str,
    action: str,
    target: dict[str, Any],
    jobs: int,
    *,
    finished: bool = True,
) -> int:
    """Record an action in the caller's transaction; its id."""
    row = conn.execute(
        query("action_record"),
        {
            "actor": actor,
            "action": action,
            "target": json.dumps(target, sort_keys=True),
            "jobs": jobs,
            "finished": finished,
        },
    ).fetchone()
    assert row is not None
    return int(row[0])


def recent(conn: Connection, *, since: float | None = None, limit: int = 100) -> list[Action]:
    """The actions within the last `since` seconds (None: all), newest first."""
    with atomic(conn):
        rows = named_rows(
            conn,
            "action_list",
            {"since": None if since is None else dt.timedelta(seconds=since), "limit": limit},
        )
    return [Action(**row) for row in rows]


def read_only_reason(conn: Connection) -> str | None:
    """Why this connection may not act on the queue (a standby, a role
    without the privileges), or None when it may."""
    with atomic(conn):
        (row,) = named_rows(conn, "action_rights")
    if row["standby"]:
        return "the database is a standby, which takes no writes"
    missing = [
        what
        for what, granted in (
            ("UPDATE on jobs", row["jobs"]),
            ("INSERT, UPDATE, DELETE on paused_queues", row["pauses"]),
            ("INSERT, UPDATE on actions", row["actions"]),
        )
        if not granted
    ]
    if missing:
        return f"the role {row['role']} lacks {'; '.join(missing)}"
    return None


# --- one job, one queue ------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """What an action changed: how many jobs (or queues), and for a job it
    did not change, the status that kept it (None: no such job)."""

    changed: int
    left: str | None = None


def retry(conn: Connection, job_id: int, actor: str) -> Done:
    """A failed or cancelled job back to pending with one more try, due now."""
    return _requeue_one(conn, job_id, actor, "retry", ("failed", "cancelled"))


def run_now(conn: Connection, job_id: int, actor: str) -> Done:
    """A pending job due now."""
    return _requeue_one(conn, job_id, actor, "run_now", ("pending",))


def _requeue_one(
    conn: Connection, job_id: int, actor: str, action: str, statuses: tuple[str, ...]
) -> Done:
    with conn.transaction():
        done = admin.requeue(conn, admin.Selection(statuses=statuses, ids=(job_id,)))
        if done.jobs:
            record(conn, actor, action, {"job": job_id}, len(done.jobs))
    if done.held:
        _, holder = done.held[0]
        raise BadInput(f"job {holder} holds this job's unique key: it cannot be requeued now")
    return Done(len(done.jobs), done.left.get(job_id))


def cancel(conn: Connection, job_id: int, actor: str) -> Done:
    """A pending or running job cancelled; a running one's worker stops it."""
    with conn.transaction():
        done = admin.cancel(conn, admin.CancelSelection(ids=(job_id,)), reason=_reason(actor))
        if done.jobs:
            record(conn, actor, "cancel", {"job": job_id}, len(done.jobs))
    return Done(len(done.jobs), done.left.get(job_id))


def pause(conn: Connection, queue: str, actor: str) -> Done:
    """Pause a queue until resumed; a queue paused already (by anyone, for
    any reason and time) is left as it is: Done(0, "paused")."""
    with conn.transaction():
        if any(p.queue == queue for p in control.paused(conn)):
            return Done(0, "paused")
        unknown = control.unknown_queues(conn, [queue])
        if unknown:
            raise BadInput(f"{unknown[0].message()}: it has no job and no pause now")
        # Checked just above, in words for the page (not the command's --force).
        control.pause(conn, [queue], reason=_reason(actor), force=True)
        record(conn, actor, "pause", {"queue": queue}, 0)
    return Done(1)


def resume(conn: Connection, queue: str, actor: str) -> Done:
    """End a queue's pause."""
    with conn.transaction():
        resumed = control.resume(conn, [queue])
        if resumed.resumed:
            record(conn, actor, "resume", {"queue": queue}, 0)
    return Done(len(resumed.resumed))


def _reason(actor: str) -> str:
    """Why a job was cancelled or a queue paused, as last_error and the
    pause's reason say it after `cancelled: ` or `paused: `."""
    return f"from the web page by {actor}"


# --- the jobs a filter matches -------------------------------------------------------


def matching_filter(action: str, found: admin.JobFilter) -> admin.JobFilter:
    """The jobs of `found` that `action` can change: its statuses among
    those the filter names (or its default ones); BadInput when none."""
    if action not in MATCHING_STATUSES:
        raise BadInput(f"unknown action {action!r}: one of {', '.join(MATCHING_STATUSES)}")
    takes = MATCHING_STATUSES[action]
    statuses = tuple(s for s in found.statuses if s in takes)
    if found.statuses and not statuses:
        verb = action.removesuffix("_matching")
        raise BadInput(f"{verb} takes {' or '.join(takes)} jobs: filter by one of those statuses")
    return replace(found, statuses=statuses or MATCHING_DEFAULT[action])


def preview(conn: Connection, action: str, found: admin.JobFilter) -> list[int]:
    """The ids `action` would change now, newest first, at most MOST_MATCHING."""
    matched = matching_filter(action, found)
    with atomic(conn):
        return [job.id for job in admin.select_jobs(conn, matched, limit=MOST_MATCHING)]


def act_on_matching(
    conn: Connection,
    action: str,
    found: admin.JobFilter,
    ids: Sequence[int],
    actor: str,
    *,
    target: dict[str, Any],
    pause: Callable[[float], None] = time.sleep,
) -> tuple[int, int]:
    """Requeue or cancel the jobs `ids` (those the operator confirmed, from
    `preview`) that are still in a status the action takes for `found`, in
    batches of BATCH, each in a transaction of its own with its part of the
    record; (the action's id in the record, jobs changed). A job that
    matches the filter only since the confirmation is left alone. `target`
    is the filter as the record keeps it."""
    if len(ids) > MOST_MATCHING:
        raise BadInput(f"at most {MOST_MATCHING:,} jobs an action: confirm fewer")
    statuses = matching_filter(action, found).statuses
    action_id = 0
    changed = 0
    for start in range(0, max(len(ids), 1), BATCH):
        batch = ids[start : start + BATCH]
        last = start + BATCH >= len(ids)
        with conn.transaction():
            n = _change(conn, action, batch, statuses, actor) if batch else 0
            if not action_id:
                action_id = record(conn, actor, action, target, n, finished=last)
            else:
                conn.execute(query("action_add"), {"id": action_id, "jobs": n, "finished": last})
        changed += n
        if not last:
            pause(BATCH_PAUSE_SECONDS)
    return action_id, changed


def _change(
    conn: Connection, action: str, ids: Sequence[int], statuses: tuple[str, ...], actor: str
) -> int:
    if action == "requeue_matching":
        return len(admin.requeue(conn, admin.Selection(statuses=statuses, ids=tuple(ids))).jobs)
    cancelled = admin.cancel(
        conn, admin.CancelSelection(ids=tuple(ids), statuses=statuses), reason=_reason(actor)
    )
    return len(cancelled.jobs)


# --- how an action's target reads ------------------------------------------------------

# The filter's fields as the jobs page labels them.
FILTER_LABELS = {
    "status": "status",
    "queue": "queue",
    "kind": "kind",
    "error": "error holding",
    "id": "id",
    "since": "created within",
}


def filter_text(fields: dict[str, Any]) -> str:
    """A filter in words: `status failed or cancelled, queue mail`."""
    parts = []
    for name, label in FILTER_LABELS.items():
        value = fields.get(name)
        if value in (None, "", []):
            continue
        shown = " or ".join(value) if isinstance(value, list) else str(value)
        parts.append(f"{label} {shown}")
    return ", ".join(parts) or "every job"


def target_text(target: dict[str, Any]) -> str:
    """What an action was done on, in words: `job 17`, `queue mail`, or
    `jobs with status failed, queue mail`."""
    if "job" in target:
        return f"job {target['job']}"
    if "queue" in target:
        return f"queue {target['queue']}"
    return f"jobs with {filter_text(target.get('filter', {}))}"


def id_ranges(ids: Sequence[int]) -> str:
    """Ids as a form carries them: `3-9,12,40-41` (in any order given)."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_id_ranges(text: str) -> list[int]:
    """The ids of `id_ranges`, newest first; BadInput for anything else or
    more than MOST_MATCHING."""
    ids: list[int] = []
    for part in text.split(",") if text else []:
        low, _, high = part.partition("-")
        digits = [low, high] if high else [low]
        if not all(d.isascii() and d.isdigit() for d in digits):
            raise BadInput("the form's job ids are not ids: reload the page and confirm again")
        first, last = int(low), int(high or low)
        if last < first or last >= 2**63 or len(ids) + last - first >= MOST_MATCHING:
            raise BadInput(f"the form names more than {MOST_MATCHING:,} jobs, or a bad range")
        ids.extend(range(first, last + 1))
    return sorted(ids, reverse=True)
