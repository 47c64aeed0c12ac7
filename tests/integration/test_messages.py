"""Mistakes that looked like success and messages that led nowhere, each as
an operator meets it through the CLI."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import run_cli
from tests.support.jobrows import add_jobs
from tests.support.processes import start_json_worker
from tests.support.servers import Roles, roles

__all__ = ["roles", "start_json_worker"]

# --- schema names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # Advised `migrate --schema ''`, which then failed with a raw error.
        (["stats", "--schema", ""], "a schema name cannot be empty"),
        (["migrate", "--schema", ""], "a schema name cannot be empty"),
        # "database error: unacceptable schema name "pg_temp"".
        (["migrate", "--schema", "pg_temp"], "'pg_temp' is reserved by PostgreSQL"),
        # Cut to 63 bytes by the server without a word.
        (["migrate", "--schema", "s" * 64], "at most 63 bytes, this one has 64"),
        (["--schema", "é" * 32, "stats"], "at most 63 bytes, this one has 64"),
    ],
)
def test_a_schema_name_postgresql_would_refuse_or_cut_is_bad_input(
    dsn: str, args: list[str], message: str
) -> None:
    result = run_cli(*args, "--dsn", dsn)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(dsn) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sss%'"
        ).fetchone()
    assert made == (0,)


def test_a_63_byte_schema_name_is_kept_whole(dsn: str) -> None:
    name = "s" * 63
    assert run_cli("migrate", "--schema", name, "--dsn", dsn).exit_code == 0
    result = run_cli("stats", "--schema", name, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


# --- options that disagree -----------------------------------------------------------


def test_on_conflict_error_speaks_the_cli_spelling(dsn: str) -> None:
    args = ("enqueue", "k", '{"argv": ["true"]}', "--unique-key", "a", "--dsn", dsn)
    assert run_cli(*args).exit_code == 0
    result = run_cli(*args, "--on-conflict", "error")
    assert result.exit_code == 1
    assert "`--on-conflict skip` gives its id instead" in result.stderr
    assert "on_conflict=" not in result.stderr  # was: (on_conflict="skip")


@pytest.mark.parametrize("order", [("--json", "--format", "csv"), ("--format", "csv", "--json")])
def test_json_and_another_format_are_refused(dsn: str, order: tuple[str, ...]) -> None:
    """Was: exit 0 with JSON, where the script expected CSV."""
    result = run_cli("list", *order, "--dsn", dsn)
    assert result.exit_code == 2
    assert "--json and --format csv disagree" in result.stderr
    assert result.stdout == ""


def test_json_with_format_json_is_fine(dsn: str) -> None:
    result = run_cli("list", "--json", "--format", "json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_requeue_limit_0_means_every_match_as_list_does(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: exit 2, "0 is not in the range x>=1"."""
    add_jobs(conn, 3, status="failed", attempts=3)
    result = run_cli("requeue", "--failed", "--limit", "0", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == 3


def test_a_kind_with_a_newline_keeps_one_line_in_a_piped_table(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    add_jobs(conn, 1, kind="two\nlines")
    result = run_cli("list", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3  # header, rule, the job
    assert "two\\x0alines" in result.stdout


# --- names that match nothing ------------------------------------------------------


@pytest.mark.parametrize("option", ["--queue", "--kind"])
def test_a_worker_with_an_empty_queue_or_kind_is_refused(
    conn: psycopg.Connection[Any], dsn: str, option: str
) -> None:
    """Was: exit 0, "queues all" in its log, and none of the due jobs claimed."""
    add_jobs(conn, 3)
    result = run_cli("worker", option, "", "--burst", "--dsn", dsn)
    assert result.exit_code == 2
    assert f"an empty name matches no job: leave {option} out" in result.stderr
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)
    # Nor a name of spaces, which enqueue refuses: no job can have it.
    spaces = run_cli("worker", option, "  ", "--burst", "--dsn", dsn)
    assert spaces.exit_code == 2
    assert "a name of only spaces matches no job" in spaces.stderr
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)


def test_pause_of_a_queue_never_seen_is_refused_with_the_closest_name(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: exit 0 and a pause of `imagse`, while `images` kept running."""
    add_jobs(conn, 1, queue="images")
    result = run_cli("pause", "imagse", "--dsn", dsn)
    assert result.exit_code == 2
    assert "no queue named imagse: did you mean images?" in result.stderr
    assert "--force" in result.stderr
    assert conn.execute("SELECT count(*) FROM paused_queues").fetchone() == (0,)
    forced = run_cli("pause", "imagse", "--force", "--dsn", dsn)
    assert forced.exit_code == 0, forced.stderr
    assert conn.execute("SELECT queue FROM paused_queues").fetchall() == [("imagse",)]


@pytest.mark.parametrize("where", ["pending", "running", "paused", "schedule", "statistics"])
def test_a_queue_is_known_by_its_jobs_its_pause_its_schedule_or_the_statistics(
    conn: psycopg.Connection[Any], dsn: str, where: str
) -> None:
    if where == "pending":
        add_jobs(conn, 1, queue="q1")
    elif where == "running":
        add_jobs(conn, 1, queue="q1", status="running", attempts=1, locked_by="h:1:0")
    elif where == "paused":
        conn.execute("INSERT INTO paused_queues (queue, until) VALUES ('q1', now() + '1h')")
    elif where == "schedule":
        made = run_cli("schedule", "add", "s", "--every", "1h", "--queue", "q1", "k", "--dsn", dsn)
        assert made.exit_code == 0, made.stderr
    else:  # only done jobs, which no index keeps by queue: ANALYZE has seen them
        add_jobs(conn, 20, queue="q1", status="done", attempts=1)
        conn.execute("ANALYZE jobs")
    result = run_cli("pause", "q1", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("command", [["cancel"], ["requeue", "--failed"]])
def test_cancel_and_requeue_name_a_queue_never_seen(
    conn: psycopg.Connection[Any], dsn: str, command: list[str]
) -> None:
    """Was: exit 0 with only "no ... jobs match"."""
    add_jobs(conn, 1, queue="images")
    result = run_cli(*command, "--queue", "imagse", "--queue", "images", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert "pgqctl: no queue named imagse: did you mean images?\n" in result.stderr
    assert "queue named images" not in result.stderr


def test_a_worker_serving_a_queue_never_seen_says_so(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: a worker that started and sat idle beside the backlog of `images`."""
    add_jobs(conn, 2, queue="images")
    result = run_cli("worker", "--queue", "imagse", "--burst", "--log-format", "json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    unknown = [e for e in events if e["event"] == "unknown_queue"]
    assert [(e["queue"], e["close"]) for e in unknown] == [("imagse", "images")]
    assert "did you mean images?" in unknown[0]["message"]


# --- check and paused queues -------------------------------------------------------


def test_check_names_a_paused_queue_and_leaves_its_backlog_alone(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: exit 3, `CRITICAL images: oldest pending job waited 1h`, with
    nothing said of the pause."""
    from tests.support.jobrows import ago

    add_jobs(conn, 5, queue="images", run_at=ago("1 hour"))
    assert run_cli("pause", "images", "--reason", "disk", "--dsn", dsn).exit_code == 0
    result = run_cli("check", "--max-pending-age", "5m", "--dsn", dsn)
    assert result.exit_code == 0, result.stdout
    assert result.stdout == ""
    assert "queue images is paused (until resumed: disk)" in result.stderr

    held = run_cli("check", "--max-pending-age", "5m", "--include-paused", "--dsn", dsn)
    assert held.exit_code == 3
    assert held.stdout == "CRITICAL images (paused): oldest pending job waited 1h (max 5m)\n"

    as_json = run_cli("check", "--max-pending-age", "5m", "--json", "--dsn", dsn)
    (queue,) = json.loads(as_json.stdout)["queues"]
    assert (queue["queue"], queue["paused"], queue["ok"]) == ("images", True, True)
    assert queue["figures"]["oldest_pending_age_seconds"]["threshold"] is None


# --- a server that refuses for want of a resource ------------------------------------

DISK_FULL_TRIGGER = """
CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'disk_full',
        MESSAGE = 'could not extend file "base/5/16384": No space left on device';
END $$;
CREATE TRIGGER disk_full BEFORE UPDATE ON jobs
    FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION disk_full();
"""


def test_a_worker_told_the_disk_is_full_says_so_and_backs_off(
    conn: psycopg.Connection[Any], dsn: str, start_json_worker: Any
) -> None:
    """The server refuses each report of a finished job with SQLSTATE 53100,
    as a full disk makes it. Was: "database unavailable" and "database
    connection restored" at every retry, with no backoff (329 pairs in 3
    minutes)."""
    import time

    [job] = add_jobs(conn, 1)
    conn.execute(DISK_FULL_TRIGGER)
    worker = start_json_worker(dsn)
    log_path = worker.log_path
    try:
        # The report refused again and again meanwhile: three refusals show
        # the retries and their growing waits (no need to sit out a fixed 5 s).
        deadline = time.monotonic() + 60
        while log_path.read_text().count('"server_refused"') < 3:
            assert time.monotonic() < deadline, "three refused reports"
            time.sleep(0.1)
        conn.execute("DROP TRIGGER disk_full ON jobs")
        deadline = time.monotonic() + 60
        while conn.execute("SELECT status FROM jobs WHERE id = %s", [job]).fetchone() != ("done",):
            assert time.monotonic() < deadline, "the job to be reported done"
            time.sleep(0.1)
    finally:
        worker.stop(30)
    events = worker.events()
    names = [e["event"] for e in events]
    assert "db_lost" not in names and "db_restored" not in names, names
    refused = [e for e in events if e["event"] == "server_refused"]
    assert refused, names
    assert refused[0]["sqlstate"] == "53100"
    assert "No space left on device" in refused[0]["message"]
    waits = [e["retry_in"] for e in refused]
    assert waits == sorted(waits) and waits[-1] > waits[0], waits


# --- doctor ------------------------------------------------------------------------


def test_doctor_puts_its_findings_first_and_table_counters_under_verbose(dsn: str) -> None:
    """Was: the finding after 5 tables' statistics (about 45 lines on a queue's
    database), last in the output."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("ALTER TABLE jobs SET (autovacuum_enabled = off)")
    result = run_cli("doctor", "--dsn", dsn)
    verbose = run_cli("doctor", "--verbose", "--dsn", dsn)
    lines, more = result.stdout.splitlines(), verbose.stdout.splitlines()
    assert result.exit_code == verbose.exit_code == 3
    assert lines[0].startswith("FINDING ")
    assert not any(line.startswith("  vacuum ") for line in lines)
    assert any(line.startswith("  vacuum ") for line in more)
    assert len(more) > len(lines)


def test_doctor_leaves_out_a_workers_own_sub_second_transaction(dsn: str) -> None:
    """Was: listed under horizon as if it held vacuum back."""
    import time

    def holder_pids(application: str) -> tuple[set[int], float]:
        with psycopg.connect(dsn, application_name=application) as held:
            held.execute("SELECT txid_current()")
            began = time.monotonic()
            result = run_cli("doctor", "--json", "--dsn", dsn)
            took = time.monotonic() - began
        holders = json.loads(result.stdout)["horizon"]["holders"]
        return {h["pid"] for h in holders if h["kind"] == "transaction"}, took

    for _ in range(5):  # a second is the rule: retried if doctor itself took one
        worker, took = holder_pids("pgqctl worker host:1")
        if took < 0.8:
            break
    assert took < 0.8, f"doctor took {took:.1f}s five times"
    assert worker == set()
    other, _ = holder_pids("report-builder")  # any other young transaction is shown
    assert len(other) == 1


# --- views at 120 columns ----------------------------------------------------------


def table_at(width: int, *args: str) -> list[str]:
    result = run_cli(*args, "--format", "table", env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()


def test_workers_at_120_columns_keep_queues_and_job_ids_whole(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Was: `email…` for the queues and `9, 10,…` for the jobs, beside the
    empty version and prefetched columns."""
    queues = ["emails-transactional", "images-thumbnails", "reports-long-name"]
    conn.execute(
        "INSERT INTO workers (id, host, pid, version, queues, concurrency, heartbeat_seconds,"
        " lease_seconds) VALUES ('vm:18836', 'vm', 18836, '', %s, 6, 10, 300)",
        [queues],
    )
    add_jobs(conn, 6, status="running", attempts=1, locked_by="vm:18836:0", queue=queues[0])
    lines = table_at(120, "workers", "--dsn", dsn)
    assert ",".join(queues) in lines[2]
    assert lines[2].rstrip().endswith("│ 1-6")
    assert "version" not in lines[0] and "prefetched" not in lines[0]
    assert max(len(line) for line in lines) <= 120


def test_schedule_list_at_120_columns_keeps_the_cron_expression_whole(dsn: str) -> None:
    """Was: `cron */15 9-17…` beside five empty columns; now the times are
    shortened, and empty columns left out, before a value is cut."""
    made = run_cli(
        "schedule", "add", "nightly", "--cron", "*/15 9-17 * * mon-fri", "k", "--dsn", dsn
    )
    assert made.exit_code == 0, made.stderr
    lines = table_at(120, "schedule", "list", "--dsn", dsn)
    assert "cron */15 9-17 * * mon-fri" in lines[2]
    assert max(len(line) for line in lines) <= 120


# --- migrate by a role that may not read the queue's tables ---------------------------


def test_migrate_by_a_role_that_cannot_read_the_bookkeeping_names_the_grant(
    dsn: str, roles: Roles
) -> None:
    """Was: "schema public has a pgqctl_migrations table that pgqctl did not
    create", as if another program had made it."""
    role = roles.create("noread")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(sql.Identifier(role))
        )
    result = run_cli("migrate", "--dsn", roles.dsn(dsn, role))
    # The migration log is read first: the role may not read it, and is told
    # the GRANT that lets it.
    assert result.exit_code == 1
    assert "permission denied for table pgqctl_migration_log" in result.stderr
    assert f'IN SCHEMA "public" TO "{role}"' in result.stderr
    assert "GRANT SELECT" in result.stderr
    assert "did not create" not in result.stderr
