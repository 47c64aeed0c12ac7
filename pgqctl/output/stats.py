"""`stats`: the counts of each queue, as a table (redrawn by --watch) or as records."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from pgqctl.output.control import pause_summary
from pgqctl.output.fitting import rich_table
from pgqctl.output.formats import emit_object, emit_rows, resolve_format
from pgqctl.text import format_seconds, human

if TYPE_CHECKING:
    from pgqctl.admin import Stats


STATS_COLUMNS = [
    "queue",
    "pending",
    "running",
    "expired",
    "done",
    "failed",
    "cancelled",
    "oldest_pending",
]
ESTIMATE_NOTE = "~ marks estimated done counts; --exact counts them"
UNKNOWN_NOTE = (
    "~ marks estimated done counts, ? those the statistics cannot tell "
    "(they changed too much since the last ANALYZE); --exact counts them"
)


def estimate_note(stats: Stats) -> str | None:
    """What the marks in a `stats` table mean, when there are any."""
    if not stats.estimated:
        return None
    unknown = any(c.done_figure == "unknown" for c in stats.queues.values())
    return UNKNOWN_NOTE if unknown else ESTIMATE_NOTE


def _stats_rows(stats: Stats) -> list[dict[str, Any]]:
    """One row per queue and a total row, as the human tables show them."""
    scopes = [*stats.queues.items(), ("(total)", stats.totals)]
    rows = []
    for name, c in scopes:
        age = c.oldest_pending_age_seconds
        done = {"exact": f"{c.done}", "estimated": f"~{c.done}", "unknown": "?"}
        pause = stats.paused.get(name) if name != "(total)" else None
        rows.append(
            {
                **c.by_status,
                "queue": name,
                "expired": c.expired_leases,
                "done": done[c.done_figure],
                "oldest_pending": "" if age is None else format_seconds(age),
                "paused": "" if pause is None else pause_summary(pause.until, pause.reason),
            }
        )
    return rows


def stats_columns(stats: Stats) -> list[str]:
    """The columns of the `stats` table: `paused` only while a queue is."""
    return [*STATS_COLUMNS, "paused"] if stats.paused else list(STATS_COLUMNS)


def stats_table(stats: Stats, ts: dt.datetime | None = None) -> Any:
    """`stats` as a rich table, to print or to redraw live (titled with the
    time of the snapshot, `ts`, when given)."""
    title = None if ts is None else human(ts)
    return rich_table(
        _stats_rows(stats), stats_columns(stats), title=title, caption=estimate_note(stats)
    )


def emit_stats(stats: Stats, fmt: str, ts: dt.datetime | None = None) -> None:
    """`stats` in `fmt`; with the time of the snapshot when `ts` is given
    (`--watch`): "ts" in JSON, a ts column in CSV and TSV, a line above a table."""
    data = stats.as_json()
    when = {} if ts is None else {"ts": ts}
    resolved = resolve_format(fmt)
    if resolved in ("json", "ndjson"):
        emit_object({**when, **data})
    elif resolved in ("csv", "tsv"):
        total = {"queue": "(total)", **stats.totals.as_record()}
        rows = [{**when, **row} for row in (*data["queues"], total)]
        emit_rows(rows, list(rows[0]), fmt)
    else:
        if ts is not None:
            sys.stdout.write(human(ts) + "\n")
        emit_rows(_stats_rows(stats), stats_columns(stats), fmt)


def live(render: Callable[[], Any], interval: float, stream: IO[str] | None = None) -> None:
    """Redraw `render()` in place every `interval` seconds (`stats --watch`);
    returns on Ctrl-C (the caller's `render` may hold it back until its
    queries are done: commands/ctrl_c.py)."""
    from rich.console import Console
    from rich.live import Live

    try:
        with Live(render(), console=Console(file=stream or sys.stdout), auto_refresh=False) as view:
            while True:
                time.sleep(interval)
                view.update(render(), refresh=True)
    except KeyboardInterrupt:
        return
