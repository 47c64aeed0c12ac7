"""`pgqctl why`: each reason a job is not running as one sentence, with the
command that would change it on the line below."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pgqctl.output.formats import emit_object, emit_rows, is_human
from pgqctl.text import error_summary, format_seconds, one_line, plural
from pgqctl.why import Reason, Why, as_record


def _when(stamp: Any) -> str:
    return one_line(stamp) if stamp is not None else "never"


def _tries(f: dict[str, Any]) -> str:
    return f"try {f['tries']} of {f['max_attempts']}"


def _error(f: dict[str, Any]) -> str:
    summary = error_summary(f.get("error"))
    return f": {one_line(summary)}" if summary else ""


def _done(f: dict[str, Any]) -> str:
    return f"it finished: done at {_when(f['finished_at'])}"


def _failed(f: dict[str, Any]) -> str:
    return f"it failed for good at {_when(f['finished_at'])}, after {_tries(f)}{_error(f)}"


def _cancelled(f: dict[str, Any]) -> str:
    return f"it was cancelled at {_when(f['finished_at'])}{_error(f)}"


def _lease(f: dict[str, Any]) -> str:
    left = f["lease_left"]
    if left is None:
        return "with no lease"
    return f"its lease ends at {_when(f['locked_until'])} (in {format_seconds(left)})"


def _since(f: dict[str, Any]) -> str:
    ago = f["claimed_ago"]
    return "" if ago is None else f" since {_when(f['claimed_at'])} ({format_seconds(ago)})"


def _running(f: dict[str, Any]) -> str:
    where = f"worker {one_line(f['worker'])}, slot {one_line(f['slot'])}"
    return f"it runs on {where}{_since(f)}; {_lease(f)}"


def _prefetched(f: dict[str, Any]) -> str:
    return (
        f"worker {one_line(f['worker'])} claimed it ahead of a free slot (--prefetch) and "
        f"starts it when one frees; {_lease(f)}"
    )


def _holder_gone(f: dict[str, Any]) -> str:
    worker = one_line(f["worker"])
    if f["state"] == "unregistered":
        said = f"its worker {worker} has no row in workers (stopped, or forgotten)"
    else:
        ago = format_seconds(f["seen_ago"])
        said = f"its worker {worker} is {f['state']}: no heartbeat for {ago}"
    left = f["lease_left"]
    if left is not None and left > 0:
        return (
            f"{said}; a reap returns it once its lease ends (in {format_seconds(left)}) "
            "or the worker is found dead"
        )
    return said


def _lease_expired(f: dict[str, Any]) -> str:
    left = f["lease_left"]
    over = "it has no lease" if left is None else f"its lease ended {format_seconds(-left)} ago"
    return f"{over}: the next reap (a worker's, or `pgqctl reap`) returns it"


def _not_due(f: dict[str, Any]) -> str:
    said = f"it is not due until {_when(f['run_at'])} (in {format_seconds(f['due_in'])})"
    if f["retry"]:
        said += f": it waits to retry after {_tries(f)}{_error(f)}"
    return said


def _paused(f: dict[str, Any]) -> str:
    until = f"until {_when(f['until'])}" if f["until"] is not None else "until resumed"
    reason = f" ({one_line(f['reason'])})" if f["reason"] else ""
    return f"queue {one_line(f['queue'])} is paused since {_when(f['paused_at'])}, {until}{reason}"


def _limited(f: dict[str, Any]) -> str:
    how = {
        "concurrency": "every seat is taken",
        "rate": "no token is left until the rate allows",
        "per_key": f"key {one_line(f['limit_key'] or '')} has every seat of its own taken",
    }[f["how"]]
    return f"the limit of {one_line(f['limit'])} ({f['rule']}) holds it back: {how}"


def _no_worker(f: dict[str, Any]) -> str:
    active = plural(int(f["active_workers"]), "active worker")
    return (
        f"no active worker takes queue {one_line(f['queue'])} and kind {one_line(f['kind'])} "
        f"({active} in all)"
    )


def _behind(f: dict[str, Any]) -> str:
    ahead = f"at least {f['ahead']:,}" if f["at_least"] else f"{f['ahead']:,}"
    return (
        f"{ahead} due {'job' if f['ahead'] == 1 else 'jobs'} of queue {one_line(f['queue'])} "
        "come before it (higher priority, or an earlier run_at)"
    )


def _slots_busy(f: dict[str, Any]) -> str:
    return (
        f"the {plural(f['workers'], 'worker')} that take it run {f['running']} jobs in "
        f"{plural(f['slots'], 'slot')}: it waits for one to free (as of their last heartbeat)"
    )


def _claimable(f: dict[str, Any]) -> str:
    return (
        f"nothing holds it: due for {format_seconds(f['due_for'])}, and "
        f"{plural(f['workers'], 'active worker')} with {f['slots'] - f['running']} of "
        f"{plural(f['slots'], 'slot')} free take it; the next claim should"
    )


_SAY: dict[str, Callable[[dict[str, Any]], str]] = {
    "done": _done,
    "failed": _failed,
    "cancelled": _cancelled,
    "running": _running,
    "prefetched": _prefetched,
    "holder_gone": _holder_gone,
    "lease_expired": _lease_expired,
    "not_due": _not_due,
    "paused": _paused,
    "limited": _limited,
    "no_worker": _no_worker,
    "behind": _behind,
    "slots_busy": _slots_busy,
    "claimable": _claimable,
}


def message(reason: Reason) -> str:
    """One reason as a sentence."""
    return _SAY[reason.code](reason.facts)


def emit_why(found: Why, fmt: str) -> None:
    """For people: a heading, then each reason with its command below; JSON:
    the job and its reasons, each with its message, facts and command."""
    job = found.job
    if not is_human(fmt):
        record = as_record(found)
        for entry, reason in zip(record["reasons"], found.reasons, strict=True):
            entry["message"] = message(reason)
        if fmt in ("csv", "tsv"):
            columns = ["id", "status", "code", "message", "command"]
            rows = [
                {"id": job.id, "status": job.status, **{k: r[k] for k in columns[2:]}}
                for r in record["reasons"]
            ]
            emit_rows(rows, columns, fmt)
        else:
            emit_object(record)
        return
    out = sys.stdout
    out.write(f"job {job.id} ({one_line(job.kind)}, queue {one_line(job.queue)}) is {job.status}\n")
    for reason in found.reasons:
        out.write(f"- {message(reason)}\n")
        if reason.command:
            out.write(f"  {reason.command}\n")
