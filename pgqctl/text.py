"""Text as people read it, whatever shows it: a table, a message, the worker's log.

Control characters escaped, values on one line, durations, sizes and runs of
ids. The floor every view and log stands on: it imports no other part of
pgqctl, and no library.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def escape(char: str) -> str:
    """A character as Python and bash's $'...' write it: \\x1b, \\u202e, \\U000e0001."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class _Escapes(dict[int, str]):
    """A table for str.translate: every character that is not printable
    (str.isprintable, the rule names follow: limits.unprintable) escaped, but
    those in `keep`. The control characters are in it from the start; any
    other is looked at when met (a table of all of Unicode would be large)."""

    def __init__(self, keep: str) -> None:
        controls = (*range(0x20), *range(0x7F, 0xA0))
        super().__init__({c: escape(chr(c)) for c in controls if chr(c) not in keep})
        self.keep = keep

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if char.isprintable() or char in self.keep:
            raise LookupError  # str.translate leaves it as it is
        return escape(char)


# Job data shown to a person (a kind, an error, a job's output) may hold
# terminal escapes or carriage returns, and characters that hide or reorder
# text (a zero-width space, a bidi override, a line separator some viewers
# break at): shown escaped (\x1b, \u202e), they cannot recolour the terminal,
# overwrite what is around them, or make a name pass for another. Table
# cells keep tabs and newlines (`show` prints a whole error); log lines keep
# only tabs.
CELL_ESCAPES = _Escapes("\t\n")
LINE_ESCAPES = _Escapes("\t")
# Names (queues, kinds, workers) and every cell of a listing keep nothing: a
# queue named "evil\nCRITICAL fake" is one cell on one line, wherever shown.
ONE_LINE_ESCAPES = _Escapes("")


def printable(text: str, escapes: Mapping[int, str] = CELL_ESCAPES) -> str:
    """`text` with its characters that are not printable escaped (but for
    those `escapes` keeps)."""
    return text if text.isprintable() else text.translate(escapes)


def one_line(value: Any) -> str:
    """A value as a person reads it, on one line whatever it holds."""
    return printable(human(value), ONE_LINE_ESCAPES)


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


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, ending in … when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


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


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def id_span(ids: Sequence[int]) -> str:
    """(id 5), (ids 5..9), or (ids from 5 to 12) when they are not contiguous."""
    if len(ids) == 1:
        return f"(id {ids[0]})"
    contiguous = ids[-1] - ids[0] == len(ids) - 1
    return f"(ids {ids[0]}..{ids[-1]})" if contiguous else f"(ids from {ids[0]} to {ids[-1]})"


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


def shell_word(value: str) -> str:
    """`value` as one word of a command to paste into a shell, quoted only
    when it must be, and on one line: a value with characters that are not
    printable in bash's $'...' quoting, each escaped."""
    if value.isprintable():
        return shlex.quote(value)
    escaped = "".join(
        escape(c) if not c.isprintable() else "\\" + c if c in "\\'" else c for c in value
    )
    return f"$'{escaped}'"


def quick_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """`encoder.encode`, for a hot loop: its C encoder made once rather than
    per call (json builds one per call), and without the check for circular
    references, so it is only for plain data. Plain `encode` where Python
    has no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
    if make is None or encoder.indent is not None:
        return encoder.encode
    strings = (
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring
    )
    chunks = make(
        None,
        encoder.default,
        strings,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    join = "".join
    return lambda value: join(chunks(value, 0))
