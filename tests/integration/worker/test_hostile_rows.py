"""Rows no pgqctl command would write, written with plain SQL (a documented
way to enqueue): a payload nested 1,200 levels deep, one of several
megabytes, one that is not an object, names with control or invisible
characters, a timeout past what a worker's timers hold, times no Python
datetime holds ('infinity', year 10001). A real worker fails each job that
can never run for good, and runs the others claimed with them; reap and
every read command show every row, cut where it must be, and exit 0."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from pgqctl import db, monitor, rows
from pgqctl.output.top import top_render
from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, expired

DEEP = '{"argv": ["true"], "deep": ' + "[" * 1200 + "]" * 1200 + "}"
# Over the worker's lowered limit below, and over what `show` takes whole.
BIG = json.dumps({"argv": ["true"], "blob": "x" * 3_000_000})
WORKER_LIMIT = 1_000_000
EVIL = "evil\nCRITICAL fake"
INFINITY = sql.SQL("'infinity'")
FAR = sql.SQL("'10001-01-01 00:00:00+00'")
# Jobs of the hostile rows a worker runs: nothing in them stops a job.
RUNS = ("normal", "infinite tick", "far tick", "far created", "due since -infinity")


def _hostile(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """One job of each kind of hostile row, and a normal one, all pending."""

    def one(**columns: Any) -> int:
        return add_jobs(conn, 1, **columns)[0]

    return {
        "deep": one(payload=DEEP),
        "big": one(payload=BIG),
        "array": one(payload='["true"]'),
        "string": one(payload='"true"'),
        "number": one(payload="42"),
        "evil kind": one(kind=EVIL),
        "evil queue": one(queue=EVIL),
        "escape queue": one(queue="q\x1b[2J"),
        # Printable to no one, though no control character: refused by every
        # worker, so by enqueue too; shown escaped.
        "no-break kind": one(kind="a\u00a0b"),
        "zero-width kind": one(kind="zero\u200bwidth"),
        "separator queue": one(queue="q\u2028"),
        "bidi kind": one(kind="\u202eevil"),
        # 1e308 overflowed the worker's timers; 1e400 comes back as an int.
        "huge timeout": one(payload='{"argv": ["sleep", "1"], "timeout": 1e308}'),
        "int timeout": one(payload='{"argv": ["sleep", "1"], "timeout": 1e400}'),
        # Times psycopg cannot load into a datetime: read, claimed and run.
        "infinite tick": one(payload='{"argv": ["true"]}', schedule="h1", tick=INFINITY),
        "far tick": one(payload='{"argv": ["true"]}', schedule="h2", tick=FAR),
        "far created": one(payload='{"argv": ["true"]}', created_at=FAR),
        "due since -infinity": one(payload='{"argv": ["true"]}', run_at=sql.SQL("'-infinity'")),
        "never due": one(payload='{"argv": ["true"]}', run_at=INFINITY),
        "normal": one(payload='{"argv": ["true"]}'),
    }


def _job(conn: psycopg.Connection[Any], job_id: int) -> tuple[str, int, str | None]:
    row = conn.execute(
        "SELECT status, attempts, left(last_error, 500) FROM jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row


def test_a_worker_fails_each_hostile_job_for_good_and_runs_the_others_beside_them(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ids = _hostile(conn)
    options = ["--concurrency", str(len(ids)), "--max-payload-bytes", str(WORKER_LIMIT)]
    worker = subprocess.run(
        [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst", *options],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert "Traceback" not in worker.stderr and "RecursionError" not in worker.stderr
    # One claim took them all: none was claimed twice (no reconnect, no retry).
    assert "reconnect" not in worker.stderr
    for name in RUNS:
        assert _job(conn, ids.pop(name)) == ("done", 1, None), name
    assert _job(conn, ids.pop("never due")) == ("pending", 0, None)
    why = {
        "deep": "payload is nested more than 256 levels deep",
        "big": f"payload is over the worker's limit of {WORKER_LIMIT:,} bytes",
        "array": "payload is an array, not an object",
        "string": "payload is a JSON string, not an object",
        "number": "payload is a JSON number, not an object",
        "evil kind": 'kind "evil\\nCRITICAL fake" holds the control character \\x0a at',
        "evil queue": 'queue "evil\\nCRITICAL fake" holds the control character \\x0a at',
        "escape queue": 'queue "q\\u001b[2J" holds the control character \\x1b at',
        "no-break kind": 'kind "a\\u00a0b" holds the unprintable character U+00A0 (NO-BREAK',
        "zero-width kind": 'kind "zero\\u200bwidth" holds the unprintable character U+200B',
        "separator queue": 'queue "q\\u2028" holds the unprintable character U+2028',
        "bidi kind": 'kind "\\u202eevil" holds the unprintable character U+202E',
        "huge timeout": '"timeout" must be a positive duration of at most 100 years',
        "int timeout": '"timeout" must be a positive duration of at most 100 years',
    }
    for name, job_id in ids.items():
        status, attempts, error = _job(conn, job_id)
        # Failed at once, with attempts left: it could never run.
        assert (status, attempts) == ("failed", 1), name
        assert error is not None and error.startswith(why[name]), (name, error)
    # The worker's log lines stay one line each, names escaped.
    assert not any(line.startswith("CRITICAL") for line in worker.stderr.splitlines())
    assert "\u202e" not in worker.stderr and "\u200b" not in worker.stderr
    # The attempt of the job due since '-infinity' counts among the figures.
    waited = 'pgqctl_attempt_wait_seconds_bucket{kind="test",le="+Inf",queue="default"} 5.0'
    assert waited in _ok("metrics", "--dsn", dsn).splitlines()


@pytest.fixture
def every_status(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Hostile rows in every status a read command lists: pending, an
    expired lease (for reap), a live lease (one until 'infinity'), failed
    with a huge last_error, done at 'infinity'."""
    ids = _hostile(conn)
    ids["deep expired"] = expired(conn, 1, payload=DEEP, queue=EVIL, kind=EVIL)[0]
    ids["big running"] = expired(
        conn, 1, payload=BIG, locked_until=sql.SQL("now() + interval '1 hour'")
    )[0]
    ids["deep failed"] = add_jobs(
        conn,
        1,
        payload=DEEP,
        status="failed",
        attempts=3,
        finished_at=sql.SQL("now()"),
        last_error="boom\n" * 100_000,
    )[0]
    ids["infinite lease"] = expired(conn, 1, locked_until=INFINITY, claimed_at=INFINITY)[0]
    ids["done at infinity"] = add_jobs(
        conn, 1, status="done", attempts=1, finished_at=INFINITY, run_at=FAR
    )[0]
    return ids


def _ok(*args: str) -> str:
    result = run_cli(*args)
    assert result.exit_code == 0, (args, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def _lines(*args: str) -> list[str]:
    """What a command printed, each line without the spaces around it."""
    return [line.strip() for line in _ok(*args).splitlines()]


def test_every_read_command_shows_every_hostile_row(
    dsn: str, conn: psycopg.Connection[Any], every_status: dict[str, int]
) -> None:
    ids = every_status
    listed = json.loads(_ok("list", "--dsn", dsn, "--limit", "0", "--json"))
    assert {j["id"] for j in listed} == set(ids.values())
    by_id = {j["id"]: j for j in listed}
    deep = by_id[ids["deep"]]
    assert deep["payload"] == DEEP  # its JSON text, as PostgreSQL gives it
    assert deep["payload_note"] == "nested more than 256 levels deep: its JSON text"
    assert deep["payload_cut"] is False
    big = by_id[ids["big"]]
    assert big["payload_cut"] is True
    assert len(big["payload"]) == rows.SHOWN_PAYLOAD_CHARS
    assert big["payload_note"].startswith("cut: the first 1,048,576 characters")
    assert by_id[ids["array"]]["payload"] == ["true"]
    assert by_id[ids["normal"]]["payload"] == {"argv": ["true"]}
    assert by_id[ids["normal"]]["payload_note"] is None
    failed = by_id[ids["deep failed"]]
    assert failed["last_error_cut"] is True
    assert len(failed["last_error"]) == rows.SHOWN_ERROR_CHARS
    # The plain table: one line per job, whatever the names hold.
    table = _ok("list", "--dsn", dsn, "--limit", "0", "--format", "plain")
    assert len(table.splitlines()) == 2 + len(ids)
    assert "evil\\x0aCRITICAL fake" in table and "\x1b" not in table
    # Names that are not printable, escaped: none passes for another.
    assert "a\\xa0b" in table and "\\u202eevil" in table and "zero\\u200bwidth" in table
    assert "\u202e" not in table and "\u200b" not in table and "\xa0" not in table
    # A time no datetime holds, as PostgreSQL writes it.
    assert by_id[ids["never due"]]["run_at"] == "infinity"
    assert by_id[ids["due since -infinity"]]["run_at"] == "-infinity"
    assert by_id[ids["far created"]]["created_at"] == "10001-01-01 00:00:00+00"
    assert by_id[ids["infinite tick"]]["tick"] == "infinity"
    assert by_id[ids["done at infinity"]]["finished_at"] == "infinity"
    assert by_id[ids["infinite lease"]]["locked_until"] == "infinity"

    for name, job_id in ids.items():
        shown = _ok("show", "--dsn", dsn, str(job_id), "--format", "plain")
        assert not any(line.startswith("CRITICAL") for line in shown.splitlines()), name
        record = json.loads(_ok("show", "--dsn", dsn, str(job_id), "--json"))
        assert record["id"] == job_id
    # Each note on a line of its own, under what it is about.
    big_shown = _lines("show", "--dsn", dsn, str(ids["big"]), "--format", "plain")
    assert "[payload cut: the first 1,048,576 characters of its JSON text]" in big_shown
    error_shown = _lines("show", "--dsn", dsn, str(ids["deep failed"]), "--format", "plain")
    assert "[last_error cut: the first 65,536 characters]" in error_shown
    assert "[payload nested more than 256 levels deep: its JSON text]" in error_shown
    # A payload shown whole is still pretty-printed.
    normal_shown = _lines("show", "--dsn", dsn, str(ids["normal"]), "--format", "plain")
    assert '"argv": [' in normal_shown

    leases = json.loads(_ok("leases", "--dsn", dsn, "--json"))
    running = {ids["deep expired"], ids["big running"], ids["infinite lease"]}
    assert {j["id"] for j in leases} == running
    leases_table = _ok("leases", "--dsn", dsn, "--format", "plain")
    assert len(leases_table.splitlines()) == 2 + 3
    for name in ("never due", "infinite lease", "due since -infinity", "infinite tick"):
        assert f"job {ids[name]} " in _ok("why", "--dsn", dsn, str(ids[name])), name
    # Thresholds breached (the job due since -infinity waits), but read: exit 3.
    assert run_cli("check", "--dsn", dsn, "--max-pending-age", "1h").exit_code == 3
    stats_table = _ok("stats", "--dsn", dsn, "--format", "plain")
    assert "evil\\x0aCRITICAL fake" in stats_table
    assert not any(line.startswith("CRITICAL") for line in stats_table.splitlines())
    _ok("stats", "--dsn", dsn, "--json")
    _ok("workers", "--dsn", dsn)
    _ok("metrics", "--dsn", dsn)
    frame = io.StringIO()
    with db.connect(dsn, schema="public") as queue:
        view = monitor.top_view(queue, window=1.0)
    Console(file=frame, width=200).print(top_render(view, "here", 1.0))
    # Names are cut to fit there: escaped, so on the line of their row.
    assert "evil\\x0a" in frame.getvalue()
    assert not any("CRITICAL" in line[:20] for line in frame.getvalue().splitlines())

    reaped = json.loads(_ok("reap", "--dsn", dsn, "--json"))
    assert [j["id"] for j in reaped] == [ids["deep expired"]]
    assert reaped[0]["payload_note"] == "nested more than 256 levels deep: its JSON text"
    cancelled = json.loads(_ok("cancel", "--dsn", dsn, "--id", str(ids["deep"]), "--json"))
    assert [(j["id"], j["status"]) for j in cancelled] == [(ids["deep"], "cancelled")]
    requeued = json.loads(_ok("requeue", "--dsn", dsn, "--id", str(ids["deep failed"]), "--json"))
    assert [(j["id"], j["status"]) for j in requeued] == [(ids["deep failed"], "pending")]
    assert requeued[0]["last_error_cut"] is True


def test_a_queue_named_with_a_newline_is_one_line_in_checks_output(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue=EVIL)
    result = run_cli("check", "--dsn", dsn, "--max-pending", "1")
    assert result.exit_code == 3, result.stderr
    assert result.stdout.splitlines() == ["CRITICAL evil\\x0aCRITICAL fake: 3 pending jobs (max 1)"]
