"""Connections: application_name, search_path, and the not-migrated check."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from pgqctl import db
from pgqctl.errors import DatabaseUnavailable, NotMigrated
from tests.conftest import run_cli


def test_connections_name_pgqctl_and_use_the_queue_schema(dsn: str) -> None:
    with db.connect(dsn, schema="public") as conn, conn.transaction():
        name, path = conn.execute(
            "SELECT current_setting('application_name'), current_setting('search_path')"
        ).fetchone() or ("", "")
    assert name == "pgqctl"
    assert path == '"public"'


def test_the_schema_is_named_in_each_transaction_never_for_the_session(dsn: str) -> None:
    # A transaction pooler hands the server connection to another client
    # after each transaction: a session setting would follow it there.
    with db.connect(dsn, schema="other") as conn:
        with conn.transaction():
            (inside,) = conn.execute("SELECT current_setting('search_path')").fetchone() or ("",)
        (after,) = conn.execute("SELECT current_setting('search_path')").fetchone() or ("",)
    assert inside == '"other"'
    assert after == '"$user", public'


def test_no_statement_is_jit_compiled_however_large_its_estimate(dsn: str) -> None:
    # The server compiles a plan whose estimate passes jit_above_cost: with
    # a long history, a bounded read of a few pages would spend 100 ms on it.
    with db.connect(dsn, schema="public") as conn, conn.transaction():
        conn.execute("SELECT set_config('jit_above_cost', '0', true)")
        (jit,) = conn.execute("SELECT current_setting('jit')").fetchone() or ("",)
        ((plan,),) = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM jobs"
        ).fetchall()
        (available,) = conn.execute("SELECT pg_jit_available()").fetchone() or (False,)
    assert jit == "off"
    assert "JIT" not in plan[0]
    with psycopg.connect(dsn) as plain:
        plain.execute("SET jit_above_cost = 0")
        ((plan,),) = plain.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM jobs"
        ).fetchall()
    # Where the server can compile, a plain connection's plan says it did:
    # the plan above would have said so too.
    if available:
        assert "JIT" in plan[0]


def test_a_quoted_schema_name_reaches_search_path_intact(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute('CREATE SCHEMA "Odd ""name"""')
    with db.connect(empty_dsn, schema='Odd "name"') as conn, conn.transaction():
        row = conn.execute("SELECT current_schema()").fetchone()
    assert row == ('Odd "name"',)


def test_an_unmigrated_database_says_to_run_migrate(empty_dsn: str) -> None:
    with db.connect(empty_dsn, schema="public") as conn, pytest.raises(NotMigrated) as err:
        db.require_migrated(conn)
    assert "run `pgqctl migrate`" in str(err.value)
    assert err.value.exit_code == 1


def test_a_migrated_database_passes_the_check(dsn: str) -> None:
    with db.connect(dsn, schema="public") as conn:
        db.require_migrated(conn)


def test_a_refused_connection_names_where_the_server_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")  # nothing listens there
    with pytest.raises(DatabaseUnavailable, match="check PGHOST, PGPORT and the other PG"):
        db.connect("", schema="public")
    with pytest.raises(DatabaseUnavailable, match="check --dsn / PGQCTL_DSN"):
        db.connect("postgresql://postgres@127.0.0.1:1/x", schema="public")


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("host=127.0.0.1 sslmode=sometimes", 'invalid sslmode value: "sometimes"'),
        ("host=127.0.0.1 ssl_min_protocol_version=x", 'invalid "ssl_min_protocol_version"'),
        ("host=127.0.0.1 keepalives=x", 'invalid integer value "x" for connection option'),
        ("host=a,b port=1,2,3", "could not match 3 port numbers to 2 hosts"),
    ],
)
def test_a_setting_libpq_refuses_is_bad_input_not_an_outage(setting: str, why: str) -> None:
    result = run_cli("stats", "--dsn", setting)
    assert result.exit_code == 2
    assert result.stderr.startswith("pgqctl: error: bad connection setting: ")
    assert why in result.stderr
    assert result.stderr.endswith("; fix it in --dsn / PGQCTL_DSN\n")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--dsn", "postgresql://u@localhost:abc/db"], {}, "port 'abc' in --dsn"),
        (["--dsn", "host=localhost port=5432,x"], {}, "port 'x' in --dsn"),
        ([], {"PGHOST": "localhost", "PGPORT": "99999"}, "port '99999' in PGPORT"),
    ],
)
def test_a_port_that_is_not_a_number_is_named_before_any_connection(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = run_cli("stats", *args, env=env)
    assert result.exit_code == 2
    assert result.stderr == f"pgqctl: error: {message} is not a port number (1 to 65535)\n"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            "DROP TABLE jobs, pgqctl_migrations, pgqctl_migration_log CASCADE;"
            " CREATE TABLE jobs (id int)",
            "has a jobs relation that pgqctl did not create: use --schema",
        ),
        (
            "DROP TABLE jobs CASCADE",
            "has no jobs table (dropped?): drop its pgqctl_migrations and "
            "pgqctl_migration_log tables too",
        ),
    ],
)
def test_a_schema_migrate_cannot_fix_is_not_answered_with_run_migrate(
    dsn: str, setup: str, message: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(setup)
    with db.connect(dsn, schema="public") as conn, pytest.raises(NotMigrated) as err:
        db.require_migrated(conn)
    assert message in str(err.value)


def test_a_database_that_shows_dates_its_own_way_is_read_and_worked_alike(dsn: str) -> None:
    # DateStyle and IntervalStyle are the database's to choose (ALTER
    # DATABASE ... SET); psycopg reads only the ISO style, which each of
    # pgqctl's transactions sets, even where a pipeline's rows are read
    # after its COMMIT gave the session its own style back (the worker's).
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = sql.Identifier(conn.info.dbname)
        for setting, value in (
            ("datestyle", "SQL, DMY"),
            ("intervalstyle", "sql_standard"),
            ("timezone", "Asia/Kolkata"),
        ):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    name, sql.Identifier(setting), sql.Literal(value)
                )
            )
    (job,) = json.loads(
        run_cli("enqueue", "--dsn", dsn, "--json", "echo", '{"argv": ["echo", "hi"]}').stdout
    )
    worked = run_cli("worker", "--dsn", dsn, "--burst")
    assert worked.exit_code == 0 and "error" not in worked.stderr, worked.stderr
    (shown,) = json.loads(run_cli("list", "--dsn", dsn, "--json").stdout)
    assert (shown["id"], shown["status"]) == (job["id"], "done")
    for command in (["stats"], ["show", str(job["id"])], ["logs", str(job["id"])], ["check"]):
        result = run_cli(*command, "--dsn", dsn)
        assert result.exit_code == 0, (command, result.stderr)
        assert "Traceback" not in result.stderr
