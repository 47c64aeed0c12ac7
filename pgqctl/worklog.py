"""The worker's log: one line per event, as text for people or JSON for log shippers.

Every event has a name, a human message and fields. Text lines are
``<UTC timestamp> <message>``; JSON lines are objects with ``ts``, ``event``,
the fields and ``message``. Each line is written whole, under a lock, with a
single write and flush, so lines from the worker's threads (and the job
output they forward) never interleave. A log that cannot be written (stderr
closed) is dropped rather than stopping the worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from typing import Any, TextIO

from pgqctl.text import LINE_ESCAPES, format_seconds, printable, quick_encoder

LOG_FORMATS = ("text", "json")
# Of each job's output, what a worker logs by default: enough for a job's
# usual messages and a traceback; a job that writes more cannot fill the log.
LOG_OUTPUT_LINES = 500
LOG_OUTPUT_BYTES = 64 * 1024
# And what the attempt history keeps of each stream (stdout, stderr) of each
# attempt: its first half and its last half, so a traceback at the end is
# kept however much came before it; 32 kB an attempt at the most.
KEEP_OUTPUT_BYTES = 16 * 1024
# One encoder for every line, its C part made once: log fields are plain
# data, never circular.
_encode = quick_encoder(json.JSONEncoder(ensure_ascii=False, default=str))


class WorkLog:
    def __init__(self, stream: TextIO | None, fmt: str = "text", *, debug: bool = False) -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        # None: started with stderr closed (`2>&-`), where Python has no sys.stderr.
        self._stream = stream if stream is not None else open(os.devnull, "w")  # noqa: SIM115
        self.format = fmt
        self._json = fmt == "json"
        self.debug = debug
        self._lock = threading.Lock()

    def event(self, event: str, message: str, **fields: Any) -> None:
        ts = timestamp(time.time())
        if self._json:
            record = {"ts": ts, "event": event, **fields, "message": message}
            line = _encode(record)
        else:
            # A job's output shown as it is could recolour the operator's
            # terminal, overwrite the "job N |" prefix or split the line.
            line = f"{ts} {printable(message, LINE_ESCAPES)}"
        self._write(line + "\n")

    def error(self, message: str, exc: BaseException) -> None:
        """An unexpected error: its message, and with --debug its traceback."""
        # The server's CONTEXT lines stay in the `error` field, not the line.
        first = str(exc).split("\n", 1)[0]
        self.event("error", f"{message}: {type(exc).__name__}: {first}", error=str(exc))
        if self.debug:
            self._write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError):
                pass


def timestamp(seconds: float) -> str:
    """ISO 8601 in UTC with milliseconds: 2026-11-30T14:12:26.123Z."""
    whole = int(seconds)
    # Formatted once a second: a busy worker logs thousands of lines in one.
    second, moment = _LAST_SECOND
    if whole != second:
        moment = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _LAST_SECOND[:] = (whole, moment)
    return f"{moment}.{int((seconds - whole) * 1000):03d}Z"


# The last second `timestamp` formatted, and its text (threads may race on it
# harmlessly: each pair is written whole).
_LAST_SECOND: list[Any] = [-1, ""]


def seconds(value: float) -> str:
    """A duration for a log line: 0.042s, 2.35s, 30s, 4m05s."""
    if value < 60:
        return f"{value:.3g}s"
    return format_seconds(value)
