"""sql/schema.sql is the readable current schema: every migration adds up to it."""

from __future__ import annotations

from typing import Any

import psycopg

from pgqctl.sql import sql_dir
from tests.conftest import run_cli

CATALOG_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default,
               is_identity, identity_generation
        FROM information_schema.columns
        WHERE table_schema = %(schema)s AND table_name NOT LIKE 'pgqctl_migration%%'
        ORDER BY table_name, ordinal_position
    """,
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = %(schema)s AND c.conrelid::regclass::text NOT LIKE '%%pgqctl_migration%%'
        ORDER BY 2, 1
    """,
    "indexes": """
        SELECT indexname, replace(indexdef, %(schema)s || '.', '')
        FROM pg_indexes
        WHERE schemaname = %(schema)s AND tablename NOT LIKE 'pgqctl_migration%%'
        ORDER BY indexname
    """,
    "triggers": """
        SELECT t.tgname, replace(pg_get_triggerdef(t.oid), %(schema)s || '.', '')
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
        ORDER BY t.tgname
    """,
    "functions": """
        SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
               p.prosrc, p.prosecdef,
               -- A pinned search_path names the schema: compared without it.
               replace(array_to_string(p.proconfig, ','), %(schema)s, '<schema>')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s
        ORDER BY p.proname
    """,
    # Storage parameters: the autovacuum settings of jobs (0007).
    "reloptions": """
        SELECT c.relname, c.reloptions FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.reloptions IS NOT NULL
        ORDER BY c.relname
    """,
    "views": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = %(schema)s
        ORDER BY viewname
    """,
}


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    found = {}
    for name, query in CATALOG_QUERIES.items():
        rows = conn.execute(query, {"schema": schema}).fetchall()
        found[name] = [tuple(str(v).replace(f"{schema}.", "") for v in r) for r in rows]
    return found


def test_migrations_and_schema_sql_give_the_same_catalog(empty_dsn: str) -> None:
    assert run_cli("migrate", "--schema", "migrated", "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA from_file")
        conn.execute("SET search_path = from_file")
        conn.execute((sql_dir() / "schema.sql").read_text().encode())
        migrated = catalog(conn, "migrated")
        from_file = catalog(conn, "from_file")
    assert migrated["columns"], "the migrated schema has no tables"
    for part in CATALOG_QUERIES:
        assert from_file[part] == migrated[part], part


def test_the_table_takes_exactly_the_statuses_the_code_knows(dsn: str) -> None:
    """pgqctl/jobs.py's list is the one the `--status` choices, stats, purge
    and docs/table.md read: the table must take exactly those values."""
    from pgqctl.jobs import STATUS_NAMES

    with psycopg.connect(dsn, autocommit=True) as conn:
        taken = []
        for status in ("pending", "running", "done", "failed", "cancelled", "unknown"):
            try:
                with conn.transaction(force_rollback=True):
                    conn.execute(
                        "INSERT INTO jobs (kind, payload, status) VALUES ('k', '{}', %s)",
                        (status,),
                    )
                taken.append(status)
            except psycopg.errors.CheckViolation:
                pass
    assert sorted(taken) == sorted(STATUS_NAMES)
