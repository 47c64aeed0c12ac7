"""Where pgqctl connects, and how to name that place without its password.

Order, first that is set wins: `--dsn`, PGQCTL_DSN, DATABASE_URL, libpq's
own PG* variables (and the service file PGSERVICE names), and only when none
of them is set, the embedded PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import psycopg
from psycopg import conninfo

from pgqctl.errors import BadInput

# libpq variables that choose a server, a database or a login. Any one of
# them means the user configured a database through libpq itself.
LIBPQ_SELECTORS = (
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGSERVICE",
)


@dataclass(frozen=True)
class Target:
    """A database to connect to. `dsn` is None for the embedded server."""

    dsn: str | None
    source: str

    @property
    def embedded(self) -> bool:
        return self.dsn is None


def resolve_target(dsn_option: str | None, environ: Mapping[str, str]) -> Target:
    """Pick the database by the documented order."""
    if dsn_option:
        return Target(_checked(dsn_option, "--dsn", environ), "--dsn")
    for name in ("PGQCTL_DSN", "DATABASE_URL"):
        if environ.get(name):
            return Target(_checked(environ[name], name, environ), name)
    if any(environ.get(name) for name in LIBPQ_SELECTORS):
        # An empty conninfo lets libpq read its own variables and service file.
        return Target(_checked("", "the PG* variables", environ), "libpq environment")
    return Target(None, "embedded")


def dsn_source(dsn: str, environ: Mapping[str, str]) -> str:
    """Where a DSN most likely came from, when the caller did not say (a
    `Target.source`); "--dsn / PGQCTL_DSN" when it cannot be told."""
    if not dsn:
        return "libpq environment"
    if dsn == environ.get("DATABASE_URL") and dsn != environ.get("PGQCTL_DSN"):
        return "DATABASE_URL"
    return "--dsn / PGQCTL_DSN"


def source_text(source: str) -> str:
    """A `Target.source` as a message names it."""
    if source == "libpq environment":
        # An empty DSN: libpq chose the server from PGHOST, PGPORT and the like.
        return "PGHOST, PGPORT and the other PG* variables"
    if source == "embedded":
        return "the embedded server (`pgqctl embedded status`)"
    if source in ("--dsn", "PGQCTL_DSN"):
        return "--dsn / PGQCTL_DSN"
    return source


def _checked(dsn: str, source: str, environ: Mapping[str, str]) -> str:
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # libpq's message may quote the string, password included: not shown.
        raise BadInput(
            f"{source} is not a valid connection string: "
            "use postgresql://user@host:5432/dbname or 'host=... dbname=...'"
        ) from None
    # A port that is not a number would otherwise read as a failure to find
    # the host ("Servname not supported"), or to reach the server.
    port, where = str(params.get("port") or ""), source
    if not port and environ.get("PGPORT"):
        port, where = environ["PGPORT"], "PGPORT"
    for part in port.split(","):
        if part and not (part.isdigit() and 0 < int(part) < 65536):
            raise BadInput(f"port {part!r} in {where} is not a port number (1 to 65535)")
    return dsn


def describe(dsn: str) -> str:
    """user@host:port/dbname for messages: never the password."""
    params = _effective_params(dsn)
    host = params.get("host") or params.get("hostaddr") or "localhost"
    if host.startswith("/"):
        host = f"socket {host}"
    port = params.get("port") or "5432"
    user = params.get("user") or ""
    dbname = params.get("dbname") or user
    who = f"{user}@" if user else ""
    return f"{who}{host}:{port}/{dbname}"


def _effective_params(dsn: str) -> dict[str, str]:
    """The connection parameters libpq would use, env defaults included."""
    try:
        given = {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items()}
    except psycopg.ProgrammingError:
        given = {}
    defaults: dict[str, str] = {}
    for option in psycopg.pq.Conninfo.get_defaults():
        if option.val is not None:
            defaults[option.keyword.decode()] = option.val.decode(errors="replace")
    defaults.update(given)
    defaults.pop("password", None)
    return defaults
