"""`pgqctl migrate` against a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from pgqctl.sql import migrations
from tests.conftest import run_cli
from tests.support.seed import SEED_ROWS


def applied_names(dsn: str, schema: str = "public") -> list[str]:
    with psycopg.connect(dsn) as c:
        c.execute(psycopg.sql.SQL("SET search_path = {}").format(psycopg.sql.Identifier(schema)))
        return [r[0] for r in c.execute("SELECT name FROM pgqctl_migration_log ORDER BY name")]


def test_migrate_creates_the_jobs_table_then_has_nothing_to_do(empty_dsn: str) -> None:
    first = run_cli("migrate", "--dsn", empty_dsn)
    assert first.exit_code == 0, first.stderr
    assert "applied 0001_create_jobs.sql" in first.stderr
    assert applied_names(empty_dsn) == [m.name for m in migrations()]

    with psycopg.connect(empty_dsn) as c:
        id_type = c.execute(
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_name = 'jobs' AND column_name = 'id'"
        ).fetchone()
    assert id_type == ("bigint",)

    again = run_cli("migrate", "--dsn", empty_dsn)
    assert again.exit_code == 0
    assert "nothing to do" in again.stderr
    assert again.stdout == ""


def test_check_exits_3_while_pending_and_0_after(empty_dsn: str) -> None:
    pending = run_cli("migrate", "--check", "--dsn", empty_dsn)
    assert pending.exit_code == 3
    assert "run `pgqctl migrate`" in pending.stderr
    assert run_cli("migrate", "--dsn", empty_dsn).exit_code == 0
    assert run_cli("migrate", "--check", "--dsn", empty_dsn).exit_code == 0


def test_dry_run_lists_and_changes_nothing(empty_dsn: str) -> None:
    import json

    result = run_cli("migrate", "--dry-run", "--json", "--dsn", empty_dsn)
    assert result.exit_code == 0
    assert [r["name"] for r in json.loads(result.stdout)] == [m.name for m in migrations()]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('jobs')").fetchone() == (None,)


def test_status_lists_pending_then_applied(empty_dsn: str) -> None:
    import json

    before = json.loads(run_cli("migrate", "--status", "--json", "--dsn", empty_dsn).stdout)
    assert {r["status"] for r in before} == {"pending"}
    run_cli("migrate", "--dsn", empty_dsn)
    after = json.loads(run_cli("migrate", "--status", "--json", "--dsn", empty_dsn).stdout)
    assert [r["status"] for r in after] == ["applied"] * len(migrations())
    assert all(r["applied_at"] for r in after)


def test_four_concurrent_migrates_all_succeed_and_apply_once(empty_dsn: str) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgqctl", "migrate", "--dsn", empty_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    assert sum("applied 0001" in err for _, err in results) == 1
    assert applied_names(empty_dsn) == [m.name for m in migrations()]


def test_a_changed_migration_file_is_refused_by_name(empty_dsn: str) -> None:
    run_cli("migrate", "--dsn", empty_dsn)
    # What a changed file looks like from the database: another checksum.
    with psycopg.connect(empty_dsn) as c:
        c.execute("UPDATE pgqctl_migration_log SET checksum = 'edited' WHERE name LIKE '0001%'")
    result = run_cli("migrate", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "0001_create_jobs.sql" in result.stderr
    assert "changed" in result.stderr
    assert "Traceback" not in result.stderr
    status = run_cli("migrate", "--status", "--format", "csv", "--dsn", empty_dsn)
    assert "0001_create_jobs.sql,changed" in status.stdout


def test_a_foreign_jobs_table_is_left_untouched(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as c:
        c.execute("CREATE TABLE jobs (id int, note text)")
        c.execute("INSERT INTO jobs VALUES (1, 'mine')")
    result = run_cli("migrate", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "did not create" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT * FROM jobs").fetchall() == [(1, "mine")]
        assert c.execute("SELECT to_regclass('pgqctl_migrations')").fetchone() == (None,)


@pytest.mark.parametrize(
    "create, what",
    [
        ("CREATE VIEW jobs AS SELECT 1 AS id", "a view named jobs"),
        ("CREATE SEQUENCE jobs", "a sequence named jobs"),
        ("CREATE TABLE pgqctl_migrations (x int)", "a pgqctl_migrations table"),
    ],
)
def test_whatever_else_holds_the_names_is_left_untouched_in_every_mode(
    empty_dsn: str, create: str, what: str
) -> None:
    with psycopg.connect(empty_dsn) as c:
        c.execute(create)
    for mode in ((), ("--dry-run",), ("--check",), ("--status",)):
        result = run_cli("migrate", *mode, "--dsn", empty_dsn)
        assert result.exit_code == 1, (mode, result.stderr)
        assert what in result.stderr and "did not create" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    with psycopg.connect(empty_dsn) as c:
        # Nothing created: only the table the test made, if it made one.
        assert c.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('jobs', 'pgqctl_migrations')"
        ).fetchone() == (1 if "TABLE" in create else 0,)


def test_a_schema_migrated_by_a_newer_pgqctl_fails_the_check(empty_dsn: str) -> None:
    assert run_cli("migrate", "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn) as c:
        c.execute(
            "INSERT INTO pgqctl_migration_log (name, checksum, serves_from) "
            "VALUES ('9999_later.sql', 'x', '9999_later.sql')"
        )
    check = run_cli("migrate", "--check", "--dsn", empty_dsn)
    assert check.exit_code == 1
    assert "newer pgqctl (9999_later.sql applied" in check.stderr
    status = run_cli("migrate", "--status", "--format", "csv", "--dsn", empty_dsn)
    assert status.exit_code == 0
    assert status.stdout.splitlines()[-1].startswith("9999_later.sql,unknown,")
    assert run_cli("migrate", "--dsn", empty_dsn).exit_code == 1


def test_schema_option_puts_the_queue_in_its_own_schema(empty_dsn: str) -> None:
    result = run_cli("migrate", "--schema", "Queue Schema", "--dsn", empty_dsn)
    assert result.exit_code == 0, result.stderr
    assert applied_names(empty_dsn, "Queue Schema") == [m.name for m in migrations()]
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)
        assert c.execute("""SELECT to_regclass('"Queue Schema".jobs')""").fetchone() != (None,)
    # A second schema in the same database is independent of the first.
    assert run_cli("migrate", "--schema", "other", "--dsn", empty_dsn).exit_code == 0
    assert (
        run_cli("migrate", "--check", "--schema", "Queue Schema", "--dsn", empty_dsn).exit_code == 0
    )


def test_the_seeds_inserts_run_verbatim(dsn: str) -> None:
    # Plus the design's "one event, many consumers" INSERT.
    seed = (
        SEED_ROWS
        + """
    INSERT INTO jobs (kind, payload)
    SELECT kind, '{"order_id": 4}'
    FROM unnest(ARRAY['send_receipt', 'create_invoice', 'sync_crm']) AS kind;
    """
    )
    with psycopg.connect(dsn) as c:
        c.execute(seed)
        rows = c.execute(
            "SELECT id, kind, status, attempts, max_attempts, queue, priority FROM jobs ORDER BY id"
        ).fetchall()
    assert [r[:4] for r in rows[:5]] == [
        (1, "send_receipt", "pending", 0),
        (2, "send_receipt", "pending", 0),
        (3, "create_invoice", "pending", 0),
        (4, "send_receipt", "running", 1),
        (5, "sync_crm", "running", 3),
    ]
    assert len(rows) == 8
    assert {(r[4], r[5], r[6]) for r in rows} == {(3, "default", 0)}


def test_plain_sql_marking_done_sets_finished_at(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("""INSERT INTO jobs (kind, payload) VALUES ('k', '{}')""")
        c.execute("UPDATE jobs SET status = 'done' WHERE id = 1")
        (finished,) = c.execute("SELECT finished_at FROM jobs WHERE id = 1").fetchone() or (None,)
        assert finished is not None
        c.execute("UPDATE jobs SET status = 'pending' WHERE id = 1")
        assert c.execute("SELECT finished_at FROM jobs WHERE id = 1").fetchone() == (None,)


@pytest.mark.parametrize("password", ["s3cret-pw"])
def test_unreachable_database_is_one_line_without_password(password: str) -> None:
    dsn = f"postgresql://alice:{password}@127.0.0.1:1/queue?connect_timeout=2"
    result = run_cli("migrate", "--dsn", dsn)
    assert result.exit_code == 1
    assert password not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "alice@127.0.0.1:1/queue" in lines[0]
    assert "Traceback" not in result.stderr

    # --debug before the command or after it.
    for args in (["--debug", "migrate", "--dsn", dsn], ["migrate", "--dsn", dsn, "--debug"]):
        debug = run_cli(*args)
        assert debug.exit_code == 1
        assert "Traceback" in debug.stderr
        assert password not in debug.stderr.split("Traceback")[0]


def test_invalid_dsn_is_bad_input_without_echoing_it() -> None:
    result = run_cli("migrate", "--dsn", "host=x password=hunter2 = =")
    assert result.exit_code == 2
    assert "hunter2" not in result.stderr
