"""The formats a command writes its records in (their names are in
`pgqctl.formats`).

`auto` is a rich table on a terminal and a plain tabulate table when piped.
Machine formats (json, ndjson, csv, tsv) carry every field of each record;
human formats show the columns a command chose. Data goes to stdout only.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import IO, Any, Protocol

from pgqctl.errors import PgqctlError
from pgqctl.formats import HUMAN_FORMATS
from pgqctl.output.fitting import (
    PLAIN_HEADER_PAD,
    fit,
    fitted,
    plain_overhead,
    rich_table,
    terminal_width,
)
from pgqctl.text import cut, human, id_span, jsonable, one_line, plural


def resolve_format(fmt: str, stream: IO[str] | None = None) -> str:
    """Turn `auto` into `table` on a terminal and `plain` otherwise."""
    if fmt != "auto":
        return fmt
    stream = stream or sys.stdout
    return "table" if stream.isatty() else "plain"


def is_human(fmt: str) -> bool:
    """Whether `fmt` is for people (a table) rather than for programs."""
    return resolve_format(fmt) in HUMAN_FORMATS


def emit_rows(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    fmt: str,
    *,
    stream: IO[str] | None = None,
    title: str | None = None,
    width: int | None = None,
) -> None:
    """Write records in the chosen format; a table fits `width` when given,
    else the terminal's (see `fit`)."""
    stream = stream or sys.stdout
    fmt = resolve_format(fmt, stream)
    if fmt == "json":
        # One C-encoded string: listings may hold 100,000 rows.
        stream.write(_json([dict(r) for r in rows]) + "\n")
    elif fmt == "ndjson":
        for r in rows:
            stream.write(_json(dict(r)) + "\n")
    elif fmt in ("csv", "tsv"):
        _write_delimited(rows, columns, stream, "," if fmt == "csv" else "\t")
    elif fmt == "table":
        _write_rich(rows, columns, stream, title, width)
    else:
        _write_plain(rows, columns, stream, width)


# A stream of records is kept in memory up to this much, then in a file.
SPOOL_MEMORY = 16 * 1024 * 1024


def emit_stream(
    records: Iterable[Mapping[str, Any]],
    fields: Sequence[str],
    fmt: str,
    *,
    stream: IO[str] | None = None,
) -> int:
    """Records in a machine format (json, ndjson, csv, tsv), each written as
    it comes, as emit_rows writes them all at once; the number written.

    They go to a temporary file first (in memory up to SPOOL_MEMORY), and to
    the stream once `records` is exhausted: a reader that pauses (`| less`)
    must not hold open the transaction the records come from.
    """
    import shutil
    import tempfile

    stream = stream or sys.stdout
    fmt = resolve_format(fmt, stream)
    if fmt in HUMAN_FORMATS:
        raise ValueError("emit_stream writes machine formats only")
    count = 0
    with tempfile.SpooledTemporaryFile(
        max_size=SPOOL_MEMORY, mode="w+", encoding="utf-8", newline=""
    ) as spool:
        if fmt == "json":
            spool.write("[")
            for r in records:
                spool.write((", " if count else "") + _json(dict(r)))
                count += 1
            spool.write("]\n")
        elif fmt == "ndjson":
            for r in records:
                spool.write(_json(dict(r)) + "\n")
                count += 1
        else:
            sep = "," if fmt == "csv" else "\t"
            writer = _DelimitedWriter(spool, fields, sep)
            for r in records:
                writer.row(r)
                count += 1
        spool.seek(0)
        shutil.copyfileobj(spool, stream)
    return count


def emit_new_ids(ids: Sequence[int], fmt: str, *, existing: Set[int] = frozenset()) -> None:
    """Print the ids of jobs just committed: bare, one a line, for people and
    for `id=$(pgqctl enqueue ...)`; records in machine formats, where those
    at the positions in `existing` (jobs that held a unique key) are marked. If they cannot
    be written, say that the jobs are in the queue all the same (a retry
    would add them twice)."""
    try:
        if fmt in ("auto", *HUMAN_FORMATS):
            if ids:
                sys.stdout.write("\n".join(map(str, ids)) + "\n")
        elif existing and fmt in ("json", "ndjson"):
            records = [
                {"id": i, "existing": True} if n in existing else {"id": i}
                for n, i in enumerate(ids)
            ]
            emit_rows(records, ["id", "existing"], fmt)
        elif existing:  # a column in every row
            records = [{"id": i, "existing": n in existing} for n, i in enumerate(ids)]
            emit_rows(records, ["id", "existing"], fmt)
        else:
            emit_ids(ids, fmt)
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader left (`| head`): not an error
    except OSError as exc:
        if not ids:
            raise
        one = len(ids) == 1
        raise PgqctlError(
            f"enqueued {plural(len(ids), 'job')} {id_span(ids)} but could not write "
            f"{'its id' if one else 'their ids'}: {exc.strerror or exc}; "
            f"{'it is' if one else 'they are'} in the queue: "
            f"do not enqueue {'it' if one else 'them'} again"
        ) from exc


def emit_ids(ids: Sequence[int], fmt: str, *, stream: IO[str] | None = None) -> None:
    """Job ids as records with the one field "id": the same text as emit_rows.

    Written without a dict per id: a bulk enqueue prints 100,000 of them.
    """
    stream = stream or sys.stdout
    fmt = resolve_format(fmt, stream)
    if fmt == "json":
        stream.write('[{"id": ' + '}, {"id": '.join(map(str, ids)) + "}]\n" if ids else "[]\n")
    elif fmt == "ndjson":
        stream.write("".join(f'{{"id": {i}}}\n' for i in ids))
    elif fmt in ("csv", "tsv"):
        stream.write("".join(["id\n", *(f"{i}\n" for i in ids)]))
    else:
        emit_rows([{"id": i} for i in ids], ["id"], fmt, stream=stream)


class Record(Protocol):
    """A job, or a job with what a listing adds (a lease's time left...)."""

    def as_record(self) -> dict[str, Any]: ...


# The fields `emit_record` shows on several lines; every other is one line.
MULTILINE_FIELDS = frozenset(("payload", "last_error"))


def emit_record(record: Mapping[str, Any], fmt: str) -> None:
    """One thing described whole: a field/value table for people, one JSON
    object, or a one-row CSV/TSV."""
    resolved = resolve_format(fmt)
    if resolved in HUMAN_FORMATS:
        rows = [
            {"field": k, "value": v if k in MULTILINE_FIELDS else one_line(v)}
            for k, v in record.items()
        ]
        emit_rows(rows, ["field", "value"], fmt)
    elif resolved in ("csv", "tsv"):
        emit_rows([record], list(record), fmt)
    else:
        emit_object(record)


def emit_result(result: Mapping[str, Any], fmt: str) -> None:
    """What a command did, for programs (`{"deleted": 5}`); people are told
    on stderr instead, so a table format writes nothing."""
    if not is_human(fmt):
        emit_record(result, fmt)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> Any:
    """What the encoder cannot write itself (timestamps, durations...), made JSON."""
    converted = jsonable(value)
    if converted is value:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return converted


def emit_object(obj: Mapping[str, Any], stream: IO[str] | None = None) -> None:
    """Write one JSON object (for commands whose JSON is not a list)."""
    stream = stream or sys.stdout
    json.dump(jsonable(obj), stream, ensure_ascii=False)
    stream.write("\n")


def _write_delimited(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], stream: IO[str], sep: str
) -> None:
    writer = _DelimitedWriter(stream, list(rows[0].keys()) if rows else list(columns), sep)
    for r in rows:
        writer.row(r)


class _DelimitedWriter:
    """CSV or TSV: the header at once, then a line per record."""

    def __init__(self, stream: IO[str], keys: Sequence[str], sep: str) -> None:
        self.keys = list(keys)
        self.stream = stream
        self.csv = None if sep == "\t" else csv.writer(stream, delimiter=sep, lineterminator="\n")
        if self.csv is None:
            stream.write("\t".join(self.keys) + "\n")
        else:
            self.csv.writerow(self.keys)

    def row(self, r: Mapping[str, Any]) -> None:
        if self.csv is None:
            # TSV: one line per record whatever the data, for line-based tools:
            # backslash, tab, newline and carriage return are escaped as
            # PostgreSQL's text format does (\\, \t, \n, \r); nothing is quoted.
            cells = (_delimited_cell(r.get(k)).translate(_TSV_ESCAPES) for k in self.keys)
            self.stream.write("\t".join(cells) + "\n")
        else:
            self.csv.writerow([_delimited_cell(r.get(k)) for k in self.keys])


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _delimited_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):  # as JSON writes them, not Python's True and False
        return "true" if value else "false"
    if isinstance(value, (Mapping, list)):
        return json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value.total_seconds())
    return str(value)


def _write_plain(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    stream: IO[str],
    width: int | None = None,
) -> None:
    """A tabulate table. On a terminal (or given a `width`) a listing is
    fitted to its width as the rich table is; piped, it has no width, and
    every column is written whole (errors cut at 60 characters, as ever)."""
    from tabulate import tabulate

    if not rows:
        return
    if width is None and fitted(columns):
        width = terminal_width(stream)
    if width is not None and fitted(columns):
        layout = fit(rows, columns, width, plain_overhead, PLAIN_HEADER_PAD)
        table = layout.cells(rows)
        headers = layout.columns
    else:
        table = [[_piped_cell(c, r.get(c)) for c in columns] for r in rows]
        headers = list(columns)
    stream.write(tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True))
    stream.write("\n")


# Cells of a piped table that keep their lines: an error, and the value of
# a field `emit_record` shows on several lines (it has made the others one
# line). Every other cell is one line, whatever it holds.
_CELLS_OF_LINES = ("error", "value")


def _piped_cell(column: str, value: Any) -> str:
    if column == "error":
        return cut(human(value), 60)
    return human(value) if column in _CELLS_OF_LINES else one_line(value)


def _write_rich(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    stream: IO[str],
    title: str | None,
    width: int | None = None,
) -> None:
    from rich.console import Console

    if not rows:
        return
    Console(file=stream, width=width).print(rich_table(rows, columns, title=title))


def emit_number(n: int) -> None:
    """One figure alone on its line (`stats --metric`), whatever the format."""
    sys.stdout.write(f"{n}\n")
