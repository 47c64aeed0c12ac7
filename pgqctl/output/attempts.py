"""A job's attempts: the timeline `show` prints under the job, and the kept
output `logs` prints."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from pgqctl.attempts import Attempt
from pgqctl.output.formats import emit_object, emit_rows, resolve_format
from pgqctl.text import CELL_ESCAPES, format_seconds, one_line, printable, size

TIMELINE_COLUMNS = ["attempt", "started", "worker", "took", "outcome", "cpu", "memory", "output"]

# The outcome as a person reads it, with the exit status or signal after it.
_OUTCOME_WORDS = {
    "done": "done",
    "failed": "failed",
    "timed_out": "timed out",
    "cancelled": "cancelled",
    "lease_lost": "lease lost",
    "handed_back": "handed back",
    "refused": "refused",
}


def _how(a: Attempt) -> str:
    said = _OUTCOME_WORDS.get(a.outcome, a.outcome)
    if a.signal is not None:
        said += f" (signal {a.signal})"
    elif a.exit_status not in (None, 0):
        said += f" (exit {a.exit_status})"
    if a.late:
        said += ", late"
    return said


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def timeline_rows(attempts: Sequence[Attempt]) -> list[dict[str, Any]]:
    """One row per attempt: when, where, how long, how it ended, what it
    cost, and the last line it wrote (else its error's first line)."""
    rows = []
    for a in attempts:
        when = a.started_at or a.claimed_at or a.finished_at
        cpu = None
        if a.user_cpu is not None and a.system_cpu is not None:
            cpu = format_seconds(a.user_cpu + a.system_cpu)
        rows.append(
            {
                "attempt": f"#{a.attempt}",
                "started": when,
                "worker": a.worker or "",
                "took": "" if a.seconds is None else format_seconds(a.seconds),
                "outcome": _how(a),
                "cpu": cpu or "",
                "memory": "" if a.max_rss_bytes is None else size(a.max_rss_bytes),
                "output": _last_line(a.output_end) or (a.error or "").partition("\n")[0],
            }
        )
    return rows


def emit_timeline(attempts: Sequence[Attempt], fmt: str) -> None:
    """Under `show`'s job, for people: a table of its attempts (or a line
    saying there is none)."""
    out = sys.stdout
    out.write("\n")
    if not attempts:
        out.write("attempts: none recorded\n")
        return
    out.write("attempts:\n")
    emit_rows(timeline_rows(attempts), TIMELINE_COLUMNS, fmt)


def stream_parts(attempt: Mapping[str, Any], stream: str) -> tuple[str, str, int, int]:
    """A stream's kept head and tail, its size, and the bytes left out between them."""
    head = attempt.get(f"{stream}_head") or ""
    tail = attempt.get(f"{stream}_tail") or ""
    total = int(attempt.get(f"{stream}_bytes") or 0)
    kept = len(head.encode("utf-8", "replace")) + len(tail.encode("utf-8", "replace"))
    return head, tail, total, max(total - kept, 0)


def emit_logs(
    attempt: Mapping[str, Any], streams: Sequence[str], fmt: str, stream: IO[str] | None = None
) -> None:
    """An attempt's kept output: each stream's head, a line saying how much
    was left out (if anything was), and its tail. On a terminal, control
    characters are shown escaped, and each stream gets a heading when both
    are shown; piped, the text is as the job wrote it. JSON: every field."""
    out = stream or sys.stdout
    if resolve_format(fmt, out) in ("json", "ndjson"):
        emit_object(dict(attempt), out)
        return
    terminal = out.isatty()
    for name in streams:
        head, tail, total, left_out = stream_parts(attempt, name)
        if len(streams) > 1:
            out.write(f"--- {name}: {size(total)} ---\n")
        parts = [head]
        if left_out:
            gap = "" if not head or head.endswith("\n") else "\n"
            parts.append(f"{gap}[... {left_out:,} bytes left out ...]\n")
        parts.append(tail)
        text = "".join(parts)
        out.write(printable(text, CELL_ESCAPES) if terminal else text)
        if text and not text.endswith("\n") and len(streams) > 1:
            out.write("\n")


def attempt_heading(attempt: Mapping[str, Any]) -> str:
    """Which attempt `logs` shows, for its message on stderr."""
    how = _OUTCOME_WORDS.get(attempt["outcome"], attempt["outcome"])
    return (
        f"job {attempt['job_id']} attempt {attempt['attempt']} (claim {attempt['claim']}) "
        f"on {one_line(attempt['worker'] or 'no worker')}: {how}"
    )
