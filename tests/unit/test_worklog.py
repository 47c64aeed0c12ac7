"""The worker's log lines, and its retry delays."""

from __future__ import annotations

import io
import json

import pytest

from pgqctl.worker import BACKOFF_CAP, backoff_delay
from pgqctl.worklog import WorkLog, seconds, timestamp


class CountingStream(io.StringIO):
    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_text_lines_are_a_utc_timestamp_and_the_message() -> None:
    stream = CountingStream()
    WorkLog(stream, "text").event("done", "job 12 done in 0.5s", job_id=12)
    line = stream.getvalue()
    assert line.endswith("Z job 12 done in 0.5s\n")
    assert len(line.split(" ")[0]) == len("2026-11-30T14:12:26.123Z")
    assert stream.writes == 1


def test_json_lines_carry_ts_event_fields_and_message() -> None:
    stream = CountingStream()
    WorkLog(stream, "json").event("output", "job 3 | héllo", job_id=3, line="héllo")
    record = json.loads(stream.getvalue())
    assert record == {
        "ts": record["ts"],
        "event": "output",
        "job_id": 3,
        "line": "héllo",
        "message": "job 3 | héllo",
    }
    assert stream.getvalue().count("\n") == 1
    assert stream.writes == 1


def test_errors_show_a_traceback_only_with_debug() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        error = exc
    quiet, loud = io.StringIO(), io.StringIO()
    WorkLog(quiet, "text").error("unexpected error", error)
    WorkLog(loud, "text", debug=True).error("unexpected error", error)
    assert quiet.getvalue().endswith("unexpected error: RuntimeError: boom\n")
    assert "Traceback" not in quiet.getvalue()
    assert "Traceback" in loud.getvalue()


def test_a_closed_stream_does_not_stop_the_worker() -> None:
    stream = io.StringIO()
    stream.close()
    WorkLog(stream, "text").event("done", "job 1 done")


def test_timestamps_and_durations() -> None:
    assert timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert seconds(0.0421) == "0.0421s"
    assert seconds(2.345) == "2.35s"
    assert seconds(245) == "4m05s"
    assert (seconds(30.0), seconds(4.0), seconds(12.34)) == ("30s", "4s", "12.3s")


@pytest.mark.parametrize(("attempt", "middle"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 64.0)])
def test_backoff_doubles_with_jitter(attempt: int, middle: float) -> None:
    delays = [backoff_delay(attempt, 2.0) for _ in range(200)]
    assert all(0.75 * middle <= d <= 1.25 * middle for d in delays)
    assert max(delays) - min(delays) > 0.1 * middle  # jittered, not constant


def test_backoff_is_capped_at_an_hour() -> None:
    assert backoff_delay(40, 2.0) == BACKOFF_CAP
    assert backoff_delay(10_000, 2.0) == BACKOFF_CAP
    assert backoff_delay(3, 0.0) == 0.0


def test_text_lines_show_control_characters_escaped() -> None:
    stream = io.StringIO()
    log = WorkLog(stream, "text")
    log.event("output", "job 3 | \x1b[31mred\x1b[0m\rjob 4 | fake\x9b\tnext\nline\u2028", job_id=3)
    line = stream.getvalue()
    assert line.endswith(
        "Z job 3 | \\x1b[31mred\\x1b[0m\\x0djob 4 | fake\\x9b\tnext\\x0aline\\u2028\n"
    )
    assert line.count("\n") == 1
    plain = io.StringIO()
    WorkLog(plain, "text").event("done", "job 12 done in 0.5s — héllo")
    assert plain.getvalue().endswith(" job 12 done in 0.5s — héllo\n")
