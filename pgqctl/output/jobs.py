"""Jobs as `list`, `leases`, `reap`, `requeue`, `cancel` and `show` write them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pgqctl.attempts import Attempt
from pgqctl.output.attempts import emit_timeline
from pgqctl.output.formats import Record, emit_record, emit_rows, is_human, resolve_format
from pgqctl.text import error_summary, format_seconds


def emit_jobs(
    jobs: Sequence[Record], columns: Sequence[str], fmt: str, fields: Sequence[str]
) -> None:
    """Jobs as a table of `columns`, or as records of their `fields` (every
    column of the job and what the listing adds)."""
    records = [j.as_record() for j in jobs]
    if is_human(fmt):
        emit_rows([_job_cells(r) for r in records], columns, fmt)
    else:
        emit_rows(records, fields, fmt)


def _job_cells(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the human tables show it; JSON and CSV carry the job itself."""
    left = job.get("seconds_left")
    if left is not None:
        left = format_seconds(float(left))
    elif "seconds_left" in job:  # a lease listing: a running job without a lease
        left = "no lease"
    return {
        **job,
        # The tries used, not the claims: a claim handed back is no try.
        "attempt": f"{job['attempts'] - job.get('handbacks', 0)}/{job['max_attempts']}",
        "left": left or "",
        "error": error_summary(job.get("last_error")),
        "schedule": _schedule_cell(job.get("schedule"), job.get("tick")),
    }


def _schedule_cell(schedule: str | None, tick: dt.datetime | None) -> str:
    """`nightly 12-02 03:00:00Z`: the schedule and the tick (in UTC) a job is for."""
    if schedule is None:
        return ""
    if tick is None:  # `schedule run`: outside the ticks
        return f"{schedule} (run)"
    return f"{schedule} {tick.astimezone(dt.timezone.utc):%m-%d %H:%M:%SZ}"


def emit_job(job: Record, fmt: str, attempts: Sequence[Attempt] = ()) -> None:
    """One job whole (`show`): for people, its payload pretty-printed, and
    under a payload or an error cut (or a payload too deep to decode) a
    note that says so, then the timeline of its attempts; JSON says it in
    payload_note, payload_cut and last_error_cut, and has every attempt
    under "history" ("attempts" is the count of claims)."""
    record = job.as_record()
    if is_human(fmt):
        note = record.pop("payload_note")
        if note is None:
            record["payload"] = json.dumps(record["payload"], indent=2, ensure_ascii=False)
        else:
            record["payload"] = f"{record['payload']}\n[payload {note}]"
        del record["payload_cut"]
        if record.pop("last_error_cut"):
            record["last_error"] += (
                f"\n[last_error cut: the first {len(record['last_error']):,} characters]"
            )
        emit_record(record, fmt)
        emit_timeline(attempts, fmt)
        return
    if resolve_format(fmt) in ("json", "ndjson"):
        record["history"] = [a.as_record() for a in attempts]
    emit_record(record, fmt)
