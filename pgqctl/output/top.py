"""`top`: a whole-terminal view of queues, leases and workers, redrawn in place."""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pgqctl.text import ONE_LINE_ESCAPES, format_seconds, printable

if TYPE_CHECKING:
    from pgqctl.monitor import TopView


def _top_pause(until: dt.datetime | None) -> str:
    """A pause in top's narrow column: when it ends, in UTC (`stats` has the
    reason)."""
    if until is None:
        return "until resumed"
    return until.astimezone(dt.timezone.utc).strftime("%m-%d %H:%MZ")


def top_render(view: TopView, where: str, interval: float) -> Any:
    """One frame of `top` as a rich renderable, laid out for the terminal's
    height when it is drawn."""
    return _TopFrame(view, where, interval)


# The widest a text column may be, where 14 is too narrow to say enough (a
# limit's rule); the figures beside it still fit 80 columns.
_TEXT_WIDTHS = {"limit": 18, "allows": 24}

# Each section of top: its title, the table's top edge, header, rule and
# bottom edge around its rows.
_TOP_SECTION_LINES = 5


def share_rows(wanted: Sequence[int], available: int) -> list[int]:
    """Rows for each section of a screen `available` rows high: each gets
    its fair share first (what it wants, when that is less), then what is
    left goes to the sections in order."""
    given = [0] * len(wanted)
    left = max(available, 0)
    fair = left // max(len(wanted), 1)
    for i, want in enumerate(wanted):
        given[i] = min(want, fair)
    left -= sum(given)
    for i, want in enumerate(wanted):
        more = min(want - given[i], left)
        given[i] += more
        left -= more
    return given


class _TopFrame:
    """One frame of `top`: a one-line header, then queues, leases, workers
    and the run times per kind, each section given rows of the terminal's height so that none
    is pushed off the bottom (a section with more rows than it is given
    says how many more)."""

    def __init__(self, view: TopView, where: str, interval: float) -> None:
        self.view, self.where, self.interval = view, where, interval

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        view = self.view
        when = view.ts.astimezone(dt.timezone.utc).strftime("%H:%M:%SZ")
        # One line whatever the width: where it connects goes last, and is cut.
        header = Text(
            f"pgqctl top  {when}  every {format_seconds(self.interval)}  q quits  "
            f"{printable(self.where, ONE_LINE_ESCAPES)}",
            style="bold",
            no_wrap=True,
            overflow="ellipsis",
        )
        header.truncate(options.max_width, overflow="ellipsis")
        queues = [self._queue_row(name) for name in view.queues()]
        leases = [self._lease_row(lease) for lease in view.leases]
        # Active workers first: the stale ones are what gives way.
        workers = [
            self._worker_row(w)
            for w in sorted(view.workers, key=lambda w: (w.state != "active", w.id))
        ]
        limits = [self._limit_row(lim) for lim in view.limits]
        kinds = [self._kind_row(*times) for times in view.run_times]
        # (title, columns, text columns, rows); the limits only when any
        # exists, the run times only when the last minute had attempts: an
        # empty section would take rows the others need.
        sections: list[tuple[str, tuple[str, ...], tuple[str, ...], list[Any]]] = [
            (
                "queues",
                ("queue", "pending", "running", "done/s", "failed/s", "oldest due", "paused"),
                ("queue",),
                queues,
            ),
        ]
        if limits:
            sections.append(
                (
                    "limits",
                    ("limit", "allows", "running", "held back", "waiting"),
                    ("limit", "allows"),
                    limits,
                )
            )
        sections += [
            (
                "leases ending soonest",
                ("id", "queue", "kind", "attempt", "holder", "left"),
                ("queue", "kind", "holder", "left"),
                leases,
            ),
            (
                "workers",
                ("worker", "state", "jobs", "queues", "last seen"),
                ("worker", "state", "queues"),
                workers,
            ),
        ]
        if kinds:
            sections.append(
                (
                    "run times, last minute",
                    ("kind", "attempts", "p50", "p95", "p99"),
                    ("kind",),
                    kinds,
                )
            )
        height = options.height or console.size.height
        rows = share_rows(
            [len(s[3]) for s in sections], height - 1 - len(sections) * _TOP_SECTION_LINES
        )
        yield header
        for (title, names, left, section_rows), room in zip(sections, rows, strict=True):
            yield self._table(title, names, left, section_rows, room)

    @staticmethod
    def _table(
        title: str,
        names: tuple[str, ...],
        left: tuple[str, ...],
        rows: list[tuple[Any, ...]],
        room: int,
    ) -> Any:
        from rich import box
        from rich.table import Table

        # The whole width of a column whose values are wider than its header.
        wide = {"paused": len("until resumed")}
        # One line per row whatever the width: the text columns (`left`) are
        # cut to fit (at most 14 wide, never narrower than 8), so that the
        # figures and times, which stay whole, fit 80 columns.
        made = Table(
            title=title,
            title_justify="left",
            header_style="bold",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
        )
        for name in names:
            made.add_column(
                name,
                justify="left" if name in left else "right",
                no_wrap=True,
                overflow="ellipsis",
                min_width=min(len(name), 8) if name in left else max(len(name), wide.get(name, 0)),
                max_width=_TEXT_WIDTHS.get(name, 14) if name in left else None,
            )
        shown = rows if len(rows) <= room else rows[: max(room - 1, 0)]
        for row in shown:
            made.add_row(*row)
        if len(shown) < len(rows) and room > 0:
            made.add_row(f"+{len(rows) - len(shown):,} more", *[""] * (len(names) - 1))
        return made

    def _queue_row(self, name: str) -> tuple[Any, ...]:
        from rich.text import Text

        view = self.view
        c = view.counts.get(name)
        pending = c.by_status["pending"] if c else 0
        running = c.by_status["running"] if c else 0
        age = c.oldest_pending_age_seconds if c else None
        pause = view.paused.get(name)
        return (
            Text(printable(name, ONE_LINE_ESCAPES)),
            f"{pending:,}",
            f"{running:,}",
            f"{view.rate(name, 'done'):.1f}",
            f"{view.rate(name, 'failed'):.1f}",
            "-" if age is None else format_seconds(age),
            _top_pause(pause.until) if pause else "",
        )

    @staticmethod
    def _lease_row(lease: Any) -> tuple[Any, ...]:
        from rich.text import Text

        job = lease.job
        left = "none" if lease.seconds_left is None else format_seconds(lease.seconds_left)
        return (
            str(job.id),
            Text(printable(job.queue, ONE_LINE_ESCAPES)),
            Text(printable(job.kind, ONE_LINE_ESCAPES)),
            f"{job.tries}/{job.max_attempts}",
            Text(printable(job.locked_by or "", ONE_LINE_ESCAPES)),
            left + (" (expired)" if lease.expired else ""),
        )

    @staticmethod
    def _limit_row(limit: Any) -> tuple[Any, ...]:
        from rich.text import Text

        from pgqctl.output.limits import limit_cells

        cells = limit_cells(limit)
        return (
            Text(printable(cells["limit"], ONE_LINE_ESCAPES)),
            cells["allows"],
            cells["running"],
            cells["held_back"],
            cells["waiting"] or "-",
        )

    @staticmethod
    def _kind_row(kind: str, attempts: int, percentiles: Sequence[float]) -> tuple[Any, ...]:
        from rich.text import Text

        return (
            Text(printable(kind, ONE_LINE_ESCAPES)),
            f"{attempts:,}",
            *(format_seconds(p) for p in percentiles),
        )

    @staticmethod
    def _worker_row(w: Any) -> tuple[Any, ...]:
        from rich.text import Text

        return (
            Text(printable(w.id, ONE_LINE_ESCAPES)),
            w.state,
            f"{len(w.jobs)}/{w.concurrency}",
            Text(printable(", ".join(w.queues) or "all", ONE_LINE_ESCAPES)),
            format_seconds(w.seen_seconds_ago) + " ago",
        )


def top_screen(render: Callable[[], Any], interval: float) -> None:
    """Show `render()` on the whole terminal (its alternate screen), redrawn
    every `interval` seconds, until q or Ctrl-C; the screen, the cursor and the
    terminal's modes are restored whatever ends it."""
    import select
    import termios
    import tty

    from rich.console import Console
    from rich.live import Live

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        # cbreak: keys come one at a time, unechoed; Ctrl-C still interrupts.
        tty.setcbreak(fd)
        with Live(
            render(), console=Console(), screen=True, auto_refresh=False, redirect_stdout=False
        ) as view:
            deadline = time.monotonic() + interval
            while True:
                ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
                if ready:
                    if os.read(fd, 64).lower().count(b"q"):
                        return
                    continue  # another key: nothing to do
                view.update(render(), refresh=True)
                deadline = time.monotonic() + interval
    except KeyboardInterrupt:
        return
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
