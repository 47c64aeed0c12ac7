"""The operator's details: durations, filters, what list tells, hints, formats
and estimates, each as an operator meets it through the CLI."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.integration.jobrows import add_jobs, ago, expired, snapshot


def cli_json(dsn: str, *args: str) -> Any:
    result = run_cli(*args, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# --- durations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["purge", "--older-than", "7"], "'7' has no unit"),
        (["purge", "--older-than", "7", "--dry-run"], "e.g. 7d for days or 7h for hours"),
        (["requeue", "--failed", "--since", "7"], "'7' has no unit"),
        (["purge", "--older-than", "5M"], "units are case-sensitive for minutes"),
        (["requeue", "--failed", "--since", "90MS"], "units are case-sensitive for minutes"),
        (["enqueue", "k", "--delay", "5M"], "units are case-sensitive for minutes"),
        (["purge", "--older-than", "soon"], "(ms, s, m, h, d, w)"),
        (["enqueue", "k", "--delay", "soon"], "(ms, s, m, h, d, w)"),
    ],
)
def test_an_age_needs_a_unit_and_minutes_are_lower_case(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("8 days"))
    add_jobs(conn, 2, status="failed", attempts=3)
    before = snapshot(conn)
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(conn) == before


def test_every_unit_works_and_is_in_the_help(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("8 days"))
    assert cli_json(dsn, "purge", "--older-than", "1w", "--dry-run")["matched"] == 2
    assert cli_json(dsn, "purge", "--older-than", "7D", "--dry-run")["matched"] == 2
    assert cli_json(dsn, "purge", "--older-than", "9d", "--dry-run")["matched"] == 0
    for command in (["purge"], ["requeue"], ["enqueue"], ["worker"]):
        text = " ".join(run_cli(*command, "--help").stdout.split())
        assert re.search(r"ms, s, m, h, d(,| or) w\b", text), command


def test_a_payload_timeout_takes_the_forms_the_cli_takes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    payloads = [
        {"argv": ["sleep", "30"], "timeout": "1s"},
        {"argv": ["sleep", "30"], "timeout": "0.5"},
        {"argv": ["true"], "timeout": "5m"},
    ]
    ids = [
        conn.execute(
            "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('t', %s, 1) RETURNING id",
            (json.dumps(p),),
        ).fetchone()[0]  # type: ignore[index]
        for p in payloads
    ]
    result = run_cli("worker", "--burst", "--concurrency", "3", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    rows = dict(
        conn.execute(
            "SELECT id, status || ': ' || coalesce(last_error, '') FROM jobs WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    )
    assert [rows[i] for i in ids] == [
        "failed: timed out after 1s",
        "failed: timed out after 0.5s",
        "done: ",
    ]


# --- formats --------------------------------------------------------------------------

ISO_MS_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_delimited_booleans_read_as_json_writes_them(
    dsn: str, conn: psycopg.Connection[Any], fmt: str
) -> None:
    expired(conn)
    add_jobs(conn, status="running", attempts=1, locked_until=ago("-5 minutes"))
    result = run_cli("leases", "--format", fmt, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    sep = "," if fmt == "csv" else "\t"
    header, *rows = result.stdout.splitlines()
    column = header.split(sep).index("expired")
    assert [row.split(sep)[column] for row in rows] == ["true", "false"]
    stats = run_cli("stats", "--format", fmt, "--dsn", dsn).stdout.splitlines()
    assert stats[1].split(sep)[stats[0].split(sep).index("estimated")] == "false"
    dry = run_cli("purge", "--dry-run", "--format", fmt, "--dsn", dsn).stdout.splitlines()
    assert dry[1].split(sep)[dry[0].split(sep).index("dry_run")] == "true"


def test_reap_writes_iso_times_and_its_dry_run_shows_the_same_error(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = expired(conn, locked_by="web-1:42:3")
    conn.execute(
        "UPDATE jobs SET locked_until = '2026-11-30 14:21:04.382917+00' WHERE id = %s", (job_id,)
    )
    (bare,) = add_jobs(conn, status="running", attempts=3, locked_by="web-2:7:0")
    # In UTC whatever the session's time zone.
    zoned = run_cli(
        "reap",
        "--dry-run",
        "--json",
        "--dsn",
        dsn,
        env={"PGOPTIONS": "-c TimeZone=America/New_York"},
    )
    assert zoned.exit_code == 0, zoned.stderr
    preview = json.loads(zoned.stdout)
    assert [(j["id"], j["status"], j["last_error"]) for j in preview] == [
        (bare, "failed", "running without a lease (held by web-2:7:0)"),
        (job_id, "pending", "lease expired at 2026-11-30T14:21:04.382Z (held by web-1:42:3)"),
    ]
    reaped = {j["id"]: j["last_error"] for j in cli_json(dsn, "reap")}
    assert reaped == {j["id"]: j["last_error"] for j in preview}
    stored = conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert stored is not None and re.fullmatch(
        rf"lease expired at {ISO_MS_UTC} \(held by web-1:42:3\)", stored[0]
    )


# --- hints and global options -----------------------------------------------------------


def test_an_unmigrated_schema_names_itself_in_the_migrate_it_suggests(dsn: str) -> None:
    result = run_cli("stats", "--schema", "fresh", "--dsn", dsn)
    assert result.exit_code == 1
    assert result.stderr == (
        "pgqctl: error: no pgqctl queue in schema fresh: run `pgqctl migrate --schema fresh`\n"
    )
    odd = run_cli("list", "--schema", "my queue", "--dsn", dsn)
    assert "run `pgqctl migrate --schema 'my queue'`" in odd.stderr


def test_a_failing_database_url_is_named_and_a_refused_login_is_not_an_outage(dsn: str) -> None:
    from psycopg import conninfo

    nothing_there = "postgresql://postgres@127.0.0.1:1/postgres"
    down = run_cli("stats", env={"PGQCTL_DSN": "", "DATABASE_URL": nothing_there})
    assert down.exit_code == 1
    assert down.stderr.endswith("; check DATABASE_URL and that the server is running\n")

    nobody = conninfo.make_conninfo(dsn, user="no_such_role")
    refused = run_cli("stats", env={"PGQCTL_DSN": "", "DATABASE_URL": nobody})
    assert refused.exit_code == 1
    assert 'role "no_such_role" does not exist' in refused.stderr
    assert refused.stderr.endswith("; check the user, password and database name in DATABASE_URL\n")
    assert "server is running" not in refused.stderr
    missing = conninfo.make_conninfo(dsn, dbname="no_such_db")
    gone = run_cli("stats", "--dsn", missing)
    assert 'database "no_such_db" does not exist' in gone.stderr
    assert gone.stderr.endswith(
        "; check the user, password and database name in --dsn / PGQCTL_DSN\n"
    )


def test_a_bad_run_at_names_the_option_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = run_cli("enqueue", "k", "--run-at", "tomorrow", "--dsn", dsn)
    assert result.exit_code == 2
    assert result.stderr.count("--run-at") == 1
    assert "'tomorrow' is not an ISO 8601 time" in result.stderr
    assert snapshot(conn) == []


def test_global_options_may_come_before_the_command(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert run_cli("migrate", "--schema", "s2", "--dsn", dsn).exit_code == 0
    add_jobs(conn, 2)
    conn.execute("INSERT INTO s2.jobs (kind, payload) VALUES ('in_s2', '{}')")

    stats = run_cli("--dsn", dsn, "--format", "json", "stats")
    assert stats.exit_code == 0, stats.stderr
    assert json.loads(stats.stdout)["totals"]["pending"] == 2
    listed = run_cli("--schema", "s2", "--json", "list", "--dsn", dsn)
    assert [j["kind"] for j in json.loads(listed.stdout)] == ["in_s2"]
    # Before the command, as after it, --schema wins over PGQCTL_SCHEMA.
    env = {"PGQCTL_SCHEMA": "public", "PGQCTL_FORMAT": "csv"}
    both = run_cli("--schema", "s2", "--format", "json", "list", "--dsn", dsn, env=env)
    assert [j["kind"] for j in json.loads(both.stdout)] == ["in_s2"]
    added = run_cli("--dsn", dsn, "--schema", "s2", "enqueue", "also_s2")
    assert added.exit_code == 0, added.stderr
    assert conn.execute("SELECT count(*) FROM s2.jobs").fetchone() == (2,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--schema", "s2", "list", "--schema", "public"],
            "--schema was given before the command and after it",
        ),
        (
            ["--json", "stats", "--format", "csv"],
            "--format was given before the command and after it",
        ),
        (["--format", "json", "worker", "--burst"], "`pgqctl worker` takes no --format"),
        (["--dsn", "x", "embedded", "status"], "`pgqctl embedded status` takes no --dsn"),
        (["--schema", "a", "--schema", "b", "stats"], "--schema was given more than once"),
    ],
)
def test_a_global_option_given_twice_or_where_it_means_nothing_is_refused(
    dsn: str, args: list[str], message: str
) -> None:
    result = run_cli(*args, env={"PGQCTL_DSN": dsn})
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- filters ------------------------------------------------------------------------------


def test_a_repeated_filter_selects_any_of_its_values(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (a_failed,) = add_jobs(conn, queue="a", kind="x", status="failed", attempts=3)
    (b_failed,) = add_jobs(conn, queue="b", kind="y", status="failed", attempts=3)
    (c_failed,) = add_jobs(conn, queue="c", kind="z", status="failed", attempts=3)
    (a_pending,) = add_jobs(conn, queue="a", kind="x")
    (b_done,) = add_jobs(conn, queue="b", kind="y", status="done", attempts=1)

    def ids(*args: str) -> list[int]:
        return [j["id"] for j in cli_json(dsn, "list", *args)]

    assert ids("--queue", "a", "--queue", "b") == [b_done, a_pending, b_failed, a_failed]
    assert ids("--status", "pending", "--status", "failed") == [
        a_pending,
        c_failed,
        b_failed,
        a_failed,
    ]
    assert ids("--kind", "x", "--kind", "z", "--status", "failed") == [c_failed, a_failed]
    assert ids("--status", "done", "--status", "pending", "--queue", "b") == [b_done]

    dry = cli_json(dsn, "requeue", "--queue", "a", "--queue", "b", "--dry-run")
    assert [j["id"] for j in dry] == [a_failed, b_failed]
    moved = cli_json(dsn, "requeue", "--kind", "y", "--kind", "z")
    assert [j["id"] for j in moved] == [b_failed, c_failed]


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "k", "--queue", "a", "--queue", "b"],
        ["enqueue", "k", "--priority", "1", "--priority=2"],
        ["list", "--since", "1h", "--since", "2h"],
        ["purge", "--older-than", "1d", "--older-than", "2d"],
        ["requeue", "--failed", "--attempts", "2", "--attempts", "3"],
        ["stats", "--schema", "public", "--schema", "other"],
    ],
)
def test_an_option_that_takes_one_value_refuses_a_second(
    dsn: str, conn: psycopg.Connection[Any], args: list[str]
) -> None:
    add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("3 days"))
    add_jobs(conn, 1, status="failed", attempts=3)
    before = snapshot(conn)
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert "was given more than once: it takes one value" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(conn) == before


# --- what list tells --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv", "plain", "ndjson"])
def test_list_says_on_stderr_when_it_shows_fewer_than_match(
    dsn: str, conn: psycopg.Connection[Any], fmt: str
) -> None:
    add_jobs(conn, 120)
    add_jobs(conn, 7, status="failed", attempts=3)
    result = run_cli("list", "--status", "pending", "--format", fmt, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "pgqctl: showing 50 of 120; --limit to see more\n"
    if fmt == "json":
        assert len(json.loads(result.stdout)) == 50
    few = run_cli("list", "--status", "failed", "--format", fmt, "--dsn", dsn)
    assert few.stderr == ""
    every = run_cli("list", "--limit", "127", "--format", fmt, "--dsn", dsn)
    assert every.stderr == ""


def test_list_counts_a_long_history_only_up_to_a_bound(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 10_050, status="done", attempts=1)
    add_jobs(conn, 3)
    unbounded = run_cli("list", "--json", "--dsn", dsn)
    assert unbounded.stderr == "pgqctl: showing 50 of more than 10,000; --limit to see more\n"
    done = run_cli("list", "--status", "done", "--limit", "10", "--json", "--dsn", dsn)
    assert done.stderr == "pgqctl: showing 10 of more than 10,000; --limit to see more\n"
    live = run_cli("list", "--status", "pending", "--limit", "2", "--json", "--dsn", dsn)
    assert live.stderr == "pgqctl: showing 2 of 3; --limit to see more\n"


@pytest.mark.parametrize("fmt", ["json", "ndjson", "csv", "tsv", "plain"])
def test_list_limit_0_lists_every_match(dsn: str, conn: psycopg.Connection[Any], fmt: str) -> None:
    ids = add_jobs(conn, 2_345, status="failed", attempts=3, last_error="a\tb\nc")
    add_jobs(conn, 5)
    result = run_cli("list", "--status", "failed", "--limit", "0", "--format", fmt, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    if fmt == "json":
        jobs = json.loads(result.stdout)
        assert [j["id"] for j in jobs] == ids[::-1]
        # The same document as a limited listing writes.
        limited = run_cli("list", "--status", "failed", "--limit", "3000", "--json", "--dsn", dsn)
        assert limited.stdout == result.stdout
    elif fmt == "ndjson":
        assert [json.loads(line)["id"] for line in lines] == ids[::-1]
    elif fmt == "tsv":
        assert len(lines) == 1 + len(ids) and "a\\tb\\nc" in lines[1]
    elif fmt == "csv":
        limited = run_cli(
            "list", "--status", "failed", "--limit", "3000", "--format", fmt, "--dsn", dsn
        )
        assert limited.stdout == result.stdout
    else:
        assert len(lines) == 2 + len(ids)


def test_list_by_id_by_age_and_in_the_order_workers_take_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (old,) = add_jobs(conn, created_at=ago("3 hours"), run_at=ago("3 hours"))
    (low,) = add_jobs(conn, priority=0, run_at=ago("1 minute"))
    (high_late,) = add_jobs(conn, priority=5, run_at=ago("-1 hour"))
    (high_early,) = add_jobs(conn, priority=5, run_at=ago("10 minutes"))
    (done,) = add_jobs(conn, status="done", attempts=1)

    def ids(*args: str) -> list[int]:
        return [j["id"] for j in cli_json(dsn, "list", *args)]

    assert ids("--id", str(low), "--id", str(done)) == [done, low]
    assert ids("--since", "1h") == [done, high_early, high_late, low]
    assert ids("--order", "next") == [high_early, high_late, old, low]
    assert ids("--order", "next", "--since", "1h", "--limit", "2") == [high_early, high_late]
    assert ids("--order", "next", "--status", "pending") == [high_early, high_late, old, low]
    refused = run_cli("list", "--order", "next", "--status", "done", "--dsn", dsn)
    assert refused.exit_code == 2
    assert "--order next lists pending jobs" in refused.stderr
    no_unit = run_cli("list", "--since", "1", "--dsn", dsn)
    assert no_unit.exit_code == 2 and "has no unit" in no_unit.stderr


def test_the_error_column_says_why_the_job_failed(dsn: str, conn: psycopg.Connection[Any]) -> None:
    script = "echo converting; echo 'convert: no such file a.png' >&2; exit 1"
    conn.execute(
        "INSERT INTO jobs (kind, payload, max_attempts) VALUES ('convert', %s, 1)",
        (json.dumps({"argv": ["sh", "-c", script]}),),
    )
    (own,) = add_jobs(conn, status="failed", attempts=3, last_error="boom\nmore about it")
    assert run_cli("worker", "--burst", "--dsn", dsn).exit_code == 0
    lines = run_cli("list", "--format", "plain", "--dsn", dsn).stdout.splitlines()
    assert lines[3].endswith("exit status 1: convert: no such file a.png"), lines[3]
    # A last_error that is not the worker's: its first line, as it was.
    assert lines[2].startswith(str(own)) and lines[2].endswith("boom")


# --- tables in real terminals -----------------------------------------------------------

HOLDER = "ip-10-0-12-34.eu-west-1.compute.internal:48213:3"
_sessions = itertools.count()


def in_terminal(width: int, args: list[str], cwd: Path) -> list[str]:
    """What `pgqctl ARGS` leaves on the screen of a real terminal `width`
    columns wide (a tmux pane), up to the end of its output."""
    socket = f"pgqctl-test-{os.getpid()}-{next(_sessions)}"
    end = "__pgqctl_ended__"
    command = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", sys.executable, "-m", "pgqctl"])
    script = f"{command} {shlex.join(args)}; echo {end}; sleep 120"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    subprocess.run(
        [*tmux, "new-session", "-d", "-c", str(cwd), "-x", str(width), "-y", "100", script],
        check=True,
        timeout=30,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=30
            ).stdout
            if end in screen or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    assert end in screen, screen
    return screen.split(end)[0].rstrip("\n").splitlines()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.parametrize("width", [80, 120])
def test_tables_fit_real_terminals_of_80_and_120_columns(
    dsn: str, conn: psycopg.Connection[Any], width: int, tmp_path: Path
) -> None:
    from tests.unit.test_table_fit import ANY_TIME, table_cells

    error = (
        "exit status 1\nTraceback (most recent call last):\n"
        "ValueError: /srv/uploads/2026/12/01/a-very-long-file-name.png is not a PNG file"
    )
    failed = add_jobs(conn, 3, kind="nopayload", status="failed", attempts=3, last_error=error)
    failed += add_jobs(
        conn,
        2,
        kind="resize_image_thumbnails_for_the_gallery",
        queue="a-queue-with-a-rather-long-name",
        status="failed",
        attempts=3,
        last_error=error,
    )
    pending = add_jobs(conn, 3, kind="send_receipt", run_at=ago("-1 hour"))
    running = expired(conn, 2, kind="resize_image_thumbnails_for_the_gallery", locked_by=HOLDER)
    running += add_jobs(
        conn, 1, status="running", attempts=1, locked_by=HOLDER, locked_until=ago("-5 minutes")
    )
    cases = {
        "list": failed + pending + running,
        "leases": running,
        "reap --dry-run": running[:2],
        "requeue --failed --dry-run": failed,
        "stats": ["default", "a-queue-with-a-rather-long-name", "(total)"],
    }
    for command, expected in cases.items():
        screen = in_terminal(width, [*command.split(), "--dsn", dsn], tmp_path)
        # The table, then what stderr says (which the terminal may wrap).
        said = [i for i, line in enumerate(screen) if line.startswith("pgqctl:")]
        table = screen[: said[0]] if said else screen
        assert all(len(line) <= width for line in table)
        rows = table_cells(table)
        first = "queue" if command == "stats" else "id"
        shown = sorted(r[first] for r in rows)
        assert len(shown) == len(expected), (command, screen)  # one line each
        for cell, value in zip(shown, sorted(map(str, expected)), strict=True):
            # Ids whole; a queue name whole or cut with … (stats).
            assert cell == value or (first == "queue" and cell.endswith("…")), (command, screen)
            assert value.startswith(cell.rstrip("…")), (command, screen)
        for row in rows:
            for column, cell in row.items():
                if column in ("run_at", "finished_at", "locked_until") and cell:
                    assert ANY_TIME.fullmatch(cell), (command, cell)
                if column == "locked_by":
                    assert cell == HOLDER
                if column == "status":
                    assert cell in ("pending", "running", "done", "failed")
                if column == "attempt":
                    assert re.fullmatch(r"\d+/\d+", cell)


# --- payloads checked where they are written -------------------------------------------

TYPO = '"timout"'
HINT = 'did you mean "timeout" instead of "timout"?'


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"argv": ["sleep", "9"], "timout": 5}', HINT),
        ('{"argv": "ls -l"}', '"argv" must be an array of strings'),
        ('{"argv": []}', '"argv" is empty'),
        ('{"argv": ["ls", 3]}', '"argv"[1] is a number, not a string'),
        ('{"argv": ["ls"], "env": {"N": 1}}', '"env"["N"] is a number, not a string'),
        ('{"shell": ""}', '"shell" must be a command line'),
        ('{"argv": ["ls"], "timeout": "soon"}', '"timeout" must be a positive duration'),
    ],
)
def test_enqueue_refuses_a_payload_the_worker_would_refuse(
    dsn: str, conn: psycopg.Connection[Any], payload: str, message: str
) -> None:
    result = run_cli("enqueue", "k", payload, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and "payload cannot run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(conn) == []


def test_enqueue_file_refuses_such_a_payload_on_any_line_and_inserts_nothing(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    good = [json.dumps({"kind": "k", "payload": {"argv": ["echo", str(i)]}}) for i in range(400)]
    handler = [json.dumps({"kind": "receipt", "payload": {"order_id": i}}) for i in range(5)]
    bad = json.dumps({"kind": "k", "payload": {"argv": ["sleep", "1"], "timout": 5}})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join([*good[:2], *handler, bad, *good[2:]]) + "\n")
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert f"line 8: payload cannot run: unknown payload key {TYPO} ({HINT})" in result.stderr
    assert result.stderr.rstrip().endswith("nothing was enqueued")
    assert snapshot(conn) == []
    # Payloads that are a handler's (neither argv nor shell) stay accepted.
    path.write_text("\n".join([*good, *handler]) + "\n")
    ok = run_cli("enqueue", "--file", str(path), "--json", "--dsn", dsn)
    assert ok.exit_code == 0, ok.stderr
    assert len(json.loads(ok.stdout)) == 405


@pytest.mark.parametrize("many", [3, 300])  # an INSERT, and COPY
def test_the_python_api_refuses_such_a_payload_before_sending_anything(
    dsn: str, conn: psycopg.Connection[Any], many: int
) -> None:
    import pgqctl
    from pgqctl.errors import BadInput

    with psycopg.connect(dsn) as app:
        with pytest.raises(BadInput, match=HINT):
            pgqctl.enqueue(app, "k", {"argv": ["ls"], "timout": 1})
        jobs: list[dict[str, Any]] = [{"kind": "k", "payload": {"argv": ["ls"]}}] * many
        jobs[-1] = {"kind": "k", "payload": {"argv": ["ls"], "env": {"N": 1}}}
        with pytest.raises(ValueError, match=rf'jobs\[{many - 1}\]: .*"env"\["N"\]'):
            pgqctl.enqueue_many(app, jobs)
        assert pgqctl.enqueue(app, "receipt", {"order_id": 1}) > 0  # still usable
        app.commit()
    assert conn.execute("SELECT kind FROM jobs").fetchall() == [("receipt",)]


# --- estimates, honest per queue --------------------------------------------------------


def flush_statistics(conn: psycopg.Connection[Any]) -> None:
    """Publish this session's row counts now (they are sent once a second)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def load(dsn: str, tmp_path: Path, queue: str, n: int) -> None:
    path = tmp_path / f"{queue}.jsonl"
    path.write_text("".join(f'{{"kind": "k", "queue": "{queue}"}}\n' for _ in range(n)))
    result = run_cli("enqueue", "--file", str(path), "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


def test_per_queue_done_estimates_are_within_a_factor_of_2_or_not_given(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    load(dsn, tmp_path, "old", 30_000)
    load(dsn, tmp_path, "small", 600)
    conn.execute("ANALYZE jobs")  # as autovacuum would, while "old" is the bulk
    # The jobs run, a new queue is loaded and runs, and most of "old" is purged.
    conn.execute("UPDATE jobs SET status = 'done', attempts = 1")
    load(dsn, tmp_path, "new", 20_000)
    conn.execute("UPDATE jobs SET status = 'done', attempts = 1 WHERE status = 'pending'")
    conn.execute(
        "UPDATE jobs SET finished_at = now() - interval '8 days' "
        "WHERE id IN (SELECT id FROM jobs WHERE queue = 'old' ORDER BY id LIMIT 29000)"
    )
    assert cli_json(dsn, "purge", "--older-than", "7d") == {"deleted": 29_000}
    add_jobs(conn, 5, queue="small", status="failed", attempts=3)
    truth = {"new": 20_000, "old": 1_000, "small": 600}

    def check(*, all_told: bool) -> None:
        flush_statistics(conn)
        stats = cli_json(dsn, "stats")
        assert stats["estimated"] is True
        assert stats["totals"]["done"] == pytest.approx(21_600, rel=0.1)
        done = {q["queue"]: q["done"] for q in stats["queues"]}
        assert set(done) == set(truth)
        for queue in stats["queues"]:
            assert queue["estimated"] is True  # each marked on its own
            assert queue["failed"] == (5 if queue["queue"] == "small" else 0)  # exact
        for name, figure in done.items():
            if figure is None:
                assert not all_told, (name, done)
            else:
                assert truth[name] / 2 <= figure <= truth[name] * 2, (name, done)

    check(all_told=False)  # the shares are stale: some queues are not told
    table = run_cli("stats", "--format", "plain", "--dsn", dsn)
    assert "?" in table.stdout and "? those the statistics cannot tell" in table.stderr
    conn.execute("ANALYZE jobs")
    check(all_told=True)
    exact = cli_json(dsn, "stats", "--exact")
    assert {q["queue"]: q["done"] for q in exact["queues"]} == truth
    assert {q["estimated"] for q in exact["queues"]} == {False}
