"""A job's output in the worker's log: capped per job, with a note of what was left out.

A worker run as its own process (its log is its stderr, in a file), jobs
that write far more than the log takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.jobrows import insert_jobs, job, sh


def run_worker(dsn: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """A burst worker as a process of its own; its log."""
    log = tmp_path / "worker.log"
    with log.open("wb") as err:
        code = subprocess.run(
            [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, **(env or {})},
            timeout=60,
        ).returncode
    text = log.read_text()
    assert code == 0, text[-2000:]
    return text


def test_many_short_lines_reach_the_log_capped_with_a_note(
    dsn: str, conn: Any, tmp_path: Path
) -> None:
    # 1,000,000 lines of "y": 2 MB.
    [job_id] = insert_jobs(conn, [sh("yes | head -c 2000000")])
    log = run_worker(dsn, tmp_path)
    assert job(conn, job_id)["status"] == "done"
    assert log.count(f"job {job_id} | y\n") == 500  # the default --log-output-lines
    assert len(log.encode()) < 25_000
    assert (
        f"job {job_id} output: 1,999,000 bytes in 999,500 line(s) left out of this log, "
        "which takes the first 500 lines and 65,536 bytes of a job's output "
        "(--log-output-lines, --log-output-bytes)\n"
    ) in log
    # The note comes before the job's end.
    assert log.index("left out of this log") < log.index(f"job {job_id} done in")


def test_one_long_line_is_cut_at_the_byte_cap(dsn: str, conn: Any, tmp_path: Path) -> None:
    # 1 MB of "x" and no newline at all.
    [job_id] = insert_jobs(conn, [sh("head -c 1000000 /dev/zero | tr '\\0' x")])
    log = run_worker(dsn, tmp_path, "--log-format", "json")
    assert job(conn, job_id)["status"] == "done"
    events = [json.loads(line) for line in log.splitlines()]
    shown = "".join(e["line"] for e in events if e["event"] == "output")
    assert shown == "x" * 65536
    [note] = [e for e in events if e["event"] == "output_left_out"]
    assert (note["left_out_bytes"], note["left_out_lines"]) == (1_000_000 - 65536, 1)
    assert note["output_bytes"] == 1_000_000
    # A JSON line holds the output twice: as `line` and in `message`.
    assert len(log.encode()) < 2 * 65536 + 5_000


def test_the_caps_are_options_and_output_within_them_has_no_note(
    dsn: str, conn: Any, tmp_path: Path
) -> None:
    small, big = insert_jobs(conn, [sh("seq 3"), sh("seq 1000")])
    log = run_worker(
        dsn,
        tmp_path,
        "--log-output-lines",
        "3",
        env={"PGQCTL_LOG_OUTPUT_BYTES": "10"},
    )
    assert [line.split(" | ")[1] for line in log.splitlines() if f"job {small} |" in line] == [
        "1",
        "2",
        "3",
    ]
    assert f"job {small} output:" not in log
    # seq 1000: 1, 2, 3 fit both caps; "4" would be the 4th line.
    assert [line.split(" | ")[1] for line in log.splitlines() if f"job {big} |" in line] == [
        "1",
        "2",
        "3",
    ]
    # 3,893 bytes in all (9 one-digit, 90 two-digit, 900 three-digit lines and
    # "1000", each with its newline), 6 of them logged.
    assert f"job {big} output: 3,887 bytes in 997 line(s) left out of this log" in log
