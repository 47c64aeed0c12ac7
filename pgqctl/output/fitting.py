"""Fitting a listing to the terminal: which columns, how wide, times how long.

A listing on a terminal never wraps inside a value (a time broken as
`2026-12-0` / `1` is unreadable, and a job takes many lines). Where the
columns do not fit: text the user chose is cut with … (the error first,
then kinds and queues); then times are shortened; then the least important
columns are left out. Ids, statuses, attempts, counts, times and the
worker in locked_by are never cut.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

from pgqctl.text import cut, human, one_line


class Column(NamedTuple):
    shape: str  # "error" or "text": may be cut; "time": may be shortened; "whole"
    rank: int  # the least important are left out first; 0: never
    ease: int = 0  # how narrow a cut column may go before columns are left out


COLUMNS: dict[str, Column] = {
    "id": Column("whole", 0),
    "queue": Column("text", 30, 10),
    "kind": Column("text", 50, 12),
    "status": Column("whole", 80),
    "attempt": Column("whole", 40),
    "run_at": Column("time", 20),
    "finished_at": Column("time", 10),
    "locked_until": Column("time", 10),
    "locked_by": Column("whole", 60),
    "left": Column("whole", 70),
    "error": Column("error", 60, 24),
    "schedule": Column("text", 15, 10),
    # stats: every count stays whole; a long queue name is cut. Cancelled
    # jobs, the least urgent count, are left out when the table cannot fit
    # them (a terminal of 80 columns and counts in the millions).
    "pending": Column("whole", 0),
    "running": Column("whole", 0),
    "expired": Column("whole", 0),
    "done": Column("whole", 0),
    "failed": Column("whole", 0),
    "cancelled": Column("whole", 10),
    "oldest_pending": Column("whole", 0),
    # stats and pauses: what a pause says may be cut, when it ends is not.
    "paused": Column("text", 0, 20),
    "until": Column("whole", 0),
    "reason": Column("text", 0, 12),
    "paused_at": Column("time", 10),
    # schedules: the name stays, the time of the next tick and of a missed
    # one too; the zone and the last tick's job give way first.
    "name": Column("text", 0, 12),
    "timing": Column("text", 0, 40),  # a cron expression cut says nothing
    "timezone": Column("text", 20, 8),
    "next_tick": Column("time", 0),
    "last_tick": Column("time", 30),
    "job": Column("whole", 25),
    "job_status": Column("whole", 26),
    "missed_since": Column("time", 0),
    # workers: who, whether alive and what it serves stay (cut if need be),
    # with its counters (running, done and failed stay whole, as for stats);
    # the jobs it holds are cut, and go last.
    "host": Column("text", 0, 10),
    "pid": Column("whole", 0),
    "state": Column("whole", 0),
    "queues": Column("text", 0, 60),
    "kinds": Column("text", 20, 6),
    "concurrency": Column("whole", 25),
    "version": Column("whole", 5),
    "started_at": Column("time", 10),
    "last_seen": Column("whole", 35),
    "jobs": Column("text", 40, 20),
    "prefetched": Column("text", 38, 6),
    # failures: the count (`jobs`, as for workers) and the job to look at stay;
    # the cause is cut; when the first failure was seen gives way first.
    "cause": Column("error", 0, 24),
    "first_seen": Column("time", 30),
    "example_id": Column("whole", 0),
    # show's attempts: which, how it ended and its last words stay (the words
    # cut); what it cost, then where and when it ran, give way first.
    "started": Column("time", 30),
    "worker": Column("whole", 20),
    "took": Column("whole", 0),
    "outcome": Column("whole", 0),
    "cpu": Column("whole", 15),
    "memory": Column("whole", 10),
    "output": Column("error", 0, 24),
    # limits: what each one allows is cut last (a rule cut says least); how
    # it stands now (`running` as for stats) stays whole.
    "limit": Column("text", 0, 14),
    "allows": Column("text", 0, 24),
    "held_back": Column("whole", 0),
    "waiting": Column("whole", 0),
    # actions: who and on what may be cut; when, what and how many stay.
    "at": Column("time", 0),
    "actor": Column("text", 0, 12),
    "action": Column("whole", 0),
    "target": Column("text", 0, 16),
    "changed": Column("whole", 0),
}
# How times are shown, longest first: as everywhere, then in UTC without
# the year, then without the seconds.
TIME_STYLES = ("full", "utc", "short")


def fitted(columns: Sequence[str]) -> bool:
    """Whether a table of these columns is a listing laid out to fit a width."""
    return len(columns) > 1 and all(c in COLUMNS for c in columns)


def _one_line(value: Any, style: str) -> str:
    if isinstance(value, dt.datetime) and style != "full":
        utc = value.astimezone(dt.timezone.utc)
        return utc.strftime("%m-%d %H:%M:%SZ" if style == "utc" else "%m-%d %H:%MZ")
    return one_line(value)


def _rich_overhead(n: int) -> int:
    return 3 * n - 1  # a space each side of each column, a rule between two


def plain_overhead(n: int) -> int:
    return 2 * (n - 1)  # two spaces between columns


# tabulate makes each column at least two wider than its header.
PLAIN_HEADER_PAD = 2


class Layout(NamedTuple):
    columns: list[str]
    widths: list[int]
    style: str  # of times: one of TIME_STYLES

    def cells(self, rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
        return [
            [
                cut(_one_line(r.get(c), self.style), w)
                for c, w in zip(self.columns, self.widths, strict=True)
            ]
            for r in rows
        ]


def fit(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    width: int,
    overhead: Callable[[int], int] = _rich_overhead,
    header_pad: int = 0,
) -> Layout:
    """The columns to show, their widths and the style of times, for a table
    of `rows` at most `width` wide (see COLUMNS).

    Tried in order, the first that fits wins: every column, with times from
    the longest style to the shortest, then without the least important
    column (an empty one first, whatever its rank, and no value is cut
    while an empty column is shown), and so on; cut columns keep at least their
    `ease` (or what they hold, if less). The first column is never left
    out. When even that does not fit, the layout that comes closest, with
    cut columns as narrow as their header.
    """
    texts = {c: [_one_line(r.get(c), "full") for r in rows] for c in columns}
    head = {c: len(c) + header_pad for c in columns}
    natural = {c: max([head[c], *(len(t) for t in texts[c])]) for c in columns}
    time_widths = {
        style: {
            c: max([head[c], *(len(_one_line(r.get(c), style)) for r in rows)])
            for c in columns
            if COLUMNS[c].shape == "time"
        }
        for style in TIME_STYLES
    }
    # The first column says what a row is (a job's id, a queue): it stays.
    # An empty column says nothing whatever its rank: it goes first.
    empty = {c for c in columns[1:] if not any(texts[c])}
    droppable = sorted(
        (c for c in columns[1:] if COLUMNS[c].rank or c in empty),
        key=lambda c: (c not in empty, COLUMNS[c].rank),
    )

    def attempt(kept: list[str], style: str, loose: bool, cut: bool = True) -> Layout | None:
        widths = {c: time_widths[style].get(c, natural[c]) for c in kept}
        cuttable = [c for c in kept if cut and COLUMNS[c].shape in ("error", "text")]
        floor = {
            c: head[c] if loose else max(head[c], min(natural[c], COLUMNS[c].ease))
            for c in cuttable
        }
        excess = sum(widths.values()) + overhead(len(kept)) - width
        # The error gives way first, then the other text, the widest first.
        for c in sorted(cuttable, key=lambda c: (COLUMNS[c].shape != "error", -widths[c])):
            if excess <= 0:
                break
            give = min(excess, widths[c] - floor[c])
            widths[c] -= give
            excess -= give
        if excess > 0 and not loose:
            return None
        return Layout(kept, [widths[c] for c in kept], style)

    for dropped in range(len(droppable) + 1):
        kept = [c for c in columns if c not in droppable[:dropped]]
        # Rather than cut a value, leave the empty columns out first.
        may_cut = not empty.intersection(kept)
        for style in TIME_STYLES:
            layout = attempt(kept, style, loose=False, cut=may_cut)
            if layout is not None:
                return layout
    kept = [c for c in columns if c not in droppable]
    layout = attempt(kept, TIME_STYLES[-1], loose=True)
    assert layout is not None
    return layout


class _FittedTable:
    """A listing that lays itself out for the width rich draws it in."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        columns: Sequence[str],
        title: str | None,
        caption: str | None,
    ) -> None:
        self.rows, self.columns, self.title, self.caption = rows, columns, title, caption

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.table import Table
        from rich.text import Text

        layout = fit(self.rows, self.columns, options.max_width)
        table = Table(title=self.title, caption=self.caption, header_style="bold", show_edge=False)
        for c, w in zip(layout.columns, layout.widths, strict=True):
            table.add_column(c, width=w, no_wrap=True, overflow="ellipsis")
        for cells in layout.cells(self.rows):
            # Text, not str: job data must never be read as rich markup.
            table.add_row(*(Text(cell, no_wrap=True, overflow="ellipsis") for cell in cells))
        yield table


def terminal_width(stream: IO[str]) -> int | None:
    """The width of the terminal `stream` writes to; None when it is not one."""
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return None


def rich_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    title: str | None = None,
    caption: str | None = None,
) -> Any:
    """The rich table of `table` output, to print or to show live. A listing
    is laid out for the width it is drawn in (see `fit`), each time it is."""
    if fitted(columns):
        return _FittedTable(rows, columns, title, caption)
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, caption=caption, header_style="bold", show_edge=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        # Text, not str: job data must never be read as rich markup.
        table.add_row(*(Text(human(r.get(c))) for c in columns))
    return table
