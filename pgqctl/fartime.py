"""Times PostgreSQL holds and a Python datetime cannot: 'infinity',
'-infinity', a year after 9999 or before 1.

Plain SQL may write one in any timestamptz column of a job (run_at =
'infinity': a job never due). psycopg refuses to load them ("timestamp too
large"), which made every command that reads such a row fail, and a
worker's claim with it; each connection pgqctl opens loads them as a
`FarTime` instead (pgqctl/db.py), and sends one back as it came.

No database here, no library: the worker's payload code uses `FarTime`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any


class FarTime(dt.datetime):
    """A time no datetime holds: datetime.max (min for '-infinity' and years
    before 1), in UTC, so that it compares, sorts and subtracts as the
    furthest time a datetime can be; shown as PostgreSQL wrote it (`text`),
    in every format and every time zone."""

    text: str

    def __new__(cls, text: str) -> FarTime:
        early = text.startswith("-") or text.endswith(" BC")
        edge = dt.datetime.min if early else dt.datetime.max
        self = super().__new__(cls, *edge.timetuple()[:6], edge.microsecond, tzinfo=dt.timezone.utc)
        self.text = text
        return self

    @staticmethod
    def holds(text: str) -> bool:
        """Whether `text`, a timestamptz as PostgreSQL writes it (DateStyle
        ISO), is beyond a datetime: infinite, BC, or a year of 5 digits."""
        return text in ("infinity", "-infinity") or text.endswith(" BC") or text[4:5].isdigit()

    # datetime's own would rebuild it from its bytes, which __new__ does not
    # take: copies (dataclasses.asdict) and pickles are made from the text.
    def __reduce_ex__(self, protocol: Any) -> tuple[type[FarTime], tuple[str]]:
        return (FarTime, (self.text,))

    # A datetime method would show datetime.max, or overflow moving it to
    # another zone; the time is shown as written, and is as far in every zone.
    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.text

    def strftime(self, format: str) -> str:
        return self.text

    def __format__(self, format_spec: str) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"FarTime({self.text!r})"

    def astimezone(self, tz: Any = None) -> FarTime:
        return self

    # copy and pickle make it again from its text (datetime's own way would
    # pass this constructor a datetime's state).
    def __reduce__(self) -> tuple[Any, ...]:
        return (FarTime, (self.text,))
