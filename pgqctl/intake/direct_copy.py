"""COPY straight into jobs, for the chunks of a load whose jobs are due at
once and have no unique key: their ids drawn from the sequence of jobs.id
first, then one COPY that stays open from chunk to chunk.

A COPY has no RETURNING, so the ids are drawn before it starts, and no
other statement can run on the connection while it is open. Each draw and
each start of a COPY is a round trip in which the server copies nothing, so
ids are drawn in blocks as large as the load (when its length is known; else
each about as many as were drawn before, so the blocks grow with the load;
MAX_DRAW at most),
and the COPY ends only to draw more, when a chunk of another shape comes, or
when it has taken chunks for about half the transaction's statement_timeout
(the whole COPY is one statement, however long the load; with a short
timeout, each chunk has a COPY of its own).

Ids drawn and not used (the load was shorter than its block, or a chunk
that needs its ids back from an INSERT came, `skip`) leave a gap in the
sequence, as a rolled-back insert does. The ids of a load still rise in
its order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from pgqctl.intake.copy_rows import direct_text
from pgqctl.intake.statements import run, statement
from pgqctl.sql import query

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

# The most ids one draw takes when the load's length calls for more: one
# statement of about 50 ms, well within a usual statement_timeout, whose ids
# come back as an array of 800 kB when another session drew some meanwhile.
MAX_DRAW = 100_000
# How far the server may be behind the rows sent when a COPY ends: the
# socket's buffers hold some MB of them, a second or two of the server's
# work on a loaded machine (on a quiet 2-core one, the server had read
# 28,000 of 60,500 rows sent).
SERVER_LAG = 2.0
# Rows are written this many at a time: the server starts on the first
# while the next are made.
PIECE_JOBS = 1000


class DirectCopy:
    """The open COPY straight into jobs of one load, and its ids drawn and
    not yet given. Used from one thread at a time; `end` before any other
    statement on the connection."""

    def __init__(
        self,
        cur: psycopg.Cursor[Any],
        table: sql.Identifier,
        sequence: int,
        expected: int | None,
        timeout: float,
    ) -> None:
        self.cur, self.table, self.sequence = cur, table, sequence
        # How many rows the load holds, when the caller knows.
        self.expected = expected
        # How long one COPY may go on taking chunks: half the
        # statement_timeout, less what the server may have yet to read when
        # it ends; none (a COPY a chunk) for a timeout of 2 * SERVER_LAG or less.
        self.open_for = max(0.0, timeout / 2 - SERVER_LAG) if timeout > 0 else None
        self.opened = 0.0  # time.monotonic() when the open COPY started
        self.ids: Sequence[int] = range(0)  # drawn, in order; given up to `at`
        self.at = 0
        self.drawn = 0
        self.given = 0
        self.stack: ExitStack | None = None  # the open COPY's
        self.copy: psycopg.Copy | None = None
        self.limited = False  # whether the open COPY names limit_key
        self.mixed = False  # whether some chunk went another way (`skip`)

    def write(self, rows: list[str], limited: bool) -> Sequence[int]:
        """Copy the rows (COPY rows of jobs due at once without a unique key,
        all with the limit_key field when `limited`); their ids in order.
        An exception ends the COPY with it, so the transaction fails."""
        try:
            if self.left() < len(rows):
                self.end()
                self._draw(len(rows) - self.left())
            if limited != self.limited or self._too_long():
                self.end()
            copy = self._start(limited) if self.copy is None else self.copy
            ids = self.ids[self.at : self.at + len(rows)]
            self.at += len(rows)
            for start in range(0, len(rows), PIECE_JOBS):
                end = start + PIECE_JOBS
                copy.write(direct_text(ids[start:end], rows[start:end]))
            self.given += len(rows)
            return ids
        except BaseException as exc:
            self.end(exc)
            raise

    def skip(self) -> None:
        """A chunk goes another way (an INSERT, which takes its ids from
        the sequence then): end the COPY and give up the ids left, which
        would come before that chunk's, so that ids keep the input's order.
        From then on each draw is only what its chunk needs, as a load that
        mixes ways would give up most of a larger block each time."""
        self.end()
        self.ids, self.at, self.mixed = range(0), 0, True

    def left(self) -> int:
        """How many ids are drawn and not yet given."""
        return len(self.ids) - self.at

    def end(self, exc: BaseException | None = None) -> None:
        """End the open COPY, if any; with `exc`, abort it (its rows never
        go in, and the transaction must roll back)."""
        stack, self.stack, self.copy = self.stack, None, None
        if stack is None:
            return
        if exc is None:
            stack.close()
        else:
            stack.__exit__(type(exc), exc, exc.__traceback__)

    def _too_long(self) -> bool:
        """Whether the open COPY has been open for as long as it may."""
        return self.open_for is not None and time.monotonic() - self.opened > self.open_for

    def _start(self, limited: bool) -> psycopg.Copy:
        copied = "jobs_copy_direct_limited" if limited else "jobs_copy_direct"
        stack = ExitStack()
        self.opened = time.monotonic()
        copy = stack.enter_context(self.cur.copy(statement(copied, self.table)))
        self.stack, self.copy, self.limited = stack, copy, limited
        return copy

    def _draw(self, needed: int) -> None:
        """At least `needed` more ids, after those left."""
        rest = None if self.expected is None else self.expected - self.given - self.left()
        if self.mixed:
            wanted = 0
        elif rest is not None and rest > 0:
            wanted = rest
        else:
            # Unknown, or more rows than expected (a record of several
            # kinds): as many as so far, so that the blocks double.
            wanted = self.drawn
        count = max(needed, min(wanted, MAX_DRAW))
        run(self.cur, query("jobs_draw_ids"), {"sequence": self.sequence, "count": count})
        row = self.cur.fetchone()
        assert row is not None  # an aggregate's one row
        first, last, listed = row
        drawn: Sequence[int] = range(first, last + 1) if listed is None else listed
        # The ids left were drawn before these, so the order holds.
        left = self.ids[self.at :]
        self.ids, self.at = ([*left, *drawn] if left else drawn), 0
        self.drawn += count
