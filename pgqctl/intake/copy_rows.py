"""A checked job as a row of COPY's text format, the form every bulk path
sends (`job_row`), and such a row read back (`copy_value`, `row_columns`).

A row is n, then the job's fields in NewJob's order, with its unique key
last (`has_key` reads the row's end). A job without a limit key has no
limit_key field at all: the rows of a load without limit keys are what they
were before there were limit keys, and a chunk is copied with that column
only when one of its rows has one (`has_limit_keys`, `with_limit_key_column`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pgqctl.intake.fields import NewJob


def job_row(number: int | str, job: NewJob) -> str:
    """A validated job as one line of COPY's text format, in the columns of
    jobs_load_copy (of jobs_load_copy_limited when the job has a limit key).

    ``number`` orders the rows of a chunk: ids are given in that order
    (`fanout.row_number`).
    """
    return (
        f"{number}\t{copy_text(job.kind)}\t{copy_text(job.payload)}\t{copy_text(job.queue)}"
        f"\t{job.priority}\t{job.max_attempts}\t{timing_columns(job)}"
        f"{limit_key_column(job.limit_key)}"
        f"\t{_NO_KEY if job.unique_key is None else copy_text(job.unique_key)}\n"
    )


def limit_key_column(limit_key: str | None) -> str:
    """The limit_key field of a row, with the tab before it; none without a key."""
    return "" if limit_key is None else f"\t{copy_text(limit_key)}"


_NO_KEY = "\\N"
# How a COPY row without a unique key ends: a load none of whose rows has a
# key takes the plain INSERT, with no ON CONFLICT to pay for.
_KEYLESS_END = "\t\\N\n"
_TAB = "\t"
# The tabs of a row without a limit key, between n and the job's fields but
# limit_key; one with a key has one more. Values are escaped (copy_text):
# every tab in a row is a separator.
_PLAIN_TABS = len(NewJob._fields) - 1


def has_key(row: str) -> bool:
    """Whether the row's job has a unique key (its last field, whatever the row's shape)."""
    return not row.endswith(_KEYLESS_END)


def all_keyless(text: str, rows: int) -> bool:
    """Whether none of `rows` rows, joined into `text`, has a unique key:
    one count in C (a line end is only ever a row's end)."""
    return text.count(_KEYLESS_END) == rows


# The run_at and delay fields of a job due at once, the default (NULL, 0).
# Only run_at, limit_key and unique_key may be \N, and only unique_key, last,
# may be followed by a line end: this matches once in a row at most.
_DUE_NOW = "\t\\N\t0.0\t"


def all_due_now(text: str, rows: int) -> bool:
    """Whether each of `rows` rows, joined into `text`, is of a job due at
    once (neither run_at nor a delay given)."""
    return text.count(_DUE_NOW) == rows


def direct_text(ids: Iterable[int], rows: list[str]) -> str:
    """Rows of jobs due at once without a unique key (all_due_now,
    all_keyless), made the text of jobs_copy_direct: each row's number
    makes way for its id, and the fields jobs has no column for go (run_at
    and delay, so that the column's default applies, and the unique key).
    Rows with the limit_key field (with_limit_key_column) keep it."""
    text = "".join([f"{i}{row[row.index(_TAB) :]}" for i, row in zip(ids, rows, strict=True)])
    return text.replace(_DUE_NOW, _TAB).replace(_KEYLESS_END, "\n")


def has_limit_keys(text: str, rows: int) -> bool:
    """Whether any of `rows` rows, joined into `text`, has a limit key: one
    count of tabs in C, rather than a look at each row."""
    return text.count("\t") > _PLAIN_TABS * rows


def with_limit_key_column(rows: Iterable[str]) -> list[str]:
    """Rows all with a limit_key field (\\N where the job has no key), for a
    COPY that names the column."""
    return [
        row if row.count("\t") > _PLAIN_TABS else "\t\\N\t".join(row.rsplit("\t", 1))
        for row in rows
    ]


def timing_columns(job: NewJob) -> str:
    # str(): the text psycopg itself sends for a datetime and a float.
    run_at = "\\N" if job.run_at is None else str(job.run_at)
    return f"{run_at}\t{job.delay}"


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(text: str) -> str:
    """Text as a field of COPY's text format, which gives these four characters a meaning.

    Validation has already refused NUL, which PostgreSQL text cannot hold.
    """
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.translate(_COPY_ESCAPES)
    return text


def row_columns(rows: Iterable[str]) -> dict[str, list[Any]]:
    """COPY rows as the arrays of jobs_insert_arrays, one per NewJob field."""
    columns: dict[str, list[Any]] = {name: [] for name in NewJob._fields}
    for row in rows:
        # n, then the job's fields in NewJob's order (see job_row).
        fields = [copy_value(f) for f in row.rstrip("\n").split("\t")][1:]
        if len(fields) < len(NewJob._fields):  # no limit_key field: the job has no key
            fields.insert(_LIMIT_KEY_AT, None)
        for name, value in zip(NewJob._fields, fields, strict=True):
            columns[name].append(value)
    columns["priority"] = [int(v) for v in columns["priority"]]
    columns["max_attempts"] = [int(v) for v in columns["max_attempts"]]
    columns["delay"] = [float(v) for v in columns["delay"]]
    return columns


_LIMIT_KEY_AT = NewJob._fields.index("limit_key")
_COPY_UNESCAPES = {"\\\\": "\\", "\\t": "\t", "\\n": "\n", "\\r": "\r"}
_COPY_ESCAPE = re.compile(r"\\[\\tnr]")


def copy_value(field: str) -> str | None:
    """A field of COPY's text format as the value it stands for (see copy_text)."""
    if field == "\\N":
        return None
    if "\\" not in field:
        return field
    return _COPY_ESCAPE.sub(lambda m: _COPY_UNESCAPES[m.group(0)], field)
