"""Connections with safe defaults, and the check that the schema is there.

Every connection names pgqctl in `application_name` (visible in
pg_stat_activity) and points its search_path at the queue's schema, so all
SQL stays unqualified.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

from pgqctl import config
from pgqctl.errors import BadInput, DatabaseUnavailable, NotMigrated
from pgqctl.sql import migrations

APPLICATION_NAME = "pgqctl"
CONNECT_TIMEOUT_SECONDS = 10
# How libpq words a setting it refuses to use, e.g. 'invalid integer value
# "abc" for connection option "port"', 'invalid sslmode value: "x"',
# 'invalid "ssl_min_protocol_version" value', 'could not match 3 port
# numbers to 2 hosts'; the server, 'invalid value for parameter "TimeZone"'.
_BAD_SETTING = re.compile(
    r'invalid (\w+ |"\w+" )?(value|port number)|could not match \d+ port numbers'
)


def connect(
    dsn: str,
    *,
    schema: str,
    application_name: str = APPLICATION_NAME,
    autocommit: bool = True,
    **params: Any,
) -> psycopg.Connection[Any]:
    """Open a connection or raise DatabaseUnavailable naming the target.

    `params` are more libpq connection parameters (keepalives, ...).
    """
    try:
        conn = psycopg.connect(
            dsn,
            autocommit=autocommit,
            application_name=application_name,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            **params,
        )
    except psycopg.OperationalError as exc:
        # An empty DSN: libpq chose the server from PGHOST, PGPORT and the like.
        source = "--dsn / PGQCTL_DSN" if dsn else "PGHOST, PGPORT and the other PG* variables"
        why = reason(exc)
        if _BAD_SETTING.search(why):
            # A setting libpq (or the server) refuses: no use retrying as is.
            raise BadInput(f"bad connection setting: {why}; fix it in {source}") from exc
        raise DatabaseUnavailable(
            f"cannot connect to {config.describe(dsn)}: {why}; "
            f"check {source} and that the server is running"
        ) from exc
    use_schema(conn, schema)
    return conn


def open_queue(
    dsn: str, *, schema: str, migrated: bool = True, **params: Any
) -> psycopg.Connection[Any]:
    """A connection to the queue in `schema`, checked to be migrated unless
    `migrated` is False (for `migrate` itself). `params` as for `connect`."""
    conn = connect(dsn, schema=schema, **params)
    if migrated:
        try:
            require_migrated(conn, schema)
        except BaseException:
            conn.close()
            raise
    return conn


def use_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Point search_path at the queue's schema, quoted as an identifier."""
    path = sql.Identifier(schema).as_string(conn)
    conn.execute("SELECT set_config('search_path', %s, false)", (path,))
    if not conn.autocommit:
        conn.commit()


def reason(exc: BaseException) -> str:
    """The useful line of a libpq error, without its boilerplate."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    for prefix in ("connection failed: ", "connection is bad: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def require_migrated(conn: psycopg.Connection[Any], schema: str) -> None:
    """Raise NotMigrated unless every migration this pgqctl knows is applied."""
    row = conn.execute(
        "SELECT to_regclass('pgqctl_migrations') IS NOT NULL, to_regclass('jobs') IS NOT NULL"
    ).fetchone()
    recorded, jobs = row or (False, False)
    if jobs and not recorded:
        # `migrate` would refuse to touch it: saying "run migrate" would not help.
        raise NotMigrated(
            f"schema {schema} has a jobs relation that pgqctl did not create: "
            "use --schema to name the queue's schema (`pgqctl migrate --schema NAME` makes one)"
        )
    if recorded and not jobs:
        # `migrate` would find every migration applied and do nothing.
        raise NotMigrated(
            f"schema {schema} records pgqctl migrations but has no jobs table (dropped?): "
            "drop its pgqctl_migrations table too, then run `pgqctl migrate`"
        )
    if not recorded:
        raise NotMigrated(f"no pgqctl queue in schema {schema}: run `pgqctl migrate`")
    count_row = conn.execute("SELECT count(*) FROM pgqctl_migrations").fetchone()
    applied = count_row[0] if count_row else 0
    known = len(migrations())
    if applied < known:
        raise NotMigrated(
            f"schema {schema} is {known - applied} migration(s) behind: run `pgqctl migrate`"
        )
    if applied > known:
        raise NotMigrated(
            f"schema {schema} was migrated by a newer pgqctl: upgrade pgqctl to use it"
        )
