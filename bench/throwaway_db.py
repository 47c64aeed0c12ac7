"""Where a single-purpose bench runs: a server, then a database of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgqctl import db, embedded, migrate


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """An admin DSN: the one given, PGQCTL_TEST_DSN, or a throwaway embedded server."""
    dsn = dsn or os.environ.get("PGQCTL_TEST_DSN")
    if dsn:
        yield dsn
        return
    work = Path(tempfile.mkdtemp(prefix="pgqctl-bench-", dir="/tmp"))
    try:
        started = embedded.ensure_running(work / "data")
        print(f"# embedded PostgreSQL in {started.data_dir}", file=sys.stderr)
        try:
            yield started.dsn
        finally:
            started.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def database(admin_dsn: str, *, migrated: bool = True) -> Iterator[str]:
    """A database of the bench's own, migrated by pgqctl (unless not
    `migrated`: left empty for another release's migrate), dropped at the end."""
    name = f"pgqctl_bench_{os.getpid()}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(drop)
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        version = admin.execute("SHOW server_version").fetchone()
        print(f"# PostgreSQL {version[0] if version else '?'}", file=sys.stderr)
    dsn = conninfo.make_conninfo(admin_dsn, dbname=name)
    try:
        if migrated:
            with db.connect(dsn, schema="public") as conn:
                migrate.apply(conn, "public")
        yield dsn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(drop)
