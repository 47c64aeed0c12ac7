"""Jobs whose work is one SQL statement: the statement and the job's "done" commit together.

`pgqctl worker --sql 'create_invoice=CALL create_invoice($1)'`: the worker's
operator fixes the statement per kind (producers never send SQL); the job's
payload is its one parameter, `$1`, as JSON. Each job runs on a connection
of its own, in one transaction: the statement, then the job marked done,
fenced by its attempt. An error rolls both back and the job is retried with
backoff like any failure; a crash of the worker rolls both back with the
connection. So the work happens once however often the job is delivered:
the seed's "exactly-once processing" without a program of its own.

No child process: threads that each run one job at a time (started as
jobs need them, at most one per slot, then kept), and a connection per
running job, kept for the next one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pgqctl.errors import BadInput, PgqctlError
from pgqctl.runner import Outcome, Stop
from pgqctl.sql import query
from pgqctl.threads import KeptThreads

if TYPE_CHECKING:
    from pgqctl.db import QueueConnection

# What $1 may be: the payload goes as JSON text of no declared type, and
# the server reads it as the type the statement gives $1.
PAYLOAD_TYPES = frozenset({"json", "jsonb", "text", "character varying"})


@dataclass(frozen=True)
class SqlResult:
    """How a SQL job ended: `committed` (the job is done, with the
    statement's writes), `fenced_out` (the attempt no longer ran: nothing
    was committed), or neither (`outcome` says why it failed or stopped)."""

    outcome: Outcome
    committed: bool = False
    fenced_out: bool = False


class _FencedOut(Exception):
    pass


class SqlJobs:
    """Runs the jobs of the kinds that have a statement, each on a thread
    of its own; `on_started(key, backend_pid)` and `on_done(key, result)`
    are called on that thread."""

    def __init__(
        self,
        statements: Mapping[str, str],
        connect: Callable[[], QueueConnection],
        *,
        on_started: Callable[[object, int], None],
        on_done: Callable[[object, SqlResult], None],
        keep: int,
    ) -> None:
        self.statements = dict(statements)
        self._connect = connect
        self._on_started = on_started
        self._on_done = on_done
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[QueueConnection] = []
        self._threads = KeptThreads("pgqctl-sql")
        # Whether each kind's statement takes the payload ($1), from `check`.
        self._takes_payload: dict[str, bool] = {}

    def check(self, conn: QueueConnection) -> None:
        """Refuse, before any job runs, a statement the server cannot prepare
        or whose parameters are other than one $1 of a type JSON text can
        be. Nothing runs: each statement is only prepared and described."""
        from psycopg import pq

        for kind, text in self.statements.items():
            flag = f"--sql {kind}=..."
            with conn.transaction(force_rollback=True, settings=False):
                prepared = conn.pgconn.prepare(b"", text.encode())
                if prepared.status != pq.ExecStatus.COMMAND_OK:
                    error = prepared.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
                    raise BadInput(
                        f"{flag}: the statement does not prepare: "
                        f"{(error or b'').decode(errors='replace')}"
                    )
                described = conn.pgconn.describe_prepared(b"")
                count = described.nparams
                oid = described.param_type(0) if count else 0
                row = conn.execute(query("type_name"), {"oid": oid}).fetchone()
            if count > 1:
                raise BadInput(
                    f"{flag}: the statement takes {count} parameters; it gets one, $1, the "
                    "job's payload: take what you need from it, e.g. ($1::jsonb ->> 'order_id')"
                )
            name = row[0] if row else str(oid)
            if count == 1 and name not in PAYLOAD_TYPES:
                raise BadInput(
                    f"{flag}: $1 is {name}, but it is the job's payload, a JSON object: write "
                    f"$1::jsonb and take what you need, e.g. (($1::jsonb ->> 'id')::{name})"
                )
            self._takes_payload[kind] = count == 1

    def __contains__(self, kind: object) -> bool:
        return kind in self.statements

    def submit(
        self,
        key: object,
        *,
        job_id: int,
        attempt: int,
        kind: str,
        payload: str,
        timeout: float | None,
        stop: Stop,
    ) -> None:
        job = _Job(
            key,
            job_id,
            attempt,
            self.statements[kind],
            self._takes_payload.get(kind, True),
            payload,
            timeout,
            stop,
        )
        self._threads.run(lambda: self._run(job), lambda result: self._on_done(key, result))

    def close(self) -> None:
        """Let the threads end (after the jobs they run) and close the kept connections."""
        self._threads.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _run(self, job: _Job) -> SqlResult:
        try:
            return self._attempt(job, time.monotonic())
        except Exception as exc:  # never lose the job's report
            return SqlResult(Outcome(error=f"worker error: {exc}"))

    def _attempt(self, job: _Job, started: float) -> SqlResult:
        import psycopg

        if job.stop.requested:
            return SqlResult(Outcome(stopped=True, stop_reason=job.stop.reason))
        try:
            conn = self._take()
        except (psycopg.Error, PgqctlError) as exc:
            return SqlResult(_failed(f"cannot connect to run the job's SQL: {exc}", started))
        self._on_started(job.key, conn.info.backend_pid)
        running = _OnConnection(conn)
        job.stop.when_requested(running.cancel)
        timeout_ms = 0 if job.timeout is None else max(1, round(job.timeout * 1000))
        try:
            # Pipelined: BEGIN through the completion in one round trip, the
            # COMMIT in a second.
            with conn.pipeline(), conn.transaction(settings=False):
                conn.execute(query("sql_job_limits"), {"timeout_ms": str(timeout_ms)})
                with psycopg.RawCursor(conn) as cur:
                    params = [job.payload] if job.takes_payload else None
                    cur.execute(job.statement, params, prepare=False)
                # Back to the queue's schema and the worker's timeouts.
                conn.execute(query("settings_set_local"), conn.settings_params())
                row = conn.execute(
                    query("sql_job_complete"), {"id": job.job_id, "attempt": job.attempt}
                ).fetchone()
                if row is None:
                    raise _FencedOut
        except _FencedOut:
            result = SqlResult(Outcome(exit_code=0, duration=_since(started)), fenced_out=True)
        except psycopg.errors.QueryCanceled as exc:
            if job.stop.requested:
                outcome = Outcome(stopped=True, stop_reason=job.stop.reason)
            elif job.timeout is not None and "statement timeout" in str(exc):
                outcome = Outcome(timed_out=True, timeout=job.timeout)
            else:
                outcome = Outcome(error=_error(exc))
            result = SqlResult(_timed(outcome, started))
        except psycopg.Error as exc:
            result = SqlResult(_failed(_error(exc), started))
        else:
            result = SqlResult(Outcome(exit_code=0, duration=_since(started)), committed=True)
        running.end()  # a stop requested from now on cancels nothing
        self._give_back(conn)
        return result

    def _take(self) -> QueueConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _give_back(self, conn: QueueConnection) -> None:
        if not conn.broken:
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(conn)
                    return
        conn.close()


@dataclass(frozen=True)
class _Job:
    key: object
    job_id: int
    attempt: int
    statement: str
    takes_payload: bool
    payload: str
    timeout: float | None
    stop: Stop


class _OnConnection:
    """A job's statement on its connection, until `end`: what a stop cancels.

    The connection serves the next job once this one ends, and a cancel
    request cancels whatever its backend runs when the request arrives: so a
    cancel is sent only while the job has not ended, and the job does not
    end (nor its connection go back to the pool) while a cancel is on its way.
    """

    def __init__(self, conn: QueueConnection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._ended = False

    def cancel(self) -> None:
        """Cancel the statement, without waiting here for the round trip to
        the server (the caller may be the worker's loop)."""
        threading.Thread(target=self._send_cancel, name="pgqctl-sql-cancel", daemon=True).start()

    def _send_cancel(self) -> None:
        import psycopg

        with self._lock:
            if not self._ended:
                # A cancel that cannot be sent leaves the statement to its
                # timeout, or to the connection's end with the worker.
                with contextlib.suppress(psycopg.Error, OSError):
                    self._conn.cancel_safe()

    def end(self) -> None:
        with self._lock:
            self._ended = True


def _error(exc: Any) -> str:
    """`SQL error 23505: duplicate key value ...`: the SQLSTATE and the server's words."""
    diag = exc.diag
    message = diag.message_primary or str(exc).strip()
    detail = f" ({diag.message_detail})" if diag.message_detail else ""
    code = f" {exc.sqlstate}" if exc.sqlstate else ""
    return f"SQL error{code}: {message}{detail}"


def _since(started: float) -> float:
    return time.monotonic() - started


def _failed(error: str, started: float) -> Outcome:
    return Outcome(error=error, duration=_since(started))


def _timed(outcome: Outcome, started: float) -> Outcome:
    return replace(outcome, duration=_since(started))
