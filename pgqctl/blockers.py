"""How long a statement may wait, and who kept it waiting when it gave up.

Every command and the worker set a lock timeout and a statement timeout in
each transaction (transaction-local, as every setting of pgqctl's), so that
a table locked by another session ends a command in one line instead of a
silent wait. When the server ends a statement at one of them, the session
that held it up is looked for on a fresh connection: the wait is over by
then, so pg_blocking_pids() of our own session no longer names it; the
other session still holding a lock on the queue's tables since before our
wait began does (see `lock_holder` in sql/queries/blockers.sql).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from pgqctl import db
from pgqctl.errors import PgqctlError, TimedOut
from pgqctl.sql import query
from pgqctl.text import format_seconds

LOCK_TIMEOUT_SQLSTATE = "55P03"  # lock_not_available
CANCELED_SQLSTATE = "57014"  # query_canceled: a statement timeout, or a cancel request
# Looking for the holder must not wait behind it in turn.
LOOKUP_SETTINGS = {"lock_timeout": "1s", "statement_timeout": "5s"}


@dataclass(frozen=True)
class Timeouts:
    """Seconds a statement may wait for a lock, and run in all; 0: no limit."""

    lock: float
    statement: float

    def limit(self, kind: str) -> float:
        """The timeout of `kind` ('lock' or 'statement', as `timeout_kind` says)."""
        return self.lock if kind == "lock" else self.statement

    def settings(self) -> dict[str, str]:
        """As transaction-local settings (whole milliseconds, as the server takes them)."""
        return {
            "lock_timeout": _milliseconds(self.lock),
            "statement_timeout": _milliseconds(self.statement),
        }


def _milliseconds(seconds: float) -> str:
    # A positive timeout under 1 ms would read as 0, which means none.
    return str(max(round(seconds * 1000), 1) if seconds > 0 else 0)


def timeout_kind(exc: BaseException) -> str | None:
    """'lock' or 'statement' when the server ended the statement at that
    timeout; None for any other error (a cancel asked for by a person too)."""
    state = getattr(exc, "sqlstate", None)
    if state == LOCK_TIMEOUT_SQLSTATE:
        return "lock"
    if state == CANCELED_SQLSTATE and "statement timeout" in str(exc):
        return "statement"
    return None


@dataclass(frozen=True)
class Blocker:
    """A session holding a lock on one of the queue's tables."""

    pid: int
    application: str
    state: str
    age: float | None  # seconds its transaction has been open; None: not ours to see
    relation: str
    mode: str

    def describe(self) -> str:
        """pid 4242 (psql, idle in transaction, transaction open 3m12s)."""
        parts = [self.application or "no application name", self.state or "state hidden"]
        if self.age is not None:
            parts.append(f"transaction open {format_seconds(self.age)}")
        return f"pid {self.pid} ({', '.join(parts)})"

    def ending(self) -> str:
        return f"SELECT pg_terminate_backend({self.pid});"


def waited(kind: str, limit: float) -> float:
    """How long a statement ended at a `kind` timeout of `limit` surely
    waited for its lock: a statement timeout may have run half its time
    before it had to wait."""
    return limit if kind == "lock" else limit / 2


def find_blocker(
    dsn: str, *, schema: str, waited: float, ours: Iterable[int] = ()
) -> Blocker | None:
    """The session most likely to have kept a statement of ours waiting
    `waited` seconds for a lock on the queue's tables, or None when none
    holds one now (or the server cannot be asked)."""
    try:
        with db.connect(dsn, schema=schema, settings=LOOKUP_SETTINGS) as conn, conn.transaction():
            row = conn.execute(
                query("lock_holder"),
                {"schema": schema, "waited": waited, "ours": list(ours)},
            ).fetchone()
    except (psycopg.Error, PgqctlError):
        return None
    return None if row is None else Blocker(*row)


def timed_out(
    exc: BaseException,
    *,
    what: str,
    timeouts: Timeouts,
    dsn: str,
    schema: str,
    ours: Iterable[int] = (),
) -> TimedOut | None:
    """The error to report for a statement of `what` (a command) that the
    server ended at a timeout, naming the session that held it up; None
    when `exc` is no timeout."""
    kind = timeout_kind(exc)
    if kind is None:
        return None
    limit = timeouts.limit(kind)
    option = f"--{kind}-timeout"
    blocker = find_blocker(dsn, schema=schema, waited=waited(kind, limit), ours=ours)
    spent = (
        f"waited {spelled(limit)}"
        if kind == "lock"
        else f"ran {spelled(limit)} (its statement timeout)"
    )
    if blocker is not None:
        waiting = "" if kind == "lock" else " waiting"
        return TimedOut(
            f"{what} {spent}{waiting} for a lock on {blocker.relation} "
            f"held by {blocker.describe()}: end it with {blocker.ending()} or raise {option}"
        )
    if kind == "lock":
        return TimedOut(
            f"{what} {spent} for a lock, and no session holds one on the queue's tables "
            f"now: run it again, or raise {option}"
        )
    return TimedOut(
        f"{what} {spent}, and no session held it up: raise {option} "
        f"(e.g. {option} 5m), or see what loads the server"
    )


def spelled(seconds: float) -> str:
    """A timeout as the options take it: 250ms, 5s, 1m30s, 10m."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{rest}s"
    return f"{minutes}m{rest}s" if rest else f"{minutes}m"
