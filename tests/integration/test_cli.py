"""What every command does alike, as an operator meets it through the CLI:
bad input and its exit codes, help, global options,
durations, filters, formats, hints, and output that cannot be written.
"""

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

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired, snapshot

COMMANDS = ["stats", "leases", "list", "show", "reap", "requeue", "purge"]


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


# --- every command ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["requeue"], 2, "nothing selected"),
        (["requeue", "--failed", "--attempts", "0"], 2, "--attempts"),
        (["requeue", "--failed", "--since", "yesterday"], 2, "not a duration"),
        (["purge", "--older-than", "soon"], 2, "not a duration"),
        (["purge", "--status", "pending"], 2, "--status"),
        (["purge", "--batch-size", "0"], 2, "--batch-size"),
        (["list", "--status", "bogus"], 2, "--status"),
        (["list", "--limit", "-1"], 2, "--limit"),
        (["show", "424242"], 1, "job 424242 not found"),
        (["show", "abc"], 2, "a job id is a positive whole number, got 'abc'"),
        (["show", "99999999999999999999"], 2, "a job id is a positive whole number"),
        (["requeue", "--id", "0"], 2, "a job id is a positive whole number, got '0'"),
        (["stats", "--watch", "0"], 2, "--watch"),
    ],
)
def test_bad_input_exits_with_its_code_and_writes_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], code: int, message: str
) -> None:
    add_jobs(conn, 2, status="failed", attempts=3)
    add_jobs(conn, 2, status="done", attempts=1)
    before = snapshot(conn)
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == code
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    assert snapshot(conn) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_has_an_example(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    example = result.stdout.split("Example:", 1)[1]
    assert f"pgqctl {command}" in example


@pytest.mark.parametrize("group", [[], ["embedded"]])
def test_a_group_alone_shows_its_help_not_an_error(group: list[str]) -> None:
    result = run_cli(*group)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Usage: pgqctl {' '.join([*group, ''])}")
    assert "pgqctl: error" not in result.stderr and "Commands:" in result.stderr


def test_commands_work_in_another_schema(empty_dsn: str) -> None:
    assert run_cli("migrate", "--schema", "Work Queue", "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute('SET search_path = "Work Queue"')
        expired(c)
        add_jobs(c, 2, status="failed", attempts=3)
    env = {"PGQCTL_SCHEMA": "Work Queue"}
    stats = run_cli("stats", "--json", "--dsn", empty_dsn, env=env)
    assert json.loads(stats.stdout)["totals"]["failed"] == 2
    reaped = run_cli("reap", "--json", "--dsn", empty_dsn, env=env)
    assert len(json.loads(reaped.stdout)) == 1
    assert json.loads(
        run_cli("purge", "--status", "failed", "--json", "--dsn", empty_dsn, env=env).stdout
    ) == {"deleted": 2}
    assert os.environ.get("PGQCTL_SCHEMA") is None


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_one_line_and_exit_1(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3)
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "pgqctl", "list", "--dsn", dsn],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr == "pgqctl: error: writing the output: No space left on device\n"


@pytest.mark.slow
def test_bytes_that_are_not_utf8_are_bad_input_not_a_traceback(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    def pgqctl(*args: str | bytes, **env: bytes) -> subprocess.CompletedProcess[bytes]:
        environ = {**os.environb, **{k.encode(): v for k, v in env.items()}}
        command = [sys.executable, "-m", "pgqctl", *args]
        return subprocess.run(command, env=environ, capture_output=True, timeout=30)

    listed = pgqctl("list", "--kind", b"k\xff", "--dsn", dsn)
    assert (listed.returncode, listed.stderr) == (
        2,
        b"pgqctl: error: argument 3 (after --kind) is not valid UTF-8: "
        b"give names, payloads and DSNs as UTF-8 text\n",
    )
    # Named, never shown: the value may hold a password.
    secret = b"postgresql://alice:s\xe9cret@127.0.0.1/x"
    for args in (["--dsn", secret], [b"--dsn=" + secret]):
        refused = pgqctl("stats", *args)
        assert refused.returncode == 2
        assert b"cret" not in refused.stderr and b"--dsn" in refused.stderr
    # A worker given such a queue exits at once instead of failing forever.
    worker = pgqctl("worker", "--burst", "--dsn", dsn, PGQCTL_QUEUE=b"q\xff")
    assert worker.returncode == 2
    assert worker.stderr.startswith(b"pgqctl: error: PGQCTL_QUEUE is not valid UTF-8")
    # UTF-8 text is text whatever the locale says, and a handler is any bytes.
    c_locale = {"LC_ALL": b"C", "PYTHONUTF8": b"0", "PYTHONCOERCECLOCALE": b"0"}
    added = pgqctl("enqueue", "h\u00e9llo".encode(), "--dsn", dsn, **c_locale)
    assert added.returncode == 0, added.stderr
    handler = pgqctl(
        "worker",
        "--burst",
        "--kind",
        "other",
        "--handler",
        b"other=/opt/caf\xe9/run",
        "--dsn",
        dsn,
        **c_locale,
    )
    assert handler.returncode == 0, handler.stderr
    assert conn.execute("SELECT kind, status FROM jobs").fetchall() == [("h\u00e9llo", "pending")]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_delimited_output_has_the_same_header_with_or_without_jobs(
    dsn: str, conn: psycopg.Connection[Any], fmt: str
) -> None:
    commands = [
        ["list"],
        ["leases"],
        ["reap", "--dry-run"],
        ["reap"],
        ["requeue", "--failed", "--dry-run"],
        ["requeue", "--failed"],
    ]

    def outputs() -> list[list[str]]:
        found = []
        for args in commands:
            result = run_cli(*args, "--format", fmt, "--dsn", dsn)
            assert result.exit_code == 0, result.stderr
            found.append(result.stdout.splitlines())
        return found

    empty = outputs()
    assert all(len(lines) == 1 for lines in empty)
    expired(conn)  # for leases and reap
    add_jobs(conn, status="failed", attempts=3)  # for requeue
    full = outputs()
    assert all(len(lines) >= 2 for lines in full)
    assert [lines[0] for lines in full] == [lines[0] for lines in empty]


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--limit", "100000000000000000000"],
        ["purge", "--batch-size", "2147483648"],
        ["worker", "--max-jobs", "2147483648"],
    ],
)
def test_counts_beyond_what_the_database_takes_are_bad_input(dsn: str, args: list[str]) -> None:
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2
    # list --limit starts at 0 (every match), the others at 1.
    assert re.search(r"is not in the range [01]<=x<=2147483647", result.stderr)


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
