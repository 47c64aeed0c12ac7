"""The only module that renders output formats (their names are in
`pgqctl.formats`).

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
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol

from pgqctl.errors import PgqctlError
from pgqctl.formats import HUMAN_FORMATS as HUMAN_FORMATS  # the commands name it from here

if TYPE_CHECKING:
    from pgqctl.admin import Stats
    from pgqctl.doctor import Report
    from pgqctl.monitor import CheckResult, TopView


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
# Names (queues, kinds, workers) and every cell of a listing keep nothing: a
# queue named "evil\nCRITICAL fake" is one cell on one line, wherever shown.
ONE_LINE_ESCAPES = _control_escapes("")


def printable(text: str, escapes: Mapping[int, str] = CELL_ESCAPES) -> str:
    """`text` with its control characters escaped (but for those `escapes` keeps)."""
    return text if text.isprintable() else text.translate(escapes)


def one_line(value: Any) -> str:
    """A value as a person reads it, on one line whatever it holds."""
    return printable(human(value), ONE_LINE_ESCAPES)


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


# The first line of a last_error the worker wrote (runner.Outcome.last_error)
# says how the job ended, and the output that follows says why: a program's
# last line is most often its error ("convert: no such file a.png", a
# traceback's "ValueError: ...").
_HOW_IT_ENDED = re.compile(
    r"exit status -?\d+|killed by signal \d+ \(\w+\)|timed out after .+|stopped: .+"
)
_TRUNCATION_NOTE = "[output truncated:"


def error_summary(text: str | None) -> str:
    """Why a job failed, on one line: the first line of its last_error, and
    after a worker's "exit status 1" (or a signal, a timeout) the last line
    of the job's output."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0], lines[-1]
    if len(lines) > 1 and _HOW_IT_ENDED.fullmatch(first) and not last.startswith(_TRUNCATION_NOTE):
        return f"{first}: {last}"
    return first


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, ending in … when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


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


def emit_job(job: Record, fmt: str) -> None:
    """One job whole (`show`): for people, its payload pretty-printed, and
    under a payload or an error cut (or a payload too deep to decode) a
    note that says so; JSON says it in payload_note, payload_cut and
    last_error_cut."""
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


def emit_result(result: Mapping[str, Any], fmt: str) -> None:
    """What a command did, for programs (`{"deleted": 5}`); people are told
    on stderr instead, so a table format writes nothing."""
    if not is_human(fmt):
        emit_record(result, fmt)


# --- stats ---------------------------------------------------------------------

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


def pause_summary(until: dt.datetime | None, reason: str | None) -> str:
    """A pause on one line: `until 2026-12-02 10:30:00+00:00: smtp down`."""
    end = "until resumed" if until is None else f"until {human(until)}"
    return f"{end}: {reason}" if reason else end


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


# --- pauses ----------------------------------------------------------------------

PAUSE_COLUMNS = ["queue", "until", "reason", "paused_at"]


def emit_pauses(pauses: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Pauses as a table (an open end shown as `until resumed`), or as records."""
    records = [p.as_record() for p in pauses]
    if is_human(fmt):
        cells = [{**r, "until": r["until"] or "until resumed"} for r in records]
        emit_rows(cells, PAUSE_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)


# --- schedules -------------------------------------------------------------------

SCHEDULE_COLUMNS = [
    "name",
    "timing",
    "timezone",
    "next_tick",
    "last_tick",
    "job",
    "job_status",
    "paused",
    "missed_since",
]


def emit_schedules(schedules: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Schedules as a table (`missed_since`: the first tick not enqueued in
    time, while one is), or as records of their `fields`."""
    records = [s.as_record() for s in schedules]
    if is_human(fmt):
        emit_rows([_schedule_cells(r) for r in records], SCHEDULE_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)


# --- workers ---------------------------------------------------------------------

WORKER_COLUMNS = [
    "host",
    "pid",
    "state",
    "queues",
    "kinds",
    "concurrency",
    "running",
    "done",
    "failed",
    "version",
    "started_at",
    "last_seen",
    "jobs",
    "prefetched",
]


def _worker_cells(worker: Mapping[str, Any]) -> dict[str, Any]:
    """A worker as the table shows it: `all` for no --queue (--kind), when it
    was last seen as an age, the jobs it holds (running, prefetched) as their ids."""
    return {
        **worker,
        "queues": ",".join(worker["queues"]) or "all",
        "kinds": ",".join(worker["kinds"]) or "all",
        "last_seen": format_seconds(max(float(worker["seen_seconds_ago"]), 0.0)) + " ago",
        "jobs": id_ranges(worker["jobs"]),
        "prefetched": id_ranges(worker["prefetched"]),
    }


def id_ranges(ids: Sequence[int]) -> str:
    """Job ids the way a person reads many of them: `9-14, 20` for
    9, 10, 11, 12, 13, 14 and 20 (a worker claims in batches, so its ids
    often run on)."""
    runs: list[list[int]] = []
    for job_id in sorted(ids):
        if runs and job_id == runs[-1][1] + 1:
            runs[-1][1] = job_id
        else:
            runs.append([job_id, job_id])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def emit_workers(workers: Sequence[Record], fmt: str, fields: Sequence[str]) -> None:
    """Workers as a table, or as records of their `fields`."""
    records = [w.as_record() for w in workers]
    if is_human(fmt):
        emit_rows([_worker_cells(r) for r in records], WORKER_COLUMNS, fmt)
    else:
        emit_rows(records, fields, fmt)


def _schedule_cells(r: Mapping[str, Any]) -> dict[str, Any]:
    from pgqctl.schedules import Timing

    every = r["every_seconds"]
    timing = Timing(r["cron"], every, r["timezone"]).describe()
    return {
        **r,
        "timing": timing,
        "timezone": r["timezone"] if every is None else "",
        "job": r["last_job_id"],
        # A purged job has no status left to show.
        "job_status": r["last_job_status"] or ("purged" if r["last_job_id"] else ""),
        "paused": "paused" if r["paused"] else "",
    }


def emit_schedule(schedule: Record, fmt: str) -> None:
    """One schedule whole (`schedule show`): for people, its payload pretty-printed."""
    record = schedule.as_record()
    if is_human(fmt):
        record["payload"] = json.dumps(record["payload"], indent=2, ensure_ascii=False)
    emit_record(record, fmt)


SYNC_COLUMNS = ["action", "name", "fields"]


def emit_sync(changes: Sequence[Record], fmt: str) -> None:
    """What a sync changes: one row per schedule added, updated or removed."""
    records = [c.as_record() for c in changes]
    if is_human(fmt):
        cells = [{**r, "fields": ", ".join(r["fields"])} for r in records]
        emit_rows(cells, SYNC_COLUMNS, fmt)
    else:
        emit_rows(records, SYNC_COLUMNS, fmt)


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
        width = _terminal_width(stream)
    if width is not None and fitted(columns):
        layout = fit(rows, columns, width, _plain_overhead, _PLAIN_HEADER_PAD)
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


def _terminal_width(stream: IO[str]) -> int | None:
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return None


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


# --- fitting a listing to the terminal ------------------------------------------
#
# A listing on a terminal never wraps inside a value (a time broken as
# `2026-12-0` / `1` is unreadable, and a job takes many lines). Where the
# columns do not fit: text the user chose is cut with … (the error first,
# then kinds and queues); then times are shortened; then the least important
# columns are left out. Ids, statuses, attempts, counts, times and the
# worker in locked_by are never cut.


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


def _plain_overhead(n: int) -> int:
    return 2 * (n - 1)  # two spaces between columns


# tabulate makes each column at least two wider than its header.
_PLAIN_HEADER_PAD = 2


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


def emit_number(n: int) -> None:
    """One figure alone on its line (`stats --metric`), whatever the format."""
    sys.stdout.write(f"{n}\n")


# --- check and metrics -----------------------------------------------------------


def emit_check(result: CheckResult, fmt: str) -> None:
    """JSON: every figure with its threshold; else one line per breach, nothing more."""
    if resolve_format(fmt) in ("json", "ndjson"):
        emit_object(result.as_json())
        return
    for line in result.breaches():
        sys.stdout.write(printable(line, ONE_LINE_ESCAPES) + "\n")


def metrics_text(registry: Any) -> bytes:
    """The Prometheus text exposition of `registry`, written by prometheus_client."""
    from prometheus_client import generate_latest

    return generate_latest(registry)


def emit_metrics(registry: Any) -> None:
    sys.stdout.write(metrics_text(registry).decode())


def write_metrics_textfile(path: str, registry: Any) -> None:
    """The exposition written to a temporary file beside `path`, then renamed
    over it: a reader (node_exporter's textfile collector) sees the old file
    or the new one, never part of one; a failure leaves the old one."""
    from prometheus_client import write_to_textfile

    try:
        write_to_textfile(path, registry)
    except OSError as exc:
        # Named as given: the temporary file's name would only puzzle.
        raise PgqctlError(f"cannot write {path}: {exc.strerror or exc}") from exc


# --- doctor ------------------------------------------------------------------------


def size(n: int | None) -> str:
    """Bytes as a person reads them: 8.0 kB, 3.9 MB."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # not reached


def _when(stamp: dt.datetime | None, count: int | None) -> str:
    at = "never" if stamp is None else stamp.isoformat(sep=" ", timespec="seconds")
    return f"{at} ({count or 0} in all)"


def _bloat_text(bloat: Any) -> str:
    if bloat.bytes is None:
        return f"bloat ? ({bloat.method}: not analyzed yet)"
    exact = "exact, pgstattuple" if bloat.method == "pgstattuple" else "estimate"
    return f"bloat {size(bloat.bytes)} ({bloat.percent:g}%, {exact})"


def doctor_lines(report: Report, *, verbose: bool = False) -> list[str]:
    """The report as text: the findings first (what to do), then the
    horizon, autovacuum and one line per table; each table's counters and
    indexes only when `verbose`."""
    lines = []
    for f in report.findings:
        lines.append(printable(f"FINDING {f.kind} ({f.subject}): {f.summary}", LINE_ESCAPES))
        lines.append(f"  do: {f.recommendation}")
        for statement in f.sql:
            lines.append(f"  {printable(statement, LINE_ESCAPES)}")
        lines.append("")
    lines.append("horizon:")
    if not report.holders:
        lines.append("  nothing holds it back")
    for h in report.holders:
        lines.append(f"  {printable(_holder_text(h), LINE_ESCAPES)}")
    av = report.autovacuum
    lines.append(
        f"autovacuum: {'on' if av['enabled'] else 'OFF'}, {av['busy_workers']} of "
        f"{av['max_workers']} workers busy, naptime {format_seconds(av['naptime_seconds'])}"
    )
    for t in report.tables:
        lines.append(
            f"{t.name}: {t.live:,} live, {t.dead:,} dead tuples; table {size(t.table_bytes)}, "
            f"indexes {size(t.index_bytes)}; {_bloat_text(t.bloat)}"
        )
        if verbose:
            lines.extend(_table_details(t))
    return lines


def _table_details(t: Any) -> list[str]:
    """A table's vacuum and analyze counters, settings and indexes (--verbose)."""
    c = t.counters
    lines = [
        f"  vacuum {_when(c['last_vacuum'], c['vacuum_count'])}, "
        f"autovacuum {_when(c['last_autovacuum'], c['autovacuum_count'])}",
        f"  analyze {_when(c['last_analyze'], c['analyze_count'])}, "
        f"autoanalyze {_when(c['last_autoanalyze'], c['autoanalyze_count'])}",
        f"  changed since: {int(c['n_mod_since_analyze'] or 0):,} rows since analyze, "
        f"{int(c['n_ins_since_vacuum'] or 0):,} inserted since vacuum; in all "
        f"{int(c['n_tup_ins'] or 0):,} inserted, {int(c['n_tup_upd'] or 0):,} updated, "
        f"{int(c['n_tup_del'] or 0):,} deleted",
    ]
    if t.options:
        lines.append("  settings: " + ", ".join(f"{k}={v}" for k, v in t.options.items()))
    for i in t.indexes:
        density = "" if i.leaf_density is None else f", leaf density {i.leaf_density:g}%"
        lines.append(f"  index {i.name}: {size(i.bytes)}, {_bloat_text(i.bloat)}{density}")
    return lines


def _holder_text(h: Any) -> str:
    f = h.figures
    kept = ""
    if h.holds_queue:
        verb = "keeps" if h.kept_is == "counted" else "keeps up to"
        kept = f": {verb} {h.kept:,} dead tuples of the queue's tables"
    elif h.kind == "slot":
        kept = ": catalog_xmin only (system catalogs), not the queue's tables"
    age = "" if h.age_seconds is None else f", {format_seconds(h.age_seconds)} old"
    xids = f"{h.xid_age:,} transactions behind" if h.xid_age is not None else "age unknown"
    if h.kind == "transaction":
        if f["state"] is None:  # another role's session, to a role that may not see it
            parts = [f"user {f['user']}", f"application {f['application']!r}", "state not seen"]
        else:
            parts = [
                f"user {f['user']}",
                f"application {f['application']!r}",
                f"client {f['client_addr'] or 'local'}",
                f"{f['state']}",
                f"transaction started {human(f['xact_start'])}{age}",
                f"query started {human(f['query_start'])}",
            ]
        return f"pid {f['pid']} (" + ", ".join(parts) + f"; {xids}){kept}"
    if h.kind == "prepared":
        return (
            f"prepared transaction {f['gid']!r} (owner {f['owner']}, database "
            f"{f['database']}, prepared {human(f['prepared'])}{age}; {xids}){kept}"
        )
    if h.kind == "slot":
        state = "active" if f["active"] else "inactive"
        return (
            f"slot {f['slot_name']!r} ({f['slot_type']}, {state}, xmin {f['xmin'] or '-'}, "
            f"catalog_xmin {f['catalog_xmin'] or '-'}; {xids}){kept}"
        )
    return (
        f"standby pid {f['pid']} (application {f['application']!r}, client "
        f"{f['client_addr']}, hot_standby_feedback xmin {f['xmin']}; {xids}){kept}"
    )


def emit_doctor(report: Report, fmt: str, *, verbose: bool = False) -> None:
    """JSON: every figure and finding; else the report as text."""
    if resolve_format(fmt) in ("json", "ndjson"):
        emit_object(report.as_json())
        return
    sys.stdout.write("\n".join(doctor_lines(report, verbose=verbose)) + "\n")


# --- top --------------------------------------------------------------------------


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
    """One frame of `top`: a one-line header, then queues, leases and
    workers, each section given rows of the terminal's height so that none
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
        height = options.height or console.size.height
        rows = share_rows(
            [len(queues), len(leases), len(workers)], height - 1 - 3 * _TOP_SECTION_LINES
        )
        yield header
        yield self._table(
            "queues",
            ("queue", "pending", "running", "done/s", "failed/s", "oldest due", "paused"),
            ("queue",),
            queues,
            rows[0],
        )
        yield self._table(
            "leases ending soonest",
            ("id", "queue", "kind", "attempt", "holder", "left"),
            ("queue", "kind", "holder", "left"),
            leases,
            rows[1],
        )
        yield self._table(
            "workers",
            ("worker", "state", "jobs", "queues", "last seen"),
            ("worker", "state", "queues"),
            workers,
            rows[2],
        )

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
                max_width=14 if name in left else None,
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
