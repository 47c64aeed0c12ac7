"""The only module that knows output formats.

`auto` is a rich table on a terminal and a plain tabulate table when piped.
Machine formats (json, ndjson, csv, tsv) carry every field of each record;
human formats show the columns a command chose. Data goes to stdout only.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from pgqctl.errors import PgqctlError

if TYPE_CHECKING:
    from pgqctl.admin import Stats

FORMATS = ("auto", "table", "plain", "json", "ndjson", "csv", "tsv")
HUMAN_FORMATS = ("table", "plain")


def resolve_format(fmt: str, stream: IO[str] | None = None) -> str:
    """Turn `auto` into `table` on a terminal and `plain` otherwise."""
    if fmt != "auto":
        return fmt
    stream = stream or sys.stdout
    return "table" if stream.isatty() else "plain"


def is_human(fmt: str) -> bool:
    """Whether `fmt` is for people (a table) rather than for programs."""
    return resolve_format(fmt) in HUMAN_FORMATS


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def id_span(ids: Sequence[int]) -> str:
    """(id 5), (ids 5..9), or (ids from 5 to 12) when they are not contiguous."""
    if len(ids) == 1:
        return f"(id {ids[0]})"
    contiguous = ids[-1] - ids[0] == len(ids) - 1
    return f"(ids {ids[0]}..{ids[-1]})" if contiguous else f"(ids from {ids[0]} to {ids[-1]})"


def jsonable(value: Any) -> Any:
    """A value JSON can carry: timestamps as ISO 8601, durations as seconds."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def human(value: Any) -> str:
    """A value as a person reads it in a table cell."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, dt.timedelta):
        return format_seconds(value.total_seconds())
    if isinstance(value, (Mapping, list)):
        return printable(json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False))
    if isinstance(value, float):
        return f"{value:.1f}"
    return printable(str(value))


def _control_escapes(keep: str) -> dict[int, str]:
    escapes = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in keep}
    # The Unicode line and paragraph separators: some viewers break lines there.
    return {**escapes, 0x2028: "\\u2028", 0x2029: "\\u2029"}


# Job data shown to a person (a kind, an error, a job's output) may hold
# terminal escapes or carriage returns: shown escaped (\x1b), they cannot
# recolour the terminal or overwrite what is around them. Table cells keep
# tabs and newlines (`show` prints a whole error); log lines keep only tabs.
CELL_ESCAPES = _control_escapes("\t\n")
LINE_ESCAPES = _control_escapes("\t")


def printable(text: str, escapes: Mapping[int, str] = CELL_ESCAPES) -> str:
    """`text` with its control characters escaped (but for those `escapes` keeps)."""
    return text if text.isprintable() else text.translate(escapes)


def format_seconds(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m, 3d04h; negative values keep their sign."""
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def emit_rows(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    fmt: str,
    *,
    stream: IO[str] | None = None,
    title: str | None = None,
) -> None:
    """Write records in the chosen format."""
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
        _write_rich(rows, columns, stream, title)
    else:
        _write_plain(rows, columns, stream)


def emit_new_ids(ids: Sequence[int], fmt: str) -> None:
    """Print the ids of jobs just committed: bare, one a line, for people and
    for `id=$(pgqctl enqueue ...)`; records in machine formats. If they cannot
    be written, say that the jobs are in the queue all the same (a retry
    would add them twice)."""
    try:
        if fmt in ("auto", *HUMAN_FORMATS):
            if ids:
                sys.stdout.write("\n".join(map(str, ids)) + "\n")
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
        "attempt": f"{job['attempts']}/{job['max_attempts']}",
        "left": left or "",
        "error": first_line(job.get("last_error")),
    }


def first_line(text: str | None, width: int = 60) -> str:
    """The first line of an error, cut to fit a table cell."""
    lines = (text or "").strip().splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def emit_record(record: Mapping[str, Any], fmt: str) -> None:
    """One thing described whole: a field/value table for people, one JSON
    object, or a one-row CSV/TSV."""
    resolved = resolve_format(fmt)
    if resolved in HUMAN_FORMATS:
        rows = [{"field": k, "value": v} for k, v in record.items()]
        emit_rows(rows, ["field", "value"], fmt)
    elif resolved in ("csv", "tsv"):
        emit_rows([record], list(record), fmt)
    else:
        emit_object(record)


def emit_job(job: Record, fmt: str) -> None:
    """One job whole (`show`): for people, its payload pretty-printed."""
    record = job.as_record()
    if is_human(fmt):
        record["payload"] = json.dumps(record["payload"], indent=2, ensure_ascii=False)
    emit_record(record, fmt)


def emit_result(result: Mapping[str, Any], fmt: str) -> None:
    """What a command did, for programs (`{"deleted": 5}`); people are told
    on stderr instead, so a table format writes nothing."""
    if not is_human(fmt):
        emit_record(result, fmt)


# --- stats ---------------------------------------------------------------------

STATS_COLUMNS = ["queue", "pending", "running", "expired", "done", "failed", "oldest_pending"]
ESTIMATE_NOTE = "~ marks estimated done counts; --exact counts them"


def _stats_rows(stats: Stats) -> list[dict[str, Any]]:
    """One row per queue and a total row, as the human tables show them."""
    mark = "~" if stats.estimated else ""
    scopes = [*stats.queues.items(), ("(total)", stats.totals)]
    rows = []
    for name, c in scopes:
        age = c.oldest_pending_age_seconds
        rows.append(
            {
                **c.by_status,
                "queue": name,
                "expired": c.expired_leases,
                "done": f"{mark}{c.done}",
                "oldest_pending": "" if age is None else format_seconds(age),
            }
        )
    return rows


def stats_table(stats: Stats) -> Any:
    """`stats` as a rich table, to print or to redraw live."""
    caption = ESTIMATE_NOTE if stats.estimated else None
    return rich_table(_stats_rows(stats), STATS_COLUMNS, caption=caption)


def emit_stats(stats: Stats, fmt: str) -> None:
    data = stats.as_json()
    resolved = resolve_format(fmt)
    if resolved in ("json", "ndjson"):
        emit_object(data)
    elif resolved in ("csv", "tsv"):
        total = {"queue": "(total)", **stats.totals.as_record()}
        rows = [{**r, "estimated": stats.estimated} for r in [*data["queues"], total]]
        emit_rows(rows, list(rows[0]), fmt)
    else:
        emit_rows(_stats_rows(stats), STATS_COLUMNS, fmt)


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
    keys = list(rows[0].keys()) if rows else list(columns)
    if sep == "\t":
        # TSV: one line per record whatever the data, for line-based tools:
        # backslash, tab, newline and carriage return are escaped as
        # PostgreSQL's text format does (\\, \t, \n, \r); nothing is quoted.
        stream.write("\t".join(keys) + "\n")
        for r in rows:
            cells = (_delimited_cell(r.get(k)).translate(_TSV_ESCAPES) for k in keys)
            stream.write("\t".join(cells) + "\n")
        return
    writer = csv.writer(stream, delimiter=sep, lineterminator="\n")
    writer.writerow(keys)
    for r in rows:
        writer.writerow([_delimited_cell(r.get(k)) for k in keys])


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _delimited_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (Mapping, list)):
        return json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value.total_seconds())
    return str(value)


def _write_plain(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], stream: IO[str]
) -> None:
    from tabulate import tabulate

    if not rows:
        return
    table = [[human(r.get(c)) for c in columns] for r in rows]
    stream.write(tabulate(table, headers=list(columns), tablefmt="simple", disable_numparse=True))
    stream.write("\n")


def _write_rich(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], stream: IO[str], title: str | None
) -> None:
    from rich.console import Console

    if not rows:
        return
    Console(file=stream).print(rich_table(rows, columns, title=title))


def rich_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    title: str | None = None,
    caption: str | None = None,
) -> Any:
    """The rich Table of `table` output, to print or to show live."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, caption=caption, header_style="bold", show_edge=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        # Text, not str: job data must never be read as rich markup.
        table.add_row(*(Text(human(r.get(c))) for c in columns))
    return table


def live(render: Callable[[], Any], interval: float, stream: IO[str] | None = None) -> None:
    """Redraw `render()` in place every `interval` seconds; returns on Ctrl-C."""
    from rich.console import Console
    from rich.live import Live

    try:
        with Live(render(), console=Console(file=stream or sys.stdout), auto_refresh=False) as view:
            while True:
                time.sleep(interval)
                view.update(render(), refresh=True)
    except KeyboardInterrupt:
        return


@contextlib.contextmanager
def progress(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; yields `advance(n)`."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


class _FileProgress:
    """A progress bar on stderr over the bytes of a file read so far, and the
    jobs sent."""

    def __init__(self, size: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("enqueueing", total=size)

    def lines(self, f: Iterable[bytes]) -> Iterator[bytes]:
        done = 0
        for number, line in enumerate(f, start=1):
            done += len(line)
            if number % 10000 == 0:
                self.bar.update(self.task, completed=done)
            yield line
        self.bar.update(self.task, completed=done)

    def sent(self, count: int) -> None:
        self.bar.update(self.task, description=f"enqueueing: {count:,} jobs")


@contextlib.contextmanager
def file_progress(f: Any) -> Iterator[_FileProgress | None]:
    """A progress bar over reading `f` when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        size = os.fstat(f.fileno()).st_size  # 0 for a pipe: the bar then just pulses
    except (OSError, ValueError):
        size = 0
    progress = _FileProgress(size or None)
    with progress.bar:
        yield progress
